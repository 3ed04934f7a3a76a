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

import asyncio
import contextlib
import copy
import functools
import sqlite3
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, ExceptionContext
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import configure_mappers
from sqlalchemy.util import await_only
from sqlalchemy.util.concurrency import in_greenlet

from memorm.concurrency import CrossLoopLock, protect
from memorm.config import resolve_url
from memorm.engines import Engines, bridged
from memorm.errors import DatabaseError, MemormError, SchemaError, ValidationError
from memorm.link import LINK
from memorm.routing import SessionAgents
from memorm.search.vector import VectorCache, connection_setup
from memorm.tenancy import DEFAULT_TENANT, check_tenant
from memorm.tokens import TokenCounter, estimate_tokens
from memorm.translate import MANAGED, READ_ONLY, translate, translating
from memorm.types.json import dumps, loads, loads_jsonb
from memorm.validation import check_flag

if TYPE_CHECKING:
    from memorm.scrub import Scrubbed
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

    token_counter: TokenCounter
    vector_cache: VectorCache

    def __init__(
        self,
        url: str | URL | None = None,
        *,
        token_counter: TokenCounter = estimate_tokens,
        transaction_pooling: bool = False,
        **engine_options: Any,
    ) -> None:
        self.url = resolve_url(url)
        self.transaction_pooling = check_flag(transaction_pooling, "transaction_pooling")
        self.token_counter = token_counter
        # Repositories build model instances without the ORM (models.hydrate);
        # the mappers must be configured first, or attribute access fails.
        configure_mappers()
        self._engine_options = dict(engine_options)
        self.tenant = DEFAULT_TENANT  # the tenant of this view's units of work (`for_tenant`)
        self._state = _Shared()
        self._dialect = self.url.get_backend_name()
        in_memory = self._dialect == "sqlite" and self.url.database in (None, "", ":memory:")
        # memorm opens the connections, unless the options bring a connection maker of their own.
        self._bridged = "async_creator" not in engine_options and "async_creator_fn" not in (
            engine_options.get("connect_args") or {}
        )
        # The SETs each new Postgres connection runs (again after a reset: memorm.link).
        server_settings = (engine_options.get("connect_args") or {}).get("server_settings") or {}
        self.session_setup = connection_setup(server_settings) if self._dialect == "postgresql" else None
        # One engine (pool) per event loop that uses this database (memorm.engines).
        self.engines = Engines(self._make_engine, single_loop=in_memory, bridged=self._bridged)
        self._schema_lock = CrossLoopLock("the schema check")
        # SQLite has one write lock per file.  Writers of this process queue for it
        # here, first come first served, whatever loop or thread they run on; left
        # to SQLite's busy handler they poll with sleeps of up to 100 ms and starve
        # each other (p99 1.4 s with 50 writers).  BEGIN IMMEDIATE and the busy
        # timeout still order writers across processes.
        self.writer_lock: CrossLoopLock | None = (
            CrossLoopLock("SQLite's write lock") if self._dialect == "sqlite" else None
        )
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
        connect_args = dict(options.get("connect_args") or {})
        if self._dialect == "postgresql" and self.transaction_pooling:
            # No statement outlives its transaction on a server connection: unnamed
            # statements only (asyncpg), and none kept by SQLAlchemy's adapter.
            connect_args.update(statement_cache_size=0, prepared_statement_cache_size=0)
        if self._bridged:
            if self._dialect == "postgresql":
                creator: Any = functools.partial(_connect_postgres, settings=not self.transaction_pooling)
            else:
                creator = _connect_sqlite
            connect_args["async_creator_fn"] = bridged(creator)
        if connect_args:
            options["connect_args"] = connect_args
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
            self.url,
            token_counter=self.token_counter,
            transaction_pooling=self.transaction_pooling,
            **{**self._engine_options, **engine_options},
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
        from memorm.scrub import scrub

        return await scrub(self, reindex=reindex)

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

        try:
            await upgrade(self, revision)
        finally:  # committed, perhaps, even if cancelled as it returned: checked again either way
            self._schema_ok = False

    async def downgrade(self, revision: str) -> None:
        """Migrate the schema down to `revision` (alembic `downgrade`)."""
        from memorm.migrate import downgrade

        try:
            await downgrade(self, revision)
        finally:
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
        if self.dialect == "postgresql" and not self._state.role_known:
            raise MemormError(
                "db.bypasses_rls: not known yet: memorm looks the role up before the first unit of "
                "work; run one, or `await db.check_schema()`, first"
            )
        return self._state.bypasses_rls


