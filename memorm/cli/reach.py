"""Opening the commands' database, with connection failures said in one line.

``memorm.cli.main`` prints any ``MemormError`` as one line; this module makes
sure a refused connection, an unknown host, a missing database or a bad
password arrive as one (``cannot reach the database at <url>: why``), the URL
shown without its password.
"""

from __future__ import annotations

import socket
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from sqlalchemy import exc as sa_exc

from memorm.db import Database
from memorm.errors import DatabaseError, MemormError
from memorm.translate import translate

__all__ = ["open_database", "unreachable"]

# SQLSTATE classes of a failed connection: 08 connection exception, 28 bad
# authorization, 3D no such database.
_CONNECT_CODES = ("08", "28", "3D")


def _why(error: BaseException) -> str:
    orig = getattr(error, "orig", None) or error
    text = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    return text


def unreachable(error: BaseException, where: str) -> MemormError | None:
    """A ``DatabaseError`` naming ``where`` if ``error`` means the connection failed, else None."""
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
    return DatabaseError(f"cannot reach the database at {where}: {_why(error)}")


def _missing_file(db: Database) -> bool:
    path = db.url.database
    return db.dialect == "sqlite" and bool(path) and path != ":memory:" and not Path(path or "").exists()


@asynccontextmanager
async def open_database(url: str | None, *, must_exist: bool = True) -> AsyncIterator[Database]:
    """A :class:`Database` on ``url`` (else ``MEMORM_DATABASE_URL``, else the default), disposed after.

    Errors inside the block leave as ``MemormError``: connection failures as
    "cannot reach the database at …", other driver errors as memorm translates
    them.  With ``must_exist``, a SQLite file that is not there is an error
    rather than silently created empty.
    """
    db = Database(url)
    where = db.url.render_as_string(hide_password=True)
    try:
        if must_exist and _missing_file(db):
            raise DatabaseError(f"cannot reach the database at {where}: no such file")
        try:
            yield db
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
