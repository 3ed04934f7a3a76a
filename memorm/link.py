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

**A unit of work of one statement** (`one_statement`: a promise made by
memorm's own callers, a LangGraph checkpoint or a task's writes) commits with
that statement: on SQLite its `BEGIN IMMEDIATE`, the statement and the
`COMMIT` go in one hop to aiosqlite's thread; on Postgres (outside row-level
security, whose tenant setting needs a transaction) the statement runs alone,
atomic by itself (an `executemany` too: asyncpg sends its rows under one
Sync), with no `BEGIN` or `COMMIT` round trip.  A second statement is a bug,
refused (`RuntimeError`) before it is sent.

`info` holds the unit of work's state (read-only, tenant, failure,
interruption, routes, archive writes): the repositories, the error
translation (`memorm.translate`) and the ORM session (whose `info` is this
same dict) all read and write it.
"""

from __future__ import annotations

import contextlib
from typing import Any

from sqlalchemy.engine import Connection, Dialect, Result
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.pool import PoolProxiedConnection, QueuePool
from sqlalchemy.sql import Executable
from sqlalchemy.util import greenlet_spawn

from memorm.driver import WATCHERS, in_transaction, sent
from memorm.tenancy import begin_statements

__all__ = ["LINK", "Link"]

LINK = "memorm_link"  # the pooled connection's info: the link that has it checked out


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
        info: dict[Any, Any],
        *,
        read_only: bool,
        tenant_setting: str | None = None,
        distributed: bool = False,
        one_statement: bool = False,
    ) -> None:
        self.engine = engine
        self.pooled = pooled
        self.driver: Any = pooled.driver_connection
        self.dialect: Dialect = engine.dialect
        self.sqlite = self.dialect.name == "sqlite"
        self.info = info
        self.read_only = read_only
        self._tenant = tenant_setting  # set per transaction under row-level security
        self._distributed = distributed
        self._connection: AsyncConnection | None = None
        self._session: AsyncSession | None = None
        # Whether a transaction is needed before a statement: writers always,
        # readers only to carry the tenant's setting.
        self._transactional = not read_only or tenant_setting is not None
        self.begun = False
        self.one_statement = one_statement
        self._spent = False  # a one-statement unit of work's driver call was made
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
            session.sync_session.info = self.info  # one state, whoever holds which handle
            self._session = session
        return self._session

    @property
    def has_session(self) -> bool:
        return self._session is not None

    async def execute(self, statement: Executable, params: Any = None) -> Result[Any]:
        """Run a statement through SQLAlchemy: Core on the connection, ORM statements in the session."""
        if _is_orm(statement):
            return await self.session.execute(statement, params)
        return await self.connection.execute(statement, params)

    @property
    def needs_begin(self) -> bool:
        """Whether the next statement must begin the transaction first."""
        return self._transactional and not self.begun

    def commits_alone(self, statements: int = 1) -> bool:
        """Whether the next driver call (of `statements` statements) commits by itself.

        Only in a one-statement unit of work, whose one driver call it is (a
        second is refused, on every engine): on SQLite the call takes its
        `BEGIN` (if due) and `COMMIT` along (`memorm.driver`); on Postgres a
        lone statement runs without them, where no transaction is open and no
        tenant setting needs one (else the unit of work commits as usual).
        """
        if not self.one_statement:
            return False
        if self._spent:
            raise RuntimeError("a one-statement unit of work sent a second statement")
        self._spent = True
        return self.sqlite or (statements == 1 and self._tenant is None and not self.begun)

    async def ready(self) -> None:
        """Begin the transaction, if this unit of work needs one and has none yet."""
        if self._transactional and not self.begun:
            await self.begin()

    async def begin(self) -> None:
        self.begun = True
        driver = self.driver
        try:
            if self.sqlite:
                await self._send("BEGIN IMMEDIATE")
            elif self._tenant is not None:
                for statement in begin_statements(
                    self._tenant, read_only=self.read_only, distributed=self._distributed
                ):
                    await self._send(statement)
            else:
                await self._send("BEGIN ISOLATION LEVEL READ COMMITTED")
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
            await self._send("COMMIT" if commit else "ROLLBACK")
        self.begun = False

    async def _send(self, statement: str) -> None:
        """A transaction statement, on the driver (one round trip, or one hop to aiosqlite's thread)."""
        if WATCHERS:
            sent(self, statement)
        if self.sqlite:
            await self.driver.execute_fetchall(statement)
        else:
            await self.driver.execute(statement)

    async def close(self, *, invalidate: bool = False) -> None:
        """Return the connection to the pool (closed for good, with `invalidate`).

        Without IO when the pool has room for it and SQLAlchemy never
        wrapped it: the usual case costs no trip through the greenlet bridge.
        """
        session, self._session = self._session, None
        connection, self._connection = self._connection, None
        pooled = self.pooled
        with contextlib.suppress(Exception):  # an invalidated connection has no info left
            pooled.info.pop(LINK, None)
            if not self.sqlite:
                pooled.dbapi_connection.autocommit = False  # type: ignore[union-attr]
        try:
            if session is not None:
                await session.close()
        finally:
            if connection is not None:
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