_BYPASSES_RLS = sa.text("SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user")


class _Shared:
    """What a `Database` and its tenant views share."""

    def __init__(self) -> None:
        self.schema_ok = False
        self.bypasses_rls = False  # Postgres: whether the role is exempt from row-level security
        self.role_known = False  # whether bypasses_rls was looked up (Database.bypasses_rls raises until)
        self.distributed = False  # Postgres: whether memorm's tables are sharded by agent (Citus)


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
            try:
                await_only(connection.connection.driver_connection.execute_fetchall("BEGIN IMMEDIATE"))
            except BaseException as error:
                # Cancelled, the BEGIN still runs in aiosqlite's thread, but SQLAlchemy
                # takes a failed begin event for no transaction, and would pool the
                # connection inside it, holding the write lock: dropped instead.
                if not isinstance(error, Exception):
                    connection.invalidate()
                raise


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
        # wait for its end, seconds later for a long one: stop it now.  Without
        # an await (this runs inside the cancelled scope) and without raising:
        # an error raised here would replace the cancellation.  A connection
        # SQLAlchemy drops instead is stopped as it closes (`_close_sqlite`).
        connection = context.connection
        if (
            not isinstance(context.original_exception, Exception)
            and not context.is_disconnect
            and connection is not None
            and not (connection.closed or connection.invalidated)
        ):
            _interrupt_sqlite(connection.connection.driver_connection)

    # Connections are closed whole, whatever cancellation arrives.  SQLAlchemy drops
    # one (invalidated, or cut short in its connect events) with a graceful close it
    # shields and, when that wait is cancelled (an anyio scope cancels every await
    # in it), aiosqlite's `stop()` beside it.  The two race: the loser forgets the
    # connection before it is closed (the file stays locked until the garbage
    # collector finds it) or waits for ever ("Task was destroyed but it is
    # pending!").  And a plain close cut short (`dispose()` in a cancelled scope)
    # is logged as an error and leaves the pool's other connections open.
    @event.listens_for(engine.sync_engine, "close")
    def _on_close(dbapi_connection: Any, _record: Any) -> None:
        # Ahead of SQLAlchemy's own close or terminate, which then find it closed.
        if in_greenlet():
            await_only(protect(_close_sqlite(dbapi_connection.driver_connection)))

    dialect = engine.sync_engine.dialect
    terminate = dialect.do_terminate

    def _terminate(dbapi_connection: Any) -> None:
        # The connect events' failure closes without a close event.  Outside the
        # greenlet bridge (the garbage collector's clean-up) nothing can be
        # awaited, and nothing else is closing the connection: aiosqlite's `stop()`.
        if in_greenlet():
            await_only(protect(_close_sqlite(dbapi_connection.driver_connection)))
        else:
            terminate(dbapi_connection)

    dialect.do_terminate = _terminate  # type: ignore[method-assign]


def _interrupt_sqlite(driver: Any) -> None:
    """Stop the statement an aiosqlite connection runs, from the event loop's thread, without awaiting."""
    connection = getattr(driver, "_connection", None)  # the sqlite3 connection; None once closed
    if connection is not None:
        # sqlite3_interrupt is safe from any thread; a connection closing meanwhile refuses it.
        with contextlib.suppress(sqlite3.ProgrammingError):
            connection.interrupt()


