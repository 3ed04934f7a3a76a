"""Opening the commands' database: a missing SQLite file and a failed connection said in one line.

Every command opens its database with `open_database`, which decides
two things in one place:

* A SQLite file that is not there is an error naming its path, and is not
  created: SQLite would otherwise make an empty database of a mistyped path,
  and the command would go on to report a missing schema.  Only commands whose
  job is to make a database (`db upgrade`, `demo`, the destination of
  `copy` and `import`) pass `create=True`.
* A refused connection, an unknown host, a missing Postgres database or a bad
  password arrive as one `MemormError` (`cannot reach the database at
  <url>: why`), the URL shown without its password.  The connection is tried
  on entry, so with two databases open (`copy`) the message names the one
  that failed.
"""

from __future__ import annotations

import socket
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from sqlalchemy import exc as sa_exc

from memorm.config import sqlite_file
from memorm.db import Database
from memorm.errors import DatabaseError, MemormError
from memorm.translate import translate

__all__ = ["missing_sqlite_file", "open_database", "unreachable"]

# SQLSTATE classes of a failed connection: 08 connection exception, 28 bad
# authorization, 3D no such database.
_CONNECT_CODES = ("08", "28", "3D")


class _Unreachable(DatabaseError):
    """A connection failure already attributed to its database: an outer `open_database` leaves it be."""


def _why(error: BaseException) -> str:
    orig = getattr(error, "orig", None) or error
    text = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    return text


def unreachable(error: BaseException, where: str) -> MemormError | None:
    """A `DatabaseError` naming `where` if `error` means the connection failed, else None."""
    orig = error.orig if isinstance(error, sa_exc.DBAPIError) else error
    code = getattr(orig, "sqlstate", None) or getattr(getattr(orig, "__cause__", None), "sqlstate", None)
    failed = (
        isinstance(orig, (ConnectionError, TimeoutError, socket.gaierror))
        or type(orig) is OSError  # asyncpg's "no route to host" and the like
        or (isinstance(code, str) and code[:2] in _CONNECT_CODES)
        or (isinstance(orig, sqlite3.OperationalError) and "unable to open" in str(orig))
    )
    if not failed:
        return None
    return _Unreachable(f"cannot reach the database at {where}: {_why(error)}")


def missing_sqlite_file(db: Database) -> Path | None:
    """The absolute path of `db`'s SQLite file if it does not exist; None otherwise.

    None too for other engines, in-memory databases and `file:` URIs (which
    SQLite opens by its own rules, `mode=rw` included).
    """
    path = sqlite_file(db.url)
    return None if path is None or path.exists() else path


async def _connect(db: Database, where: str) -> None:
    """Open one connection now, so that a failure names this database."""
    try:
        async with db.engine.connect():
            pass
    except Exception as error:
        found = unreachable(error, where) or translate(error)
        if found is None or found is error:
            raise
        raise found from error


@asynccontextmanager
async def open_database(url: str | None, *, create: bool = False) -> AsyncIterator[Database]:
    """A [`Database`][memorm.db.Database] on `url`, disposed after.

    The URL is `url`, else `MEMORM_DATABASE_URL`, else the default.

    Args:
        url: the database's URL as the user gave it.
        create: the command makes the database, so a missing SQLite file is
            created, by the command's first statement (a command refused
            before it leaves no file); without it, a missing file raises
            `DatabaseError` naming the path, and nothing is created.

    Errors inside the block leave as `MemormError`: connection failures as
    "cannot reach the database at …", other driver errors as memorm translates
    them.
    """
    db = Database(url)
    where = db.url.render_as_string(hide_password=True)
    try:
        missing = missing_sqlite_file(db)
        if missing is not None and not create:
            raise DatabaseError(
                f"no SQLite database at {missing} (check the URL; `memorm db upgrade` creates one)"
            )
        if missing is None:  # a new SQLite file is made by the command's first write, not here
            await _connect(db, where)
        try:
            yield db
        except _Unreachable:
            raise
        except MemormError as error:
            cause = error.__cause__
            found = unreachable(cause, where) if cause is not None else None
            if found is None:
                raise
            raise found from cause
        except Exception as error:
            found = unreachable(error, where) or translate(error)
            if found is None or found is error:
                raise
            raise found from error
    finally:
        await db.dispose()
