"""`UnitOfWork`: one connection, one transaction, all four repositories.

```python
async with db.unit_of_work() as uow:      # BEGIN
    agent = await uow.agents.create("sam")
    ...                                   # COMMIT on clean exit,
                                          # ROLLBACK on exception or cancellation
```

Repositories flush; only the unit of work commits or rolls back.  A unit of
work belongs to one task: never share one between concurrent tasks.

Opening and closing run under `memorm.concurrency.protect`, so no
cancellation (`asyncio.wait_for`, `task.cancel()`, anyio scopes) can cut
a checkout, a `BEGIN`, a `COMMIT` or a `ROLLBACK` in half.  A unit of
work that was cancelled, or whose statement was interrupted, drops its
connection instead of returning it to the pool: nobody can vouch for what a
half-run statement left behind, and a new connection costs less than a
poisoned one.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from memorm.concurrency import CrossLoopLock, protect
from memorm.driver import in_transaction, interrupt
from memorm.errors import DatabaseError, MemormError, ValidationError
from memorm.repositories import (
    AgentRepository,
    MessageRepository,
    PassageRepository,
    SessionRepository,
)
from memorm.routing import DISTRIBUTED, ROUTES
from memorm.search.vector import ARCHIVE_WRITES
from memorm.tenancy import DEFAULT_TENANT, READ_ONLY_BEGIN, TENANT, TenantSession
from memorm.translate import FAILED, INTERRUPTED, MANAGED, READ_ONLY, failure, translating

if TYPE_CHECKING:
    from memorm.db import Database

__all__ = ["UnitOfWork"]


class UnitOfWork:
    """A transaction over memorm's repositories.

    Get one from [`Database.unit_of_work`][memorm.db.Database.unit_of_work].

    Attributes:
        agents: the agents and their core memory.
        sessions: the agents' chat sessions.
        messages: the sessions' messages (recall memory).
        passages: the agents' archival passages and embedding models.
        session: the underlying SQLAlchemy `AsyncSession`, for queries of your own.
    """

    agents: AgentRepository
    sessions: SessionRepository
    messages: MessageRepository
    passages: PassageRepository
    session: AsyncSession

    def __init__(self, db: Database, *, tenant: str | None = DEFAULT_TENANT, read_only: bool = False) -> None:
        self.db = db
        self.tenant = tenant  # None: all tenants (maintenance)
        self.read_only = read_only
        self._open = False
        self._writer: CrossLoopLock | None = None
        self._connection: AsyncConnection | None = None
        self._driver: Any = None
        self._session: AsyncSession | None = None  # the open unit of work's session
        self._interrupted = False
        self._sets_tenant = False
        self._begins_itself = False  # Postgres, autocommit mode: the unit of work sends BEGIN and COMMIT

    async def __aenter__(self) -> UnitOfWork:
        if self._open:
            raise RuntimeError("this unit of work is already open; make a new one per task")
        await self.db.check_schema()
        self._interrupted = False
        writer = None if self.read_only else self.db.writer_lock
        if writer is not None:
            await writer.acquire()  # cancellable: a cancelled waiter just leaves the queue
        self._writer = writer
        try:
            await self._begin()
        except BaseException as error:
            self._interrupted |= not isinstance(error, Exception)
            await protect(self._finish())
            raise
        self._open = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self._interrupted |= not issubclass(exc_type, Exception)  # cancelled, or a signal
            await protect(self._finish())
            return
        try:
            # A read-only unit of work has a transaction only if it set a tenant, or
            # a vector search on a Citus cluster began one for its settings.
            if not self.read_only or self._sets_tenant or in_transaction(self._driver):
                # An anyio cancellation waits until the COMMIT is through, so a caller
                # leaving a cancelled scope knows this unit of work committed.  asyncio's
                # own cancellation cannot be held off this cheaply: a COMMIT it cuts
                # short leaves the unit of work committed whole or not at all.
                with anyio.CancelScope(shield=True):
                    await self._commit()
        except BaseException as error:
            self._interrupted |= not isinstance(error, Exception)
            try:
                await protect(self._finish())
            except asyncio.CancelledError as cancelled:
                # Cancelled as the commit failed: the cancellation wins, the failure is its cause.
                if cancelled is error:
                    raise
                raise cancelled from error
            raise
        if self._interrupted or in_transaction(self._driver):
            await protect(self._finish())
        else:
            await self._close_clean()

    async def _begin(self) -> None:
        """Check out a connection and set up the repositories (the first statement begins)."""
        state = self.db.engines.current()
        options: dict[str, Any] = {MANAGED: True}
        # On Postgres, under row-level security, every transaction first sets the
        # tenant it may see (transaction-local: it ends with the transaction).
        self._sets_tenant = self.db.dialect == "postgresql" and not self.db.bypasses_rls
        if self.tenant is None and self.db.dialect == "postgresql" and not self.db.bypasses_rls:
            raise ValidationError(
                "all_tenants=True needs a role that bypasses row-level security (a superuser or one "
                "with BYPASSRLS); this role sees one tenant at a time: connect as the maintenance role"
            )
        if self.read_only:
            # Read-only units of work run each statement on its own: no BEGIN/COMMIT
            # round trips, and on SQLite beside the writer.  Postgres' READ COMMITTED
            # gives every statement a fresh snapshot inside a transaction too; but
            # the tenant setting needs a transaction to live in.
            options[READ_ONLY] = True
        self._begins_itself = self.db.dialect == "postgresql" and (self.read_only or self._sets_tenant)
        if self._begins_itself:
            # A tenant's transaction is begun (and ended) by the unit of work itself,
            # BEGIN and the tenant's setting in one round trip (memorm.tenancy); so is
            # the one a read-only vector search begins on Citus (memorm.search.vector).
            options["isolation_level"] = "AUTOCOMMIT"
        engine = state.with_options(self.read_only, options)
        with translating():
            if state.checkout_may_connect():
                await protect(self._checkout(engine))
            else:  # a pooled connection is handed over, or awaited: no IO to protect
                await self._checkout(engine)
        connection = self._connection
        assert connection is not None
        self._driver = connection.sync_connection.connection.driver_connection  # type: ignore[union-attr]
        self.session = AsyncSession(
            bind=connection,
            join_transaction_mode="control_fully",
            expire_on_commit=False,
            autoflush=False,
            sync_session_class=TenantSession,
        )
        self.session.info[READ_ONLY] = self.read_only
        self.session.info[ROUTES] = self.db.session_agents
        self.session.info[DISTRIBUTED] = self.db.distributed
        if self._sets_tenant and self.tenant is not None:
            self.session.info[TENANT] = self.tenant
            self.session.info[READ_ONLY_BEGIN] = self.read_only
        self._session = self.session
        tenant = self.tenant
        self.agents = AgentRepository(self.session, tenant)
        self.sessions = SessionRepository(self.session, tenant)
        self.messages = MessageRepository(self.session, tenant, token_counter=self.db.token_counter)
        self.passages = PassageRepository(self.session, tenant, cache=self.db.vector_cache)

    async def _checkout(self, engine: AsyncEngine) -> None:
        # Kept on self at once: a cancellation raised after a protected check-out
        # must still find the connection to return.
        self._connection = await engine.connect()

    async def _close_clean(self) -> None:
        """Return a connection known to be clean to the pool, and the write lock.

        After a commit, check-in does no IO (the pool does not reset on
        return), so this never suspends and no cancellation can cut it short.
        """
        connection, self._connection, self._session = self._connection, None, None
        try:
            if connection is not None:
                await connection.close()
        finally:
            self._release_writer()

    async def _finish(self) -> None:
        """Roll back and return the connection, or drop it when nobody can vouch for it."""
        try:
            await self._release()
        finally:
            self._release_writer()

    def _release_writer(self) -> None:
        self._open = False
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.release()

    async def _release(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        session, self._session = self._session, None
        dirty = self._interrupted or (session is not None and session.info.get(INTERRUPTED, False))
        if not dirty:
            try:
                if session is not None:
                    await session.close()  # rolls back whatever is left
                if self._begins_itself and in_transaction(self._driver):
                    await self._driver.execute("ROLLBACK")  # the transaction the unit of work began
                dirty = in_transaction(self._driver)
            except Exception:
                dirty = True
        with contextlib.suppress(Exception):
            if dirty:
                await interrupt(self._driver)
                await connection.invalidate()  # closed for good; the pool opens a new one
            await connection.close()

    async def commit(self) -> None:
        """Commit what the repositories wrote so far; the unit of work stays usable.

        A unit of work in which a database error happened cannot commit: it
        rolls back and raises that error again.
        """
        await self._commit()

    async def _commit(self) -> None:
        earlier = failure(self.session)
        if earlier is not None:
            await self._rollback()
            raise DatabaseError(f"this unit of work failed ({earlier}) and was rolled back") from earlier
        try:
            with translating():
                await self.session.commit()
                if self._begins_itself and in_transaction(self._driver):
                    await self._driver.execute("COMMIT")  # the transaction the unit of work began
        except MemormError as error:
            self.session.info[FAILED] = error  # a failed COMMIT leaves nothing to commit later
            raise
        # Committed archive changes make those agents' cached vectors stale: drop
        # them now, so no deleted vector stays in memory until the next search.
        written = self.session.info.pop(ARCHIVE_WRITES, None)
        if written:
            self.db.vector_cache.evict(written)

    async def rollback(self) -> None:
        """Discard what the repositories wrote since the last commit."""
        await self._rollback()

    async def _rollback(self) -> None:
        self.session.info.pop(FAILED, None)
        self.session.info.pop(ARCHIVE_WRITES, None)
        with translating():
            await self.session.rollback()
            if self._begins_itself and in_transaction(self._driver):
                await self._driver.execute("ROLLBACK")
