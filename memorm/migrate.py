"""Alembic, driven programmatically and from `migrations/env.py`.

Both paths run migrations through `run_sync_on`, which opens one
connection of a [`Database`][memorm.db.Database] (so SQLite gets its pragmas and
Postgres its pgvector codec) and runs alembic inside one transaction.  On
SQLite, foreign keys are switched off for the migration: batch migrations
rebuild tables, and dropping the old copy with foreign keys on would cascade
deletes into its children.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.runtime.environment import EnvironmentContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from memorm.concurrency import protect
from memorm.models import metadata
from memorm.search.fts_ddl import is_fts_object
from memorm.translate import MANAGED

if TYPE_CHECKING:
    from memorm.db import Database

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


def script_location() -> Path:
    """The `migrations` folder: inside the installed package, or beside it in a checkout."""
    package = Path(__file__).resolve().parent
    for candidate in (package / "migrations", package.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError("memorm's migrations folder is missing from this installation")


def alembic_config(url: str | None = None, *, connection: Connection | None = None) -> Config:
    """An alembic `Config` for memorm's migrations (no ini file needed)."""
    config = Config()
    config.set_main_option("script_location", str(script_location()))
    if url is not None:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@cache
def _scripts() -> ScriptDirectory:
    """memorm's migration scripts, read once per process (a read imports every revision's file)."""
    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    """The newest revision this memorm ships."""
    head = _scripts().get_current_head()
    if head is None:  # pragma: no cover - the package always ships revisions
        raise RuntimeError("memorm ships no migrations")
    return head


async def run_sync_on(db: Database, fn: Callable[[Connection], T]) -> T:
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


async def _close_and_dispose(db: Database, connection: AsyncConnection) -> None:
    await connection.close()
    await db.engine.dispose()


async def upgrade(db: Database, revision: str = "head") -> None:
    """`alembic upgrade revision` on `db`."""
    await run_sync_on(db, lambda c: command.upgrade(alembic_config(connection=c), revision))


async def downgrade(db: Database, revision: str) -> None:
    """`alembic downgrade revision` on `db`."""
    await run_sync_on(db, lambda c: command.downgrade(alembic_config(connection=c), revision))


async def create_all(db: Database) -> None:
    """Create the schema straight from the models and stamp it at head."""

    def build(connection: Connection) -> None:
        metadata.create_all(connection)
        # What `alembic stamp head` writes, without its reading every revision's file again.
        MigrationContext.configure(connection).stamp(_scripts(), "head")

    await run_sync_on(db, build)


async def current_revision(db: Database) -> str | None:
    """The schema's current revision, or None where memorm never migrated."""
    from memorm.translate import READ_ONLY

    engine = db.engine.execution_options(**{READ_ONLY: True})
    async with engine.connect() as connection:
        revision: str | None = await connection.run_sync(
            lambda c: MigrationContext.configure(c).get_current_revision()
        )
    return revision


async def check_drift(db: Database) -> list[str]:
    """How the live schema differs from memorm's models, one line per difference (empty: none).

    Alembic's autogenerate compares the models with the database
    (`compare_type=True`), ignoring the full-text objects, tables of other
    applications and the HNSW indexes built at run time
    (`memorm.drift.include_name`), and on a distributed database the unique
    indexes its tables cannot hold (`memorm.distribute.unshardable_indexes`).

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
    from alembic.autogenerate import compare_metadata

    from memorm.distribute import DISTRIBUTION, is_distributed, unshardable_indexes
    from memorm.drift import describe_all
    from memorm.drift import include_name as drift_filter
    from memorm.errors import SchemaError
    from memorm.translate import READ_ONLY

    current, head = await current_revision(db), head_revision()
    if current != head:
        where = "has no memorm schema" if current is None else f"is at revision {current}"
        raise SchemaError(f"the database {where}, not {head}: run `memorm db upgrade`")
    dropped: set[str] = set()
    if await is_distributed(db):
        dropped.update(name for table, column in DISTRIBUTION for name in unshardable_indexes(table, column))

    def included(name: str | None, type_: str, parent_names: Any) -> bool:
        return drift_filter(name, type_, parent_names) and not (type_ == "index" and name in dropped)

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
    migrates on that; otherwise it opens a [`Database`][memorm.db.Database] on the URL given by
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

    from memorm.db import Database

    async def main() -> None:
        db = Database(url or None)
        try:
            await run_sync_on(db, migrate)
        finally:
            await db.dispose()

    asyncio.run(main())
