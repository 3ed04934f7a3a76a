"""`Database`: one engine and connection pool, shared by every unit of work.

Per-dialect connection setup lives here and nowhere else:

* SQLite: WAL journal, `foreign_keys=ON`, a busy timeout, and transactions
  that really begin.  Writing units of work open with `BEGIN IMMEDIATE`, so
  concurrent writers queue for the write lock instead of failing with
  "database is locked" when a read lock cannot be upgraded.
* Postgres: asyncpg with a shared pool, pgvector's binary codec
  registered on each new connection, and the HNSW search settings set on
  it once (`memorm.search.vector.CONNECTION_SETTINGS`), so a search sends
  none of its own.

A `Database` is safe from any event loop and any thread: each loop that
uses it gets an engine (a connection pool) of its own (`memorm.engines`),
and SQLite writers of every loop queue on one `CrossLoopLock`.
"""

from __future__ import annotations

import copy
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, ExceptionContext
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import configure_mappers
from sqlalchemy.util import await_only

from memorm.concurrency import CrossLoopLock, protect
from memorm.config import resolve_url
from memorm.driver import interrupt
from memorm.engines import Engines
from memorm.errors import DatabaseError, MemormError, SchemaError, ValidationError
from memorm.link import LINK
from memorm.models import AGENTS, EMBEDDING_MODELS, MESSAGES, PASSAGES, SESSIONS
from memorm.routing import SessionAgents
from memorm.search.fts_ddl import FTS_INDEXES
from memorm.search.text import merge_deleted
from memorm.search.vector import VectorCache, connection_setup
from memorm.tenancy import DEFAULT_TENANT, check_tenant
from memorm.tokens import TokenCounter, estimate_tokens
from memorm.translate import MANAGED, READ_ONLY, translate, translating
from memorm.types.json import dumps, loads, loads_jsonb
from memorm.validation import check_flag

if TYPE_CHECKING:
    from memorm.uow import UnitOfWork

__all__ = ["SQLITE_BUSY_TIMEOUT_MS", "Database"]

SQLITE_BUSY_TIMEOUT_MS = 30_000


