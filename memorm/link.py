"""`Link`: a unit of work's connection, its transaction and its state.

A unit of work runs on one pooled connection.  Its hot statements (appends,
windows, context, counters) go to the driver connection directly, compiled
once per statement and dialect (`memorm.driver`); everything else goes
through SQLAlchemy Core on the same connection; the ORM `AsyncSession` is
made only when someone asks for it (`uow.session`, ORM queries).  A unit of
work that appends a message so never builds a session, never crosses the
greenlet bridge per statement and never runs the ORM's transaction events.

**The transaction is the link's, on every engine.**  SQLAlchemy never sends
`BEGIN`, `COMMIT` or `ROLLBACK` itself: the connection is in autocommit mode
for SQLAlchemy (Postgres; on SQLite the driver's implicit transactions are
off), and the link begins the transaction before the first statement that
needs one, whichever path that statement takes (SQLAlchemy's statements
begin it through the connection's `begin` event):

* SQLite writers: `BEGIN IMMEDIATE` (writers queue for the file's lock).
  Readers: none; each statement sees the latest commit.
* Postgres writers: `BEGIN`.  Readers: none (each statement is atomic).
* Postgres under row-level security: `BEGIN` (`READ ONLY` for readers) and
  the tenant's setting, in one round trip (`memorm.tenancy`).
* Postgres behind a transaction pooler (`Database(transaction_pooling=True)`):
  as on one server.  Statements are unnamed and parsed in the same message
  as they run (asyncpg without a statement cache), so the pooler cannot
  hand their parts to two server connections; a vector search sends its
  settings as `SET LOCAL`s in its transaction (`memorm.search.vector`).

**A unit of work of one statement** (`one_statement`: a promise made by
memorm's own callers, a LangGraph checkpoint or a task's writes) commits with
that statement: on SQLite its `BEGIN IMMEDIATE`, the statement and the
`COMMIT` go in one hop to aiosqlite's thread; on Postgres (outside row-level
security, whose tenant setting needs a transaction) the statement runs alone,
atomic by itself (an `executemany` too: asyncpg sends its rows under one
Sync), with no `BEGIN` or `COMMIT` round trip.  A second statement is a bug,
refused (`RuntimeError`) before it is sent.

**Connections that died** (a restart, a killed backend, an idle timeout
somewhere between) are never handed back to the pool (`close`).  One found
dead by the unit of work's first trip to the server — its `BEGIN` (with the
tenant's setting), or the first read of a read-only unit of work, neither of
which changed anything — is replaced by a fresh one and the trip made again
(`first_trip`), so an idle death costs the caller nothing.  Later, a lost
connection fails the unit of work (`DatabaseError`); its transaction died
with it, so nothing of it is left half-written.

**Connections go back clean.**  memorm's own statements change nothing of
a connection's session state; a unit of work in which the caller ran
statements of their own (`uow.session`) may have (a temporary table, a
`SET search_path`, a `SET ROLE`), and the next unit of work on that
connection may be another tenant's.  On Postgres such a unit of work runs
in a transaction (read-only too), and its `COMMIT` goes with
`RESET_SESSION` in one round trip: in the same transaction, so on the same
server connection even behind a transaction pooler (a rollback undoes the
caller's changes by itself).  On SQLite the connection is closed instead (a
new one opens in about a millisecond).

`state` is the unit of work's (`memorm.unit_state.UnitState`: read-only,
tenant, failure, interruption, routes, archive writes): the repositories,
the driver paths and the error translation (`memorm.translate`) read and
write it there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sqlalchemy.engine import Connection, Dialect, Result
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.pool import PoolProxiedConnection, QueuePool
from sqlalchemy.sql import Executable
from sqlalchemy.util import greenlet_spawn

from memorm.connection_state import WATCHERS, in_transaction, sent
from memorm.engines import is_closed
from memorm.tenancy import begin_statements
from memorm.translate import lost
from memorm.unit_state import UnitState

__all__ = ["LINK", "RESET_SESSION", "Link"]

LINK = "memorm_link"  # the pooled connection's info: the link that has it checked out
T = TypeVar("T")

# What a caller's own statements may leave on a Postgres session, undone.  RESET ALL
# brings back the settings the connection started with (its startup parameters, the
# role's and database's defaults), not those memorm sets after connecting: the link's
# `setup` follows.  Role and session user are not among those RESET ALL resets.
RESET_SESSION = (
    "RESET ALL; RESET ROLE; RESET SESSION AUTHORIZATION; DISCARD TEMP; CLOSE ALL; "
    "UNLISTEN *; SELECT pg_advisory_unlock_all()"
)


class Link:
    """One unit of work's connection (see the module's docstring).

    `pooled` is the pool's connection, checked out by the unit of work;
    `engine` the engine (with the unit of work's execution options) that a
    SQLAlchemy `Connection` on it is made with, on first use.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        pooled: PoolProxiedConnection,
        state: UnitState,
        *,
        one_statement: bool = False,
        replace: Callable[[], Awaitable[PoolProxiedConnection]] | None = None,
        setup: str | None = None,
        pooler: bool = False,
    ) -> None:
        self.engine = engine
        self.dialect: Dialect = engine.dialect
        self.sqlite = self.dialect.name == "sqlite"
        self.state = state
        self._connection: AsyncConnection | None = None
        self._session: AsyncSession | None = None
        # Whether a transaction is needed before a statement: writers always,
        # readers only to carry the tenant's setting.
        # Behind a transaction pooler: the session is the pooler's, nothing of it ours.
        self.pooler = pooler
        self._transactional = not state.read_only or state.tenant_setting is not None
        self.begun = False
        self.one_statement = one_statement
        self._spent = False  # a one-statement unit of work's driver call was made
        # Nothing of this unit of work has reached the server yet: a dead connection
        # found now can be swapped for a fresh one (`first_trip`), by `replace`.
        self.fresh = True
        self._replace = replace
        self._setup = setup  # the SETs memorm runs on a new connection (re-run after a reset)
        self.touched = False  # the caller ran statements of their own on it (`uow.session`)
        # The caller's statements may have changed the session since the last COMMIT took
        # RESET_SESSION along (see `touch`): if the unit of work ends so, the connection is dropped.
        self._unreset = False
        self._attach(pooled)

    def _attach(self, pooled: PoolProxiedConnection) -> None:
        self.pooled = pooled
        self.driver: Any = pooled.driver_connection
        if not self.sqlite:
            # SQLAlchemy's asyncpg adapter must never begin a transaction of its
            # own: the link's is the one (undone when the connection goes back).
            pooled.dbapi_connection.autocommit = True  # type: ignore[union-attr]
        pooled.info[LINK] = self

    @property
    def connection(self) -> AsyncConnection:
        """SQLAlchemy's connection on the pooled one, made on first use."""
        if self._connection is None:
            sync = Connection(self.engine.sync_engine, connection=self.pooled)
            self._connection = AsyncConnection(self.engine, sync)
        return self._connection

    @property
    def session(self) -> AsyncSession:
        """The ORM session on this connection, made on first use."""
        if self._session is None:
            session = AsyncSession(
                bind=self.connection,
                join_transaction_mode="control_fully",
                expire_on_commit=False,
                autoflush=False,
            )
            self._session = session
        return self._session

    def touch(self) -> None:
        """The caller is about to run statements of their own on this connection (`uow.session`).

        On Postgres they run in a transaction, whose `COMMIT` takes
        `RESET_SESSION` along (`_end`): a read-only unit of work that has none
        yet begins one.  A SQLAlchemy connection made meanwhile for memorm's
        own reads, outside any transaction, is dropped (it holds nothing) so
        the next statement begins one.
        """
        self.touched = True
        if self.begun or self._session is not None:
            self._unreset = True  # a transaction under way, or a session of memorm's own: unknown
        if self.sqlite or self._transactional:
            return
        self._transactional = True
        if self._session is None and not self.begun:
            self._connection = None

    @property
    def has_session(self) -> bool:
        return self._session is not None

    async def execute(self, statement: Executable, params: Any = None) -> Result[Any]:
        """Run a statement through SQLAlchemy: Core on the connection, ORM statements in the session."""
        if self._connection is None and self.needs_begin:
            await self.ready()  # on the driver, where a dead connection can still be swapped
        if _is_orm(statement):
            return await self.session.execute(statement, params)
        return await self.connection.execute(statement, params)

    @property
    def needs_begin(self) -> bool:
        """Whether the next statement must begin the transaction first."""
        return self._transactional and not self.begun

    def take_only_call(self, statements: int = 1) -> bool:
        """Take a one-statement unit of work's one driver call: whether it commits by itself.

        Called by each driver call (of `statements` statements) as it starts.
        False, and nothing taken, in any other unit of work.  A second call of
        a one-statement unit of work is refused, on every engine; the first
        commits by itself on SQLite, where the call takes its
        `BEGIN` (if due) and `COMMIT` along (`memorm.driver`); on Postgres a
        lone statement runs without them, where no transaction is open and no
        tenant setting needs one (else the unit of work commits as usual).
        """
        if not self.one_statement:
            return False
        if self._spent:
            raise RuntimeError("a one-statement unit of work sent a second statement")
        self._spent = True
        return self.sqlite or (statements == 1 and self.state.tenant_setting is None and not self.begun)

    async def ready(self) -> None:
        """Begin the transaction, if this unit of work needs one and has none yet."""
        if self._transactional and not self.begun:
            if self.fresh:
                await self.first_trip(self.begin)
            else:
                await self.begin()

    async def first_trip(self, work: Callable[[], Awaitable[T]]) -> T:
        """`work()`, this unit of work's first trip to the server; again on a fresh connection if it died.

        Only for work that changes nothing if it did reach the server (a
        `BEGIN`, a read): whatever the dead connection took with it, running
        it again on another is safe.  Only while SQLAlchemy holds no
        connection object on the dead one (it would keep using it).
        """
        try:
            result = await work()
        except Exception as error:
            dead = is_closed(self.driver) or lost(error)
            if self._replace is None or self._connection is not None or not dead:
                raise
            self._detach()
            self._attach(await self._replace())
            result = await work()
        self.fresh = False
        return result

    async def begin(self) -> None:
        self.begun = True
        self.fresh = False
        if self.touched:
            self._unreset = True
        driver = self.driver
        try:
            if self.sqlite:
                await self._send("BEGIN IMMEDIATE")
                return
            state = self.state
            if state.tenant_setting is None:
                await self._send("BEGIN ISOLATION LEVEL READ COMMITTED")
                return
            for statement in begin_statements(
                state.tenant_setting, read_only=state.read_only, distributed=state.distributed
            ):
                await self._send(statement)
        except BaseException:
            self.begun = in_transaction(driver)
            raise

    async def commit(self) -> None:
        """Flush and commit (SQLAlchemy's view of the transaction first, then the driver's)."""
        await self._end(commit=True)

    async def rollback(self) -> None:
        await self._end(commit=False)

    async def _end(self, *, commit: bool) -> None:
        if self._session is not None:
            await (self._session.commit() if commit else self._session.rollback())
        elif self._connection is not None and self._connection.in_transaction():
            await (self._connection.commit() if commit else self._connection.rollback())
        if in_transaction(self.driver):
            if commit and self.touched and not self.sqlite:
                # Before COMMIT, in the same message: what the caller's statements set on
                # the session is undone in their transaction, on their server connection.
                setup = "" if self._setup is None or self.pooler else f"; {self._setup}"
                await self._send(f"{RESET_SESSION}{setup}; COMMIT")
                self._unreset = False
            else:
                await self._send("COMMIT" if commit else "ROLLBACK")
        self.begun = False

    async def _send(self, statement: str) -> None:
        """A transaction statement, on the driver (one round trip, or one hop to aiosqlite's thread)."""
        if WATCHERS:
            sent(self.engine, statement)
        if self.sqlite:
            await self.driver.execute_fetchall(statement)
        else:
            await self.driver.execute(statement)

    def _detach(self) -> None:
        """Take this link's marks off its connection (before it goes back, or is dropped)."""
        pooled = self.pooled
        with contextlib.suppress(Exception):  # an invalidated connection has no info left
            pooled.info.pop(LINK, None)
            if not self.sqlite:
                pooled.dbapi_connection.autocommit = False  # type: ignore[union-attr]

    async def close(self, *, invalidate: bool = False) -> None:
        """Return the connection to the pool (closed for good, with `invalidate`).

        Without IO when the pool has room for it and SQLAlchemy never
        wrapped it: the usual case costs no trip through the greenlet bridge.
        A connection that died is closed for good whatever `invalidate` says;
        one the caller ran statements of their own on was reset with its
        `COMMIT` (see `touch`), or is closed.
        """
        session, self._session = self._session, None
        connection, self._connection = self._connection, None
        pooled = self.pooled
        self._detach()
        try:
            if session is not None:
                await session.close()
            # Dropped: dead, or the caller's statements ran on it and were not reset with a
            # COMMIT (SQLite, or a rollback: rare, and no reason to trust what it left).
            invalidate = (
                invalidate or is_closed(self.driver) or (self.touched and (self.sqlite or self._unreset))
            )
        finally:
            if pooled.dbapi_connection is None:  # dropped already (a first trip found it dead)
                if connection is not None:
                    await connection.close()
            elif connection is not None:
                if invalidate:
                    await connection.invalidate()
                await connection.close()
            elif invalidate:
                await greenlet_spawn(pooled.invalidate)  # closed for good, and checked in
            elif _returns_without_io(self.engine):
                pooled.close()
            else:
                await greenlet_spawn(pooled.close)


def _returns_without_io(engine: AsyncEngine) -> bool:
    """Whether a connection checked in now goes straight back to the pool (no other to close)."""
    pool = engine.sync_engine.pool
    return isinstance(pool, QueuePool) and pool.checkedin() < pool.size()


def _is_orm(statement: Executable) -> bool:
    """Whether a statement needs the ORM (it selects or writes mapped classes, not tables)."""
    attributes = getattr(statement, "_propagate_attrs", None) or {}
    return attributes.get("compile_state_plugin") == "orm"
