"""`Database`: memorm's public entry point, a small front over its `Backend`.

A `Database` opens units of work (`unit_of_work`), makes tenant views of
itself (`for_tenant`) and runs the operations on the whole database:
migrations (`upgrade`, `downgrade`, `create_all`), distribution on Citus
(`distribute`), `delete_tenant` and `scrub`; and it answers readiness probes
(`health`).  What its units of work share
(engines and pools, per-dialect connection setup, schema facts, SQLite's
writer queue, caches) is its [`Backend`][memorm.backend.Backend], which
tenant views share too.

A `Database` is safe from any event loop and any thread: each loop that uses
it gets an engine (a connection pool) of its own (`memorm.engines`), and
SQLite writers of every loop queue on one `CrossLoopLock`.
"""

from __future__ import annotations

import copy
from types import TracebackType
from typing import Any

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from memorm.backend import Backend
from memorm.concurrency import CrossLoopLock
from memorm.distribute import distribute as distribute_tables
from memorm.engines import Engines
from memorm.errors import ValidationError
from memorm.health import Health, probe
from memorm.migrate import create_all, downgrade, upgrade
from memorm.removal import Scrubbed
from memorm.schema_state import current_revision
from memorm.scrub import scrub as scrub_database
from memorm.search.vector_scan import VectorCache
from memorm.tenancy import DEFAULT_TENANT, check_tenant
from memorm.tenants import delete_tenant as delete_rows_of_tenant
from memorm.tokens import TokenCounter, estimate_tokens
from memorm.uow import UnitOfWork
from memorm.validation import check_flag

__all__ = ["Database"]