class Database:
    """An async database for agents' memory.

    Args:
        url: `sqlite+aiosqlite:///file.db` or `postgresql+asyncpg://…` (plain
            `sqlite:///` and `postgresql://` are mapped to those drivers).
            Defaults to `MEMORM_DATABASE_URL`, else `sqlite+aiosqlite:///memorm.db`.
        token_counter: estimates `token_count` for messages stored without
            one (default [`memorm.tokens.estimate_tokens`][memorm.tokens.estimate_tokens]).
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

    token_counter: TokenCounter
    vector_cache: VectorCache

    def __init__(
        self,
        url: str | URL | None = None,
        *,
        token_counter: TokenCounter = estimate_tokens,
        **engine_options: Any,
    ) -> None:
        self.url = resolve_url(url)
        self.token_counter = token_counter
        # Repositories build model instances without the ORM (models.hydrate);
        # the mappers must be configured first, or attribute access fails.
        configure_mappers()
        self._engine_options = dict(engine_options)
        self.tenant = DEFAULT_TENANT  # the tenant of this view's units of work (`for_tenant`)
        self._state = _Shared()
        self._dialect = self.url.get_backend_name()
        in_memory = self._dialect == "sqlite" and self.url.database in (None, "", ":memory:")
        # One engine (pool) per event loop that uses this database (memorm.engines).
        self.engines = Engines(self._make_engine, single_loop=in_memory)
        self._schema_lock = CrossLoopLock()
        # SQLite has one write lock per file.  Writers of this process queue for it
        # here, first come first served, whatever loop or thread they run on; left
        # to SQLite's busy handler they poll with sleeps of up to 100 ms and starve
        # each other (p99 1.4 s with 50 writers).  BEGIN IMMEDIATE and the busy
        # timeout still order writers across processes.
        self.writer_lock: CrossLoopLock | None = CrossLoopLock() if self._dialect == "sqlite" else None
        # SQLite's vector search reads agents' embeddings into numpy matrices once,
        # then reuses them until the agent's archive_version moves; both engines'
        # searches find agents' embedding models here (`vector_cache.models`).
        self.vector_cache = VectorCache()
        # Sessions' agents, for routing session-scoped calls on a distributed database.
        self.session_agents = SessionAgents()

    def _make_engine(self) -> AsyncEngine:
        """A new engine on this database's URL and options (one per event loop)."""
        options: dict[str, Any] = {
            "json_serializer": dumps,
            "json_deserializer": loads_jsonb if self._dialect == "postgresql" else loads,
            # A unit of work always ends its transaction itself (and drops a
            # connection it cannot vouch for); the pool's extra ROLLBACK on
            # every check-in is a wasted round trip.
            "pool_reset_on_return": None,
        }
        options.update(self._engine_options)
        if self._dialect == "postgresql" and "async_creator" not in options:
            given = options.get("connect_args", {})
            options["connect_args"] = {"async_creator_fn": _connect_postgres, **given}
        engine = create_async_engine(self.url, **options)
        _setup_common(engine)
        if self._dialect == "sqlite":
            _setup_sqlite(engine)
        return engine

    @property
    def engine(self) -> AsyncEngine:
        """The SQLAlchemy engine (and connection pool) of the running event loop.

        Each event loop gets its own, made on first use and disposed when the
        loop shuts down; outside any loop this is a spare engine that the
        first loop adopts.
        """
        return self.engines.current().engine

    @property
    def dialect(self) -> str:
        """`"sqlite"` or `"postgresql"`."""
        return self._dialect

    def __repr__(self) -> str:
        url = self.url.render_as_string(hide_password=True)
        return (
            f"Database({url!r})"
            if self.tenant == DEFAULT_TENANT
            else f"Database({url!r}, tenant={self.tenant!r})"
        )

    @property
    def _schema_ok(self) -> bool:
        return self._state.schema_ok

    @_schema_ok.setter
    def _schema_ok(self, value: bool) -> None:
        self._state.schema_ok = value

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
        clone = Database(
            self.url, token_counter=self.token_counter, **{**self._engine_options, **engine_options}
        )
        clone.tenant = self.tenant
        return clone

    async def dispose(self) -> None:
        """Close every pooled connection, of every event loop's engine.

        The `Database` stays usable: the next unit of work opens new connections.
        """
        await self.engines.dispose()

    async def dispose_loop(self) -> None:
        """Close the pooled connections of the running event loop's engine only."""
        await self.engines.dispose_current()

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
        from memorm.uow import UnitOfWork

        if check_flag(all_tenants, "all_tenants"):
            if tenant is not None:
                raise ValidationError("give a tenant or all_tenants=True, not both")
            return UnitOfWork(self, tenant=None, read_only=read_only)
        owner = self.tenant if tenant is None else check_tenant(tenant)
        return UnitOfWork(self, tenant=owner, read_only=read_only)

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
        from memorm.tenants import delete_tenant

        return await delete_tenant(self, tenant, batch=batch, dry_run=dry_run)

    async def scrub(self, *, reindex: bool = False) -> None:
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
        """

        await self.check_schema()
        if self.dialect == "sqlite":
            async with self.unit_of_work() as uow:
                for index in FTS_INDEXES:
                    await merge_deleted(uow.link, index)
            with translating():
                async with self.engine.connect() as connection:
                    outside = await connection.execution_options(**{READ_ONLY: True})  # no BEGIN
                    for _ in range(_CHECKPOINT_TRIES):
                        busy = (await outside.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")).scalar()
                        if not busy:
                            return
                        await anyio.sleep(0.05)  # a reader from another process is still on the old pages
            return
        tables = ", ".join(table.name for table in (AGENTS, SESSIONS, MESSAGES, PASSAGES, EMBEDDING_MODELS))
        with translating():
            async with self.engine.connect() as connection:
                outside = await connection.execution_options(isolation_level="AUTOCOMMIT")
                await outside.exec_driver_sql(f"VACUUM (ANALYZE, INDEX_CLEANUP ON) {tables}")
                if reindex:
                    for index in FTS_INDEXES:
                        await outside.exec_driver_sql(f"REINDEX INDEX CONCURRENTLY {index.gin_index}")

    async def create_all(self) -> None:
        """Create the schema from the models and stamp it at head (for throwaway databases).

        Real deployments use [`upgrade`][memorm.db.Database.upgrade], which runs the migrations.
        """
        from memorm.migrate import create_all

        await create_all(self)
        self._schema_ok = True

    async def distribute(self) -> list[str]:
        """On a Citus coordinator, distribute memorm's tables by agent; what was done (idempotent).

        See [`memorm.distribute.distribute`][memorm.distribute.distribute] and docs/scaling.md.
        """
        from memorm.distribute import distribute

        done = await distribute(self)
        self._state.distributed = True
        return done

    async def upgrade(self, revision: str = "head") -> None:
        """Migrate the schema to `revision` (alembic `upgrade`)."""
        from memorm.migrate import upgrade

        await upgrade(self, revision)
        self._schema_ok = False

    async def downgrade(self, revision: str) -> None:
        """Migrate the schema down to `revision` (alembic `downgrade`)."""
        from memorm.migrate import downgrade

        await downgrade(self, revision)
        self._schema_ok = False

    async def current_revision(self) -> str | None:
        """The schema's alembic revision, or None for a database memorm never set up."""
        from memorm.migrate import current_revision

        return await current_revision(self)

    async def check_schema(self) -> None:
        """Raise [`SchemaError`][memorm.errors.SchemaError] unless the schema is at the head revision.

        Runs once per `Database`; units of work call it before their first statement.
        """
        if self._schema_ok and self._state.role_known:
            return
        async with self._schema_lock:
            if not self._schema_ok:
                await self._check_revision()
                self._schema_ok = True
            if not self._state.role_known:
                if self.dialect == "postgresql":
                    self._state.bypasses_rls = await self._bypasses_rls()
                    from memorm.distribute import is_distributed

                    self._state.distributed = await is_distributed(self)
                self._state.role_known = True

    async def _check_revision(self) -> None:
        from memorm.migrate import head_revision

        try:
            current = await self.current_revision()
        except MemormError:
            raise
        except Exception as error:
            raise (translate(error) or DatabaseError(str(error))) from error
        head = head_revision()
        if current != head:
            where = "has no memorm schema" if current is None else f"is at {current}"
            raise SchemaError(
                f"the database {where}, but this memorm needs revision {head}: "
                "run `memorm db upgrade` (or `await db.upgrade()`)"
            )

    async def _bypasses_rls(self) -> bool:
        """Whether this database's role is exempt from row-level security (superuser or BYPASSRLS)."""
        with translating():
            async with self.engine.connect() as connection:
                found = await connection.scalar(_BYPASSES_RLS)
                await connection.rollback()
        return bool(found)

    @property
    def distributed(self) -> bool:
        """Whether memorm's tables are distributed on a Citus cluster (known after a unit of work)."""
        return self._state.distributed

    @property
    def bypasses_rls(self) -> bool:
        """Whether the role connecting is exempt from row-level security (Postgres).

        Known once a unit of work has run (before, False).

        Such a role (a superuser, or one with `BYPASSRLS`) sees every
        tenant's rows in raw SQL: use it for migrations and maintenance,
        and an application role (`memorm db create-role`) for the server.
        False on SQLite, which has no row-level security.
        """
        return self._state.bypasses_rls


