"""Alembic, driven programmatically and from `migrations/env.py`.

Both paths run migrations through `run_sync_on`, which opens one
connection of a [`Backend`][memorm.backend.Backend] (so SQLite gets its pragmas and
Postgres its pgvector codec) and runs alembic inside one transaction.  On
SQLite, foreign keys are switched off for the migration: batch migrations
rebuild tables, and dropping the old copy with foreign keys on would cascade
deletes into its children.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.runtime.environment import EnvironmentContext
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from memorm.backend import Backend
from memorm.concurrency import protect
from memorm.engines import Reachable
from memorm.errors import SchemaError
from memorm.models import metadata
from memorm.rls import TENANT_TABLES, policy_statements
from memorm.schema_state import (
    DISTRIBUTION,
    alembic_config,
    current_revision,
    head_revision,
    is_distributed,
    script_location,
    scripts,
    unshardable_indexes,
)
from memorm.search.fts_ddl import FTS_INDEXES, is_fts_object
from memorm.translate import MANAGED, READ_ONLY

__all__ = [
    "alembic_config",
    "check_drift",
    "create_all",
    "current_revision",
    "downgrade",
    "head_revision",
    "run_env",
    "script_location",
    "upgrade",
]

T = TypeVar("T")


async def run_sync_on(db: Reachable, fn: Callable[[Connection], T]) -> T:
    """Run `fn(connection)` in one migration transaction, then reset the pool.

    The pool is disposed afterwards so that every new connection sees the new
    schema (and on Postgres registers pgvector's codec, which a migration may
    just have installed).

    Cancelled or failed anywhere, the migration rolls back and its connection
    is closed for good rather than pooled: a half-run statement, or SQLite's
    foreign keys still off, must not reach a unit of work.  The connection is
    opened and dropped under `protect`, so no cancellation cuts either short
    (the file would stay locked, or the connection unclosed), and the caller
    gets the cancellation itself.
    """
    sqlite = db.dialect == "sqlite"
    # MANAGED: SQLAlchemy leaves a connection whose statement was cancelled to
    # `_drop`, instead of closing it at once inside the cancelled task.
    connection = db.engine.execution_options(**{MANAGED: True}).connect()
    try:
        await protect(connection.start())
        result = await _migrate(connection, fn, sqlite=sqlite)
    except BaseException:
        await protect(_drop(connection))
        raise
    # Committed: the pool is reset even if the caller is cancelled meanwhile.
    await protect(_close_and_dispose(db, connection))
    return result


async def _migrate(connection: AsyncConnection, fn: Callable[[Connection], T], *, sqlite: bool) -> T:
    if sqlite:
        # Straight to the driver: SQLAlchemy would BEGIN first, and inside a
        # transaction SQLite ignores the pragma.
        raw = await connection.get_raw_connection()
        await raw.driver_connection.execute("PRAGMA foreign_keys = OFF")  # type: ignore[union-attr]
    transaction = await connection.begin()
    result = await connection.run_sync(fn)
    if sqlite:
        broken = await connection.exec_driver_sql("PRAGMA foreign_key_check")
        if broken.first() is not None:
            raise RuntimeError("migration left rows whose foreign keys point nowhere")
    await transaction.commit()
    if sqlite:
        await raw.driver_connection.execute("PRAGMA foreign_keys = ON")  # type: ignore[union-attr]
    return result


async def _drop(connection: AsyncConnection) -> None:
    """Close a failed migration's connection for good (closing rolls its transaction back)."""
    if connection.sync_connection is None:  # never opened
        return
    # Best effort: the failure (or cancellation) being raised is what the caller must see.
    with contextlib.suppress(Exception):
        await connection.invalidate()
    with contextlib.suppress(Exception):
        await connection.close()


async def _close_and_dispose(db: Reachable, connection: AsyncConnection) -> None:
    await connection.close()
    await db.engine.dispose()


async def upgrade(db: Reachable, revision: str = "head") -> None:
    """`alembic upgrade revision` on `db`."""
    await run_sync_on(db, lambda c: command.upgrade(alembic_config(connection=c), revision))


async def downgrade(db: Reachable, revision: str) -> None:
    """`alembic downgrade revision` on `db`."""
    await run_sync_on(db, lambda c: command.downgrade(alembic_config(connection=c), revision))


def _table_extras(dialect: str, made: list[sa.Table]) -> list[str]:
    """What the models do not declare, for the tables `create_all` made: full-text indexes, RLS policies.

    The same objects the migrations create (their own frozen copies of the statements).
    """
    statements: list[str] = []
    for table in made:
        if dialect == "postgresql" and table in TENANT_TABLES:
            statements += policy_statements(table.name)
        for index in FTS_INDEXES:
            if index.table is table:
                statements += index.sqlite_create() if dialect == "sqlite" else index.postgres_create()
    return statements


async def create_all(db: Reachable) -> None:
    """Create the schema straight from the models and stamp it at head."""

    def build(connection: Connection) -> None:
        existing = set(sa.inspect(connection).get_table_names())
        metadata.create_all(connection)
        made = [table for table in metadata.sorted_tables if table.name not in existing]
        for statement in _table_extras(connection.dialect.name, made):
            connection.exec_driver_sql(statement)
        # What `alembic stamp head` writes, without its reading every revision's file again.
        MigrationContext.configure(connection).stamp(scripts(), "head")

    await run_sync_on(db, build)