class Database:
    """An async database for agents' memory.

    Args:
        url: `sqlite+aiosqlite:///file.db` or `postgresql+asyncpg://…` (plain
            `sqlite:///` and `postgresql://` are mapped to those drivers).
            Defaults to `MEMORM_DATABASE_URL`, else `sqlite+aiosqlite:///memorm.db`.
        token_counter: estimates `token_count` for messages stored without
            one (default [`memorm.tokens.estimate_tokens`][memorm.tokens.estimate_tokens]).
        transaction_pooling: a pooler in transaction mode (PgBouncer's
            `pool_mode = transaction`, Supavisor, …) sits between memorm and
            Postgres, handing each transaction whichever server connection is
            free.  memorm then keeps nothing on a server connection beyond a
            statement or transaction: no prepared statements by name
            (asyncpg's and SQLAlchemy's statement caches are off: each
            statement is parsed in the message that runs it) and no session
            settings (a vector search sends its own, as `SET LOCAL`s in its
            transaction).  No effect on SQLite.  See docs/production.md for
            what it costs.
        **engine_options: passed to SQLAlchemy's `create_async_engine`
            (`pool_size`, `max_overflow`, `connect_args`, `echo`…).

    Example:
        ```python
        async with Database("sqlite:///agents.db") as db:
            await db.upgrade()
            async with db.unit_of_work() as uow:
                agent = await uow.agents.create("sam")
        ```
    """

    def __init__(
        self,
        url: str | URL | None = None,
        *,
        token_counter: TokenCounter = estimate_tokens,
        transaction_pooling: bool = False,
        **engine_options: Any,
    ) -> None:
        self.backend = Backend(
            url, token_counter=token_counter, transaction_pooling=transaction_pooling, **engine_options
        )
        self.tenant = DEFAULT_TENANT  # the tenant of this view's units of work (`for_tenant`)

    @property
    def url(self) -> URL:
        """The database's URL (its password, if any, hidden by `repr`)."""
        return self.backend.url

    @property
    def engine(self) -> AsyncEngine:
        """The SQLAlchemy engine (and connection pool) of the running event loop.

        Each event loop gets its own, made on first use and disposed when the
        loop shuts down; outside any loop this is a spare engine that the
        first loop adopts.
        """
        return self.backend.engine

    @property
    def dialect(self) -> str:
        """`"sqlite"` or `"postgresql"`."""
        return self.backend.dialect

    @property
    def token_counter(self) -> TokenCounter:
        """Estimates `token_count` for messages stored without one."""
        return self.backend.token_counter

    @property
    def transaction_pooling(self) -> bool:
        """Whether a pooler in transaction mode sits in front of Postgres (see the constructor)."""
        return self.backend.transaction_pooling

    @property
    def vector_cache(self) -> VectorCache:
        """Agents' embeddings read into memory for SQLite's vector search, and their embedding models."""
        return self.backend.vector_cache

    @property
    def engines(self) -> Engines:
        """The engines of every event loop that used this database (`memorm.engines`)."""
        return self.backend.engines

    @property
    def writer_lock(self) -> CrossLoopLock | None:
        """SQLite: the queue this process's writers wait in for the file's write lock (None on Postgres)."""
        return self.backend.writer_lock

    def __repr__(self) -> str:
        url = self.url.render_as_string(hide_password=True)
        return (
            f"Database({url!r})"
            if self.tenant == DEFAULT_TENANT
            else f"Database({url!r}, tenant={self.tenant!r})"
        )

    def for_tenant(self, tenant: str) -> Database:
        """A view of this database whose units of work are scoped to `tenant`.

        It shares the engines, pools, caches and locks: making one per request
        costs nothing.  Adapters take it as their `db`.  `dispose()` on a view
        closes the shared pools.

        Example:
            ```python
            acme = db.for_tenant("acme")
            async with acme.unit_of_work() as uow:  # sees and writes acme's rows only
                agent = await uow.agents.create("sam")
            ```
        """
        view = copy.copy(self)
        view.tenant = check_tenant(tenant)
        return view

    async def __aenter__(self) -> Database:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.dispose()

    def clone(self, **engine_options: Any) -> Database:
        """A new `Database` on the same URL, token counter and engine options (`engine_options` override).

        A `Database` already serves every event loop and thread (each loop
        gets its own pool); a clone is for separate pool settings, or a
        separate vector cache and SQLite writer queue.
        """
        backend = self.backend
        clone = Database(
            backend.url,
            token_counter=backend.token_counter,
            transaction_pooling=backend.transaction_pooling,
            **{**backend.engine_options, **engine_options},
        )
        clone.tenant = self.tenant
        return clone

    async def dispose(self) -> None:
        """Close every pooled connection, of every event loop's engine.

        The `Database` stays usable: the next unit of work opens new connections.
        """
        await self.backend.dispose()

    async def dispose_loop(self) -> None:
        """Close the pooled connections of the running event loop's engine only."""
        await self.backend.engines.dispose_current()

    def unit_of_work(
        self, tenant: str | None = None, *, read_only: bool = False, all_tenants: bool = False
    ) -> UnitOfWork:
        """A new [`UnitOfWork`][memorm.uow.UnitOfWork] (use it with `async with`).

        Args:
            tenant: the tenant whose rows alone the unit of work reads and
                writes; None is this database's (`"default"`, or the
                tenant of a [`for_tenant`][memorm.db.Database.for_tenant] view).
            read_only: a promise that it only reads (writes raise
                `ValidationError`): each statement sees the latest commit,
                and on SQLite it runs beside a writer instead of queueing
                for the write lock.
            all_tenants: maintenance across every tenant (`purge_expired`,
                `forget`, and memorm's exports and copies); other operations
                raise `ValidationError`.  On Postgres the role must bypass
                row-level security (a superuser or `BYPASSRLS`), else the
                unit of work raises `ValidationError` as it opens.
        """
        if check_flag(all_tenants, "all_tenants"):
            if tenant is not None:
                raise ValidationError("give a tenant or all_tenants=True, not both")
            return UnitOfWork(self.backend, tenant=None, read_only=read_only)
        owner = self.tenant if tenant is None else check_tenant(tenant)
        return UnitOfWork(self.backend, tenant=owner, read_only=read_only)

    async def delete_tenant(
        self, tenant: str, *, batch: int = 5_000, dry_run: bool = False
    ) -> dict[str, int]:
        """Delete every row of `tenant`, in batches; returns the rows deleted per table.

        Each batch of `batch` rows is its own transaction, so no lock is
        held for long.  Full-text entries and cached vectors go too; with
        `dry_run`, returns the rows there are and deletes nothing.  The
        counts name the graph-state tables too (`graph_checkpoints`…).  See
        [`memorm.tenants.delete_tenant`][memorm.tenants.delete_tenant].
        """
        return await delete_rows_of_tenant(self, tenant, batch=batch, dry_run=dry_run)

    async def scrub(self, *, reindex: bool = False) -> Scrubbed:
        """Clear what the database files still hold of deleted rows (after purges or `forget`).

        Deleted rows are gone for every query as soon as their unit of work
        commits; their bytes can linger.  On SQLite (where deletes zero the
        freed space, `secure_delete`) this merges both full-text indexes,
        whose older segments still list deleted words, then checkpoints and
        truncates the write-ahead log, which holds old page images.  On
        Postgres it runs `VACUUM` on memorm's tables with index cleanup
        forced (by default Postgres skips it when few pages changed, as when
        one person is forgotten), removing dead row versions and their index
        entries (full-text GIN, HNSW vectors).  A GIN index keeps the words
        themselves as keys with no rows; `reindex=True` rebuilds both
        full-text indexes (`REINDEX CONCURRENTLY`: writes go on, but it
        reads the whole table) so not even the words remain.  Backups and
        archived WAL are out of its reach (docs/retention.md).

        Only the tables' owner (or a superuser) may `VACUUM` or `REINDEX`
        them: run as another role (the application role), the tables it
        may not clean are skipped, named in the result's `skipped`, and a
        [`ScrubWarning`][memorm.scrub.ScrubWarning] says so.

        Returns:
            A [`Scrubbed`][memorm.scrub.Scrubbed]: what was cleared and what
            was skipped (`.complete` when nothing was).
        """
        return await scrub_database(self, reindex=reindex)

    async def create_all(self) -> None:
        """Create the schema from the models and stamp it at head (for throwaway databases).

        Real deployments use [`upgrade`][memorm.db.Database.upgrade], which runs the migrations.
        """
        await create_all(self.backend)
        self.backend.schema_ok = True

    async def distribute(self) -> list[str]:
        """On a Citus coordinator, distribute memorm's tables by agent; what was done (idempotent).

        See [`memorm.distribute.distribute`][memorm.distribute.distribute] and docs/scaling.md.
        """
        done = await distribute_tables(self.backend)
        self.backend.distributed = True
        return done

    async def upgrade(self, revision: str = "head") -> None:
        """Migrate the schema to `revision` (alembic `upgrade`)."""
        try:
            await upgrade(self.backend, revision)
        finally:  # committed, perhaps, even if cancelled as it returned: checked again either way
            self.backend.schema_changed()

    async def downgrade(self, revision: str) -> None:
        """Migrate the schema down to `revision` (alembic `downgrade`)."""
        try:
            await downgrade(self.backend, revision)
        finally:
            self.backend.schema_changed()

    async def health(self, *, timeout: float = 5.0) -> Health:
        """A readiness probe's answer: reachable, how fast, the schema's revision, the pools' figures.

        The probe waits its turn at the pool as a read-only unit of work of
        this view's tenant does, reads the schema's revision on the
        connection, and gives it back. It raises nothing for the database:
        an unreachable server, a pool that stays full, or no answer within
        `timeout` seconds come back as `reachable=False`, with the
        `memorm.errors` class and message in `error`. A schema behind this
        memorm's migrations is reachable but not `ok`.

        Example:
            ```python
            health = await db.health()
            if not health.ok:
                print("not ready:", health.error or f"schema at {health.revision}")
            ```

        Raises:
            ValidationError: `timeout` is not a positive number of seconds.
        """
        return await probe(self.backend, self.tenant, timeout=timeout)

    async def current_revision(self) -> str | None:
        """The schema's alembic revision, or None for a database memorm never set up."""
        return await current_revision(self.backend)

    async def check_schema(self) -> None:
        """Raise [`SchemaError`][memorm.errors.SchemaError] unless the schema is at the head revision.

        Runs once per `Database`; units of work call it before their first statement.
        """
        await self.backend.check_schema()

    @property
    def distributed(self) -> bool:
        """Whether memorm's tables are distributed on a Citus cluster (known after a unit of work)."""
        return self.backend.distributed

    @property
    def bypasses_rls(self) -> bool:
        """Whether the role connecting is exempt from row-level security (Postgres).

        Such a role (a superuser, or one with `BYPASSRLS`) sees every
        tenant's rows in raw SQL: use it for migrations and maintenance,
        and an application role (`memorm db create-role`) for the server.
        False on SQLite, which has no row-level security.

        On Postgres memorm looks the role up with the schema check, before
        the first unit of work: until then the answer is unknown, and
        reading it raises rather than guess.

        Example:
            ```python
            await db.check_schema()  # or run any unit of work first
            if db.bypasses_rls:
                print("this role sees every tenant's rows")
            ```

        Raises:
            MemormError: on Postgres, before the role was looked up (no
                unit of work has run, nor `check_schema`).
        """
        return self.backend.bypasses_rls