_BYPASSES_RLS = sa.text("SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user")


class _Shared:
    """What a `Database` and its tenant views share."""

    def __init__(self) -> None:
        self.schema_ok = False
        self.bypasses_rls = False  # Postgres: whether the role is exempt from row-level security
        self.role_known = False  # whether bypasses_rls was looked up
        self.distributed = False  # Postgres: whether memorm's tables are sharded by agent (Citus)


_CHECKPOINT_TRIES = 40


def _setup_common(engine: AsyncEngine) -> None:
    @event.listens_for(engine.sync_engine, "handle_error")
    def _on_error(context: ExceptionContext) -> None:
        # SQLAlchemy drops a connection at once when a statement is interrupted
        # by cancellation, inside the cancelled task, where a second
        # cancellation can cut its graceful close short (and asyncpg then
        # abandons its CancelRequest mid-connect: "unexpected connection_lost()").
        # A unit of work's connection is dropped by the unit of work instead,
        # in its protected clean-up.
        connection = context.connection
        if (
            not isinstance(context.original_exception, Exception)
            and connection is not None
            and connection.get_execution_options().get(MANAGED, False)
        ):
            context.is_disconnect = False

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(connection: Any) -> None:
        # A unit of work's connection: its link begins the transaction (memorm.link),
        # for SQLAlchemy's statements as for its own.
        link = connection.info.get(LINK)
        if link is not None:
            if not link.begun:
                await_only(link.ready())
        elif engine.dialect.name == "sqlite" and not connection.get_execution_options().get(READ_ONLY, False):
            # Other connections (tools, migrations' helpers).  Readers run in
            # autocommit (no BEGIN): each statement sees the latest commit, and WAL
            # lets them run beside the writer.  Straight to aiosqlite: one thread
            # hop instead of SQLAlchemy's three.
            await_only(connection.connection.driver_connection.execute_fetchall("BEGIN IMMEDIATE"))


