"""Opening a LangGraph checkpoint database for `memorm import-langgraph`: checked, counted, read-only.

Not a command (no `register`).  `open_source(location)` takes what the user
typed, a langgraph-checkpoint-sqlite file (a path or a `sqlite:///` URL) or a
langgraph-checkpoint-postgres database (a `postgresql://` URL), and yields
LangGraph's own saver over it with what it holds:

```python
async with open_source("checkpoints.db") as (saver, counts):
    copied = await copy_checkpoints(saver, MemormSaver(db, agent=agent.id))
```

Before any saver is made, the location is checked: a missing file, a file
that is no SQLite database, or a database without LangGraph's checkpoint
tables each raise one `MemormError` naming it, and nothing is created or
written (a SQLite file is opened read-only).  The savers are LangGraph's
(`AsyncSqliteSaver`; `AsyncPostgresSaver`, whose package and `psycopg` the
user installs), so memorm reads their rows the way they wrote them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio.to_thread
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from memorm.errors import DatabaseError, MemormError, ValidationError

__all__ = ["SourceCounts", "open_source"]

# The tables (and the columns memorm relies on) each LangGraph saver creates.
_SQLITE_TABLES = {
    "checkpoints": {"thread_id", "checkpoint_ns", "checkpoint_id", "parent_checkpoint_id", "checkpoint"},
    "writes": {"thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx", "channel", "value"},
}
_POSTGRES_TABLES = {
    "checkpoints": {"thread_id", "checkpoint_ns", "checkpoint_id", "parent_checkpoint_id", "checkpoint"},
    "checkpoint_writes": {"thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx", "channel"},
    "checkpoint_blobs": {"thread_id", "checkpoint_ns", "channel", "version", "blob"},
}
SQLITE_PACKAGE = "pip install langgraph-checkpoint-sqlite"
POSTGRES_PACKAGES = 'pip install langgraph-checkpoint-postgres "psycopg[binary]"'


@dataclass(frozen=True)
class SourceCounts:
    """What a LangGraph checkpoint database holds: threads, checkpoints and pending writes."""

    threads: int
    checkpoints: int
    writes: int


def _is_postgres(location: str) -> bool:
    return location.split("://", 1)[0].split("+", 1)[0] in ("postgresql", "postgres")


def _sqlite_path(location: str) -> Path:
    if "://" not in location:
        return Path(location).expanduser().absolute()
    try:
        url = make_url(location)
    except ArgumentError as error:
        raise ValidationError(f"source: {location!r} is neither a file nor a database URL") from error
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        raise ValidationError(
            f"source: expected a langgraph-checkpoint-sqlite file or a postgresql:// URL, got {location!r}"
        )
    return Path(url.database).expanduser().absolute()


def _missing(columns: dict[str, set[str]], wanted: dict[str, set[str]]) -> list[str]:
    """The tables (or table.columns) of `wanted` that `columns` lacks."""
    missing = []
    for table, needed in wanted.items():
        if table not in columns:
            missing.append(table)
        else:
            missing += [f"{table}.{name}" for name in sorted(needed - columns[table])]
    return missing


def _not_langgraph(where: object, kind: str, missing: list[str]) -> ValidationError:
    return ValidationError(
        f"{where} is not a {kind} database: it has no {', '.join(missing)} "
        "(is it the file or database your LangGraph app's checkpointer writes?)"
    )


def _check_sqlite(path: Path) -> SourceCounts:
    """The counts of a langgraph-checkpoint-sqlite file, after checking it is one (read-only)."""
    if not path.is_file():
        raise DatabaseError(f"no LangGraph SQLite database at {path}: no such file")
    try:
        with sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True) as connection:
            columns: dict[str, set[str]] = {}
            for table in _SQLITE_TABLES:
                found = connection.execute("SELECT name FROM pragma_table_info(?)", (table,)).fetchall()
                if found:
                    columns[table] = {row[0] for row in found}
            missing = _missing(columns, _SQLITE_TABLES)
            if missing:
                raise _not_langgraph(path, "langgraph-checkpoint-sqlite", missing)
            threads, checkpoints = connection.execute(
                "SELECT count(DISTINCT thread_id), count(*) FROM checkpoints"
            ).fetchone()
            (writes,) = connection.execute("SELECT count(*) FROM writes").fetchone()
    except sqlite3.DatabaseError as error:  # "file is not a database" and the like
        raise DatabaseError(f"{path} cannot be read as a SQLite database: {error}") from error
    return SourceCounts(int(threads), int(checkpoints), int(writes))


async def _check_postgres(dsn: str, shown: str) -> SourceCounts:
    """The counts of a langgraph-checkpoint-postgres database, after checking it is one."""
    import asyncpg  # memorm's own Postgres driver: the check needs no psycopg

    from memorm.cli.reach import unreachable

    try:
        connection = await asyncpg.connect(dsn, timeout=10)
    except Exception as error:
        raise (unreachable(error, shown) or DatabaseError(f"cannot read {shown}: {error}")) from error
    try:
        rows = await connection.fetch(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = ANY (current_schemas(false)) AND table_name = ANY ($1::text[])",
            list(_POSTGRES_TABLES),
        )
        columns: dict[str, set[str]] = {}
        for row in rows:
            columns.setdefault(row["table_name"], set()).add(row["column_name"])
        missing = _missing(columns, _POSTGRES_TABLES)
        if missing:
            raise _not_langgraph(shown, "langgraph-checkpoint-postgres", missing)
        counts = await connection.fetchrow(
            "SELECT count(DISTINCT thread_id) AS threads, count(*) AS checkpoints FROM checkpoints"
        )
        writes = await connection.fetchval("SELECT count(*) FROM checkpoint_writes")
    except MemormError:
        raise
    except Exception as error:
        raise DatabaseError(f"cannot read {shown}: {error}") from error
    finally:
        await connection.close()
    return SourceCounts(int(counts["threads"]), int(counts["checkpoints"]), int(writes))


@asynccontextmanager
async def open_source(location: str) -> AsyncIterator[tuple[Any, SourceCounts]]:
    """LangGraph's saver over the checkpoint database at `location`, and what it holds.

    Args:
        location: a langgraph-checkpoint-sqlite file (a path, or a
            `sqlite:///` URL), or a langgraph-checkpoint-postgres database (a
            `postgresql://` URL; any `+driver` is dropped).

    Raises:
        DatabaseError: the file is missing or unreadable, or the server unreachable.
        ValidationError: the database holds no LangGraph checkpoint tables, or
            reading Postgres needs packages that are not installed.
    """
    if not isinstance(location, str) or not location:
        raise ValidationError("source: expected a file path or a database URL")
    if not _is_postgres(location):
        path = _sqlite_path(location)
        counts = await anyio.to_thread.run_sync(_check_sqlite, path)
        import aiosqlite

        try:
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
        except ImportError as error:  # pragma: no cover (installed with memorm's dev dependencies)
            raise ValidationError(
                f"reading a langgraph-checkpoint-sqlite file takes LangGraph's SQLite saver: {SQLITE_PACKAGE}"
            ) from error

        connection = await aiosqlite.connect(f"{path.as_uri()}?mode=ro", uri=True)
        try:
            yield AsyncSqliteSaver(connection), counts
        finally:
            await connection.close()
        return
    try:
        url = make_url(location).set(drivername="postgresql")
    except ArgumentError as error:
        raise ValidationError(f"source: {location!r} is not a database URL") from error
    dsn, shown = url.render_as_string(hide_password=False), url.render_as_string(hide_password=True)
    counts = await _check_postgres(dsn, shown)
    try:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    except ImportError as error:
        raise ValidationError(
            f"reading a langgraph-checkpoint-postgres database takes LangGraph's Postgres saver: "
            f"{POSTGRES_PACKAGES}"
        ) from error
    async with AsyncPostgresSaver.from_conn_string(dsn) as saver:  # pragma: no cover (not installed here)
        yield saver, counts