async def _close_sqlite(driver: Any) -> None:
    """Roll back and close an aiosqlite connection, interrupting a statement that keeps it busy.

    A statement still running holds up what is queued behind it: it is
    interrupted only if the ROLLBACK or the close is not through at once.
    Not before: an interrupt that finds nothing running stays pending while
    an unfinished statement (one whose fetch a cancellation cut short)
    lives, and stops the ROLLBACK.
    """
    raw = getattr(driver, "_connection", None)  # the sqlite3 connection; None once closed
    if raw is not None and raw.in_transaction:
        # Ended before the close: SQLite keeps a connection closed under an
        # unfinished statement open, with its transaction and the write lock,
        # until the garbage collector finalizes that statement.
        with anyio.move_on_after(_SQLITE_STATEMENT_GRACE) as waiting, contextlib.suppress(sqlite3.Error):
            await driver.rollback()
        if waiting.cancelled_caught:  # the ROLLBACK still runs, once the statement stops
            _interrupt_sqlite(driver)
    closing = asyncio.ensure_future(driver.close())
    with anyio.move_on_after(_SQLITE_STATEMENT_GRACE):
        await asyncio.shield(closing)
    if not closing.done() and raw is not None:
        with contextlib.suppress(sqlite3.ProgrammingError):  # closed meanwhile
            raw.interrupt()
    with contextlib.suppress(ValueError):  # aiosqlite's word for "closed already"
        await closing


_SQLITE_STATEMENT_GRACE = 0.05  # seconds a closing connection's statement may take before it is interrupted


def _connect_sqlite(*args: Any, **kwargs: Any) -> Any:
    """A new aiosqlite connection (to await), as SQLAlchemy's dialect makes one."""
    import aiosqlite

    connection = aiosqlite.connect(*args, **kwargs)
    # Its thread must not keep the interpreter alive at exit (as SQLAlchemy's dialect does).
    connection._thread.daemon = True
    return _open_sqlite(connection)


async def _open_sqlite(connection: Any) -> Any:
    """`connection` (an aiosqlite connection not yet awaited), opened whole whatever cancellation arrives.

    Cut short, aiosqlite drops the sqlite3 connection its thread is opening
    without closing it (the garbage collector does, and from Python 3.13
    warns "unclosed database").  Cancelled meanwhile, the caller gets the
    cancellation, and the connection made for nobody is closed.
    """
    try:
        return await protect(_awaited(connection))
    except BaseException:
        if getattr(connection, "_connection", None) is not None:
            await protect(connection.close())
        raise


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


async def _connect_postgres(*args: Any, settings: bool = True, **kwargs: Any) -> Any:
    """A new asyncpg connection with memorm's codecs, made whole whatever cancellation arrives.

    `settings`: run memorm's `SET`s on it (not behind a transaction pooler,
    where they would stay on one server connection of the pooler's).

    Cut short, asyncpg abandons its handshake with a future nobody retrieves
    ("unexpected connection_lost()"), and a connection without its codecs
    would misread vectors.  Cancelled meanwhile, the caller gets the
    cancellation, and the connection made for nobody is closed (not left to
    the garbage collector: "unclosed connection").
    """
    made: list[Any] = []

    async def open_and_keep() -> Any:
        connection = await _open_postgres(*args, settings=settings, **kwargs)
        made.append(connection)
        return connection

    try:
        return await protect(open_and_keep())
    except BaseException:
        for connection in made:
            await protect(_close_postgres(connection))
        raise


async def _close_postgres(connection: Any) -> None:
    """Close an asyncpg connection politely, or at once if the server does not answer."""
    try:
        await connection.close(timeout=_CLOSE_TIMEOUT)
    except Exception:
        connection.terminate()


_CLOSE_TIMEOUT = 5.0  # seconds


async def _open_postgres(*args: Any, settings: bool, **kwargs: Any) -> Any:
    import asyncpg

    from memorm.types.search_words import register_tsvector

    connection = await asyncpg.connect(*args, **kwargs)
    try:
        # The HNSW settings a search needs, once per connection (the caller's
        # server_settings win); in one message with nothing to parse back.
        setup = connection_setup(kwargs.get("server_settings") or {}) if settings else None
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