async def check_drift(db: Reachable) -> list[str]:
    """How the live schema differs from memorm's models, one line per difference (empty: none).

    Alembic's autogenerate compares the models with the database
    (`compare_type=True`), ignoring the full-text objects, tables of other
    applications and the HNSW indexes built at run time
    (`drift_include_name`), and on a distributed database the unique
    indexes its tables cannot hold (`memorm.schema_state.unshardable_indexes`).

    Raises:
        SchemaError: the schema is not at the head revision (the message names
            `memorm db upgrade`): a schema behind head differs by design, and
            upgrading is the fix.

    Example:
        ```python
        async with Database(url) as db:
            for difference in await check_drift(db):
                print(difference)
        ```
    """
    current, head = await current_revision(db), head_revision()
    if current != head:
        where = "has no memorm schema" if current is None else f"is at revision {current}"
        raise SchemaError(f"the database {where}, not {head}: run `memorm db upgrade`")
    dropped: set[str] = set()
    if await is_distributed(db):
        dropped.update(name for table, column in DISTRIBUTION for name in unshardable_indexes(table, column))

    def included(name: str | None, type_: str, parent_names: Any) -> bool:
        return drift_include_name(name, type_, parent_names) and not (type_ == "index" and name in dropped)

    def in_model(item: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
        # include_name sees what the database has; a model's index it lacks comes here.
        return not (type_ == "index" and name in dropped)

    def compare(connection: Connection) -> list[str]:
        options = {"compare_type": True, "include_name": included, "include_object": in_model}
        return describe_all(compare_metadata(MigrationContext.configure(connection, opts=options), metadata))

    async with db.engine.execution_options(**{READ_ONLY: True}).connect() as connection:
        return await connection.run_sync(compare)


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Autogenerate's filter: the full-text indexes are managed outside the models."""
    return not is_fts_object(name)


# HNSW indexes made at run time by ``uow.passages.ensure_index`` (memorm.search.vector.index_name).
RUNTIME_INDEX_PREFIX = "ix_archival_passages_hnsw_"


def drift_include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """The migrations' filter, plus what a live database legitimately holds beyond the models.

    Tables of other applications sharing the database are not memorm's
    business, and the HNSW indexes `ensure_index` builds on demand are
    expected; neither counts as drift.
    """
    if not include_name(name, type_, parent_names):
        return False
    if type_ == "table":
        return name in metadata.tables
    return not (type_ == "index" and name is not None and name.startswith(RUNTIME_INDEX_PREFIX))


def _column(table: str, column: Any) -> str:
    name = column.name if isinstance(column, sa.Column) else column
    return f"column {table}.{name}"


def _constraint(kind: str, constraint: Any) -> str:
    table = getattr(constraint, "table", None)
    where = f" on {table.name}" if table is not None else ""
    columns = ", ".join(c.name for c in getattr(constraint, "columns", ()))
    over = f" ({columns})" if columns else ""
    return f"{kind} {constraint.name or '(unnamed)'}{where}{over}"


_KINDS = {"index": "index", "constraint": "constraint", "fk": "foreign key"}


def describe(diff: Any) -> str:
    """One line for one entry of `alembic.autogenerate.compare_metadata`'s result."""
    if isinstance(diff, list):  # column modifications come grouped per column
        return "; ".join(describe(item) for item in diff)
    op = diff[0]
    action, _, kind = op.partition("_")
    if kind == "table":
        what = f"table {diff[1].name}"
    elif kind == "column":
        what = _column(diff[2], diff[3])
    elif kind in _KINDS:
        what = _constraint(_KINDS[kind], diff[1])
    elif action == "modify":
        column = _column(diff[2], diff[3])
        database, models = diff[5], diff[6]
        if kind == "nullable":
            database = "NULL" if database else "NOT NULL"
            models = "NULL" if models else "NOT NULL"
        return f"{column}: the database has {kind} {database}, memorm's models {models}"
    else:
        return f"{op}: {diff[1:]}"
    if action == "add":
        return f"{what} is missing from the database"
    if action == "remove":
        return f"the database has {what}, which memorm's models do not"
    return f"{op}: {what}"


def describe_all(diffs: Iterable[Any]) -> list[str]:
    """`describe` each difference."""
    return [describe(diff) for diff in diffs]


def _configure(context: EnvironmentContext, **options: Any) -> None:
    context.configure(
        target_metadata=metadata,
        render_as_batch=True,
        compare_type=True,
        include_name=include_name,
        **options,
    )


def run_env(context: EnvironmentContext) -> None:
    """The body of `migrations/env.py`.

    With a connection in `config.attributes` (the programmatic path) it
    migrates on that; otherwise it opens a [`Backend`][memorm.backend.Backend] on the URL given by
    `-x url=…`, `sqlalchemy.url`, `MEMORM_DATABASE_URL` or the default.
    """
    config = context.config
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    if context.is_offline_mode():
        from memorm.config import resolve_url

        _configure(context, url=resolve_url(url or None), literal_binds=True)
        with context.begin_transaction():
            context.run_migrations()
        return

    def migrate(connection: Connection) -> None:
        _configure(context, connection=connection)
        with context.begin_transaction():
            context.run_migrations()

    connection = config.attributes.get("connection")
    if connection is not None:
        migrate(connection)
        return

    async def main() -> None:
        backend = Backend(url or None)
        try:
            await run_sync_on(backend, migrate)
        finally:
            await backend.dispose()

    asyncio.run(main())