def _setup_sqlite(engine: AsyncEngine) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take BEGIN away from the driver so transactions begin when SQLAlchemy says.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")  # durable in WAL mode, and fast
        cursor.execute("PRAGMA foreign_keys = ON")
        # Deleted rows are overwritten with zeros, not left in free pages (docs/retention.md).
        cursor.execute("PRAGMA secure_delete = ON")
        cursor.close()

    @event.listens_for(engine.sync_engine, "handle_error")
    def _on_error(context: ExceptionContext) -> None:
        # A cancelled statement keeps running in aiosqlite's thread, and
        # SQLAlchemy's clean-up (closing its cursor) would queue behind it and
        # wait for its end, seconds later for a long one: stop it now.
        connection = context.connection
        if not isinstance(context.original_exception, Exception) and connection is not None:
            await_only(interrupt(connection.connection.driver_connection))


async def _connect_postgres(*args: Any, **kwargs: Any) -> Any:
    """A new asyncpg connection with memorm's codecs, made whole whatever cancellation arrives.

    Cut short, asyncpg abandons its handshake with a future nobody retrieves
    ("unexpected connection_lost()"), and a connection without its codecs
    would misread vectors.
    """
    return await protect(_open_postgres(*args, **kwargs))


async def _open_postgres(*args: Any, **kwargs: Any) -> Any:
    import asyncpg

    from memorm.types.search_words import register_tsvector

    connection = await asyncpg.connect(*args, **kwargs)
    try:
        # The HNSW settings a search needs, once per connection (the caller's
        # server_settings win); in one message with nothing to parse back.
        setup = connection_setup(kwargs.get("server_settings") or {})
        if setup is not None:
            await connection.execute(setup)
        await _register_pgvector(connection)
        # Full-text search words travel as binary tsvectors (COPY needs a binary codec).
        await register_tsvector(connection)
    except BaseException:
        connection.terminate()
        raise
    return connection


async def _register_pgvector(connection: Any) -> None:
    """Register pgvector's binary codecs, if the extension is installed yet."""
    schema = await connection.fetchval(
        "SELECT n.nspname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace "
        "WHERE t.typname = 'vector' LIMIT 1"
    )
    if schema is not None:
        from pgvector.asyncpg import register_vector

        await register_vector(connection, schema=schema)
