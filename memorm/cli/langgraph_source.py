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
written (a SQLite file is opened read-only).  Then every stored value is
read without being built (`memorm.graph_values`): one naming a callable that
is neither a type LangGraph's graphs store nor one of `allowed_types`
raises `UnsafeValueError` naming its row, before anything is copied.  The
savers are LangGraph's (`AsyncSqliteSaver`; `AsyncPostgresSaver`, whose
package and `psycopg` the user installs), so memorm reads their rows the way
they wrote them, through memorm's `StrictSerializer`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio.to_thread
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from memorm import graph_values
from memorm.errors import DatabaseError, MemormError, UnsafeValueError, ValidationError
from memorm.graph_values import AllowedType, check_value

__all__ = ["SourceCounts", "open_source"]

# The serialized values LangGraph's savers keep: the columns naming a row, then the value's
# type and bytes.  (The Postgres saver keeps checkpoints as jsonb, which it reads as plain JSON.)
_SQLITE_VALUES = {
    "checkpoints": ("thread_id", "checkpoint_ns", "checkpoint_id", "type", "checkpoint"),
    "writes": ("thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx", "channel", "type", "value"),
}
_POSTGRES_VALUES = {
    "checkpoint_writes": (*_SQLITE_VALUES["writes"][:-1], "blob"),
    "checkpoint_blobs": ("thread_id", "checkpoint_ns", "channel", "version", "type", "blob"),
}
# The tables (and the columns memorm relies on) each LangGraph saver creates.
_SQLITE_TABLES = {
    "checkpoints": {"parent_checkpoint_id", *_SQLITE_VALUES["checkpoints"]},
    "writes": set(_SQLITE_VALUES["writes"]),
}
_POSTGRES_TABLES = {
    "checkpoints": {"thread_id", "checkpoint_ns", "checkpoint_id", "parent_checkpoint_id", "checkpoint"},
    **{table: set(columns) for table, columns in _POSTGRES_VALUES.items()},
}
Allowed = frozenset[tuple[str, str]]
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


def _check_value(where: object, table: str, columns: tuple[str, ...], row: Any, allowed: Allowed) -> None:
    """Refuse a source row whose value names a callable not allowed, naming the row."""
    *key, kind, value = tuple(row)
    try:
        check_value(kind, value, allowed)
    except ValidationError as error:
        named = ", ".join(f"{name} {part!r}" for name, part in zip(columns, key, strict=False))
        refused = UnsafeValueError if isinstance(error, UnsafeValueError) else ValidationError
        raise refused(f"{where}: {table} row ({named}): {error}") from None


def _select(table: str, columns: tuple[str, ...]) -> str:
    return f"SELECT {', '.join(columns)} FROM {table}"  # noqa: S608 (names from the constants above)


def _check_sqlite(path: Path, allowed: Allowed) -> SourceCounts:
    """The counts of a langgraph-checkpoint-sqlite file, once it and its values are checked (read-only)."""
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
            for table, names in _SQLITE_VALUES.items():
                for row in connection.execute(_select(table, names)):
                    _check_value(path, table, names, row, allowed)
    except sqlite3.DatabaseError as error:  # "file is not a database" and the like
        raise DatabaseError(f"{path} cannot be read as a SQLite database: {error}") from error
    return SourceCounts(int(threads), int(checkpoints), int(writes))


async def _check_postgres(dsn: str, shown: str, allowed: Allowed) -> SourceCounts:
    """The counts of a langgraph-checkpoint-postgres database, after checking it is one and its values."""
    import asyncpg  # memorm's own Postgres driver: the check needs no psycopg

    from memorm.cli.open_database import unreachable

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
        async with connection.transaction(readonly=True):  # a cursor lives in a transaction
            for table, names in _POSTGRES_VALUES.items():
                async for row in connection.cursor(_select(table, names)):
                    _check_value(shown, table, names, row, allowed)
    except MemormError:
        raise
    except Exception as error:
        raise DatabaseError(f"cannot read {shown}: {error}") from error
    finally:
        await connection.close()
    return SourceCounts(int(counts["threads"]), int(counts["checkpoints"]), int(writes))


@asynccontextmanager
async def open_source(
    location: str, *, allowed_types: Iterable[AllowedType] | None = None
) -> AsyncIterator[tuple[Any, SourceCounts]]:
    """LangGraph's saver over the checkpoint database at `location`, and what it holds.

    Args:
        location: a langgraph-checkpoint-sqlite file (a path, or a
            `sqlite:///` URL), or a langgraph-checkpoint-postgres database (a
            `postgresql://` URL; any `+driver` is dropped).
        allowed_types: your own types that the graphs' state holds, as
            `MemormSaver` takes them.

    Raises:
        DatabaseError: the file is missing or unreadable, or the server unreachable.
        ValidationError: the database holds no LangGraph checkpoint tables, or
            reading Postgres needs packages that are not installed.
        UnsafeValueError: a value names a callable that is not allowed (the
            message names its row).
    """
    if not isinstance(location, str) or not location:
        raise ValidationError("source: expected a file path or a database URL")
    allowed = graph_values.allowed_types(allowed_types)
    if not _is_postgres(location):
        path = _sqlite_path(location)
        counts = await anyio.to_thread.run_sync(_check_sqlite, path, allowed)
        import aiosqlite

        try:
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
        except ImportError as error:  # pragma: no cover (installed with memorm's dev dependencies)
            raise ValidationError(
                f"reading a langgraph-checkpoint-sqlite file takes LangGraph's SQLite saver: {SQLITE_PACKAGE}"
            ) from error

        from memorm.compat.langgraph_serde import StrictSerializer

        connection = await aiosqlite.connect(f"{path.as_uri()}?mode=ro", uri=True)
        try:
            yield AsyncSqliteSaver(connection, serde=StrictSerializer(allowed_types=allowed)), counts
        finally:
            await connection.close()
        return
    try:
        url = make_url(location).set(drivername="postgresql")
    except ArgumentError as error:
        raise ValidationError(f"source: {location!r} is not a database URL") from error
    dsn, shown = url.render_as_string(hide_password=False), url.render_as_string(hide_password=True)
    counts = await _check_postgres(dsn, shown, allowed)
    try:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    except ImportError as error:
        raise ValidationError(
            f"reading a langgraph-checkpoint-postgres database takes LangGraph's Postgres saver: "
            f"{POSTGRES_PACKAGES}"
        ) from error
    from memorm.compat.langgraph_serde import StrictSerializer

    serde = StrictSerializer(allowed_types=allowed)
    async with AsyncPostgresSaver.from_conn_string(dsn, serde=serde) as saver:  # pragma: no cover
        yield saver, counts
