"""`UnitOfWork`: one connection, one transaction, all the repositories.

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

Units of work of one event loop take their turns at the connection pool in
arrival order (`memorm.concurrency.Gate`, held in `memorm.checkout.Hold`), and one that waits longer than
the pool's `pool_timeout` raises `PoolTimeoutError`.  A connection found
dead at check-out is dropped and another taken (`memorm.link` says what
happens to one that dies later).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar, cast, overload

import anyio
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.util import greenlet_spawn

from memorm.backend import Backend
from memorm.checkout import Hold
from memorm.concurrency import protect
from memorm.connection_state import in_transaction, interrupt
from memorm.engines import Reachable, is_closed
from memorm.errors import DatabaseError, MemormError, ValidationError
from memorm.link import Link
from memorm.repositories import (
    AgentRepository,
    CheckpointRepository,
    MessageRepository,
    PassageRepository,
    SessionRepository,
    StoreRepository,
)
from memorm.search.vector_scan import VectorCache
from memorm.telemetry import active
from memorm.telemetry_spans import Traced, UnitTrace
from memorm.tenancy import DEFAULT_TENANT
from memorm.translate import MANAGED, READ_ONLY, translating
from memorm.unit_state import UnitState

__all__ = ["UnitOfWork", "UnitsOfWork"]

R = TypeVar("R")


class _Repository(Generic[R]):
    """A repository of an open unit of work, made on first use and kept in its `__dict__`.

    Most units of work use one repository or two of the six; making all six
    on entry was a tenth of a short unit of work's time in Python.
    """

    def __init__(self, make: Callable[[UnitOfWork], R]) -> None:
        self.make = make
        self.name = ""

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type[Any] | None = None) -> _Repository[R]: ...
    @overload
    def __get__(self, instance: UnitOfWork, owner: type[Any] | None = None) -> R: ...
    def __get__(self, instance: UnitOfWork | None, owner: type[Any] | None = None) -> R | _Repository[R]:
        if instance is None:
            return self
        repository = self.make(instance)  # instance.link raises if the unit of work is not open
        if instance._trace is not None:  # OpenTelemetry is on: each call in a span of its own
            repository = cast(R, Traced(repository, self.name, instance._trace))
        instance.__dict__[self.name] = repository  # later reads find it without this call
        return repository


class UnitOfWork:
    """A transaction over memorm's repositories.

    Get one from [`Database.unit_of_work`][memorm.db.Database.unit_of_work].

    Attributes:
        agents: the agents and their core memory.
        sessions: the agents' chat sessions.
        messages: the sessions' messages (recall memory).
        passages: the agents' archival passages and embedding models.
        checkpoints: the graph state of the agents' sessions (LangGraph's checkpoints;
            `memorm.compat.langgraph` uses it).
        graph_store: the agents' long-term store items and their embeddings (LangGraph's
            `BaseStore`; `memorm.compat.langgraph.MemormStore` uses it).
        session: a SQLAlchemy `AsyncSession` on the unit of work's connection and
            transaction, for queries of your own (made on first use).
    """

    backend: Backend
    tenant: str | None  # None: all tenants (maintenance)
    agents = _Repository(lambda uow: AgentRepository(uow.link, uow.tenant))
    sessions = _Repository(lambda uow: SessionRepository(uow.link, uow.tenant))
    messages = _Repository(
        lambda uow: MessageRepository(uow.link, uow.tenant, token_counter=uow.backend.token_counter)
    )
    passages = _Repository(
        lambda uow: PassageRepository(uow.link, uow.tenant, cache=uow.backend.vector_cache)
    )
    checkpoints = _Repository(lambda uow: CheckpointRepository(uow.link, uow.tenant))
    graph_store = _Repository(lambda uow: StoreRepository(uow.link, uow.tenant))

    def __init__(
        self,
        backend: Backend,
        *,
        tenant: str | None = DEFAULT_TENANT,
        read_only: bool = False,
        one_statement: bool = False,
        schema_checked: bool = True,
    ) -> None:
        self.backend = backend
        self.tenant = tenant  # None: all tenants (maintenance)
        self.read_only = read_only
        # memorm's own promise that the unit of work sends one statement, which
        # commits with it (`memorm.link`): no BEGIN/COMMIT round trips of its own.
        self.one_statement = one_statement
        # False: opens at any schema revision (`memorm.health` reads the revision itself).
        self.schema_checked = schema_checked
        self._open = False
        self._hold = Hold()  # its place among writers, write lock, turn and connection while open
        self._link: Link | None = None
        self._interrupted = False
        self._trace: UnitTrace | None = None  # its span and timings, when OpenTelemetry is on

    @property
    def link(self) -> Link:
        """This unit of work's connection and transaction (`memorm.link`), for memorm's own modules."""
        if self._link is None:
            raise RuntimeError("this unit of work is not open")
        return self._link

    @property
    def session(self) -> AsyncSession:
        """The SQLAlchemy `AsyncSession` on this unit of work's connection and transaction.

        Made on first use: memorm's own calls do not need one.  What your
        statements leave on the connection's session (temporary tables,
        `SET`s) is undone before the connection serves another unit of work.
        """
        link = self.link
        link.touch()
        return link.session

    async def __aenter__(self) -> UnitOfWork:
        telemetry = active()
        if telemetry is None:  # the common case: one check
            return await self._enter()
        backend = self.backend
        self._trace = UnitTrace(telemetry, backend.dialect, backend.url.database, self.read_only, self.tenant)
        return await self._trace.enter(self._enter())

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        trace, self._trace = self._trace, None
        if trace is None:
            return await self._exit(exc_type, exc, tb)
        await trace.exit(self._exit(exc_type, exc, tb), exc)

    async def _enter(self) -> UnitOfWork:
        if self._open:
            raise RuntimeError("this unit of work is already open; make a new one per task")
        if self.schema_checked:
            await self.backend.check_schema()
        else:
            await self.backend.learn_role()
        self._interrupted = False
        if not self.read_only:
            await self._hold.take_write_lock(self.backend)
        try:
            await self._begin()
        except BaseException as error:
            self._interrupted |= not isinstance(error, Exception)
            await protect(self._close())
            raise
        self._open = True
        return self

    async def _exit(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self._interrupted |= not issubclass(exc_type, Exception)  # cancelled, or a signal
            await protect(self._close())
            return
        link = self._link
        assert link is not None
        try:
            # A read-only unit of work has a transaction only if it set a tenant, or
            # a vector search on a Citus cluster began one for its settings.
            if not self.read_only or link.begun or in_transaction(link.driver) or link.has_session:
                # An anyio cancellation waits until the COMMIT is through, so a caller
                # leaving a cancelled scope knows this unit of work committed.  asyncio's
                # own cancellation cannot be held off this cheaply: a COMMIT it cuts
                # short leaves the unit of work committed whole or not at all.
                with anyio.CancelScope(shield=True):
                    await self._commit()
        except BaseException as error:
            self._interrupted |= not isinstance(error, Exception)
            try:
                await protect(self._close())
            except asyncio.CancelledError as cancelled:
                # Cancelled as the commit failed: the cancellation wins, the failure is its cause.
                if cancelled is error:
                    raise
                raise cancelled from error
            raise
        if self._interrupted or in_transaction(link.driver):
            await protect(self._close())
        elif link.touched or is_closed(link.driver):
            await protect(self._close(committed=True))  # dropped (the greenlet bridge, IO): never cut in half
        else:
            await self._close(committed=True)

    async def _begin(self) -> None:
        """Check out a connection and set up the repositories (the first statement begins)."""
        backend = self.backend
        hold = self._hold
        state = hold.loop_engine(backend)
        postgres = backend.dialect == "postgresql"
        # On Postgres, under row-level security, every transaction first sets the
        # tenant it may see (transaction-local: it ends with the transaction).
        sets_tenant = postgres and not backend.bypasses_rls
        if self.tenant is None and sets_tenant:
            raise ValidationError(
                "all_tenants=True needs a role that bypasses row-level security (a superuser or one "
                "with BYPASSRLS); this role sees one tenant at a time: connect as the maintenance role"
            )
        options: dict[str, Any] = {MANAGED: True}
        if self.read_only:
            # Read-only units of work run each statement on its own: no BEGIN/COMMIT
            # round trips, and on SQLite beside the writer.  Postgres' READ COMMITTED
            # gives every statement a fresh snapshot inside a transaction too; but
            # the tenant setting needs a transaction to live in.
            options[READ_ONLY] = True
        engine = state.with_options(self.read_only, options)
        pooled = await hold.take_connection(state, engine)
        unit = UnitState(
            self.tenant,
            self.read_only,
            backend.session_agents,
            tenant_setting=self.tenant if sets_tenant else None,
            distributed=backend.distributed,
        )
        self._link = Link(
            engine,
            pooled,
            unit,
            one_statement=self.one_statement,
            replace=None if backend.dialect == "sqlite" else lambda: hold.replace(state, engine),
            setup=backend.session_setup,
            pooler=backend.transaction_pooling,
        )
        for name in _REPOSITORIES:  # made anew on first use, on this link
            self.__dict__.pop(name, None)

    async def _close(self, *, committed: bool = False) -> None:
        """Give the connection back, then the turn at the pool and the SQLite write lock.

        `committed`: the unit of work committed and nothing is left of its
        transaction; check-in then does no IO (the pool does not reset on
        return), so this never suspends and no cancellation can cut it short,
        unless the connection is dropped (dead, or the caller's statements ran
        on it and SQLite cannot reset them): the caller protects it then.
        Otherwise what is left is rolled back, and a connection nobody can
        vouch for (interrupted, or still in a transaction after the rollback)
        is closed for good: the pool opens a new one.
        """
        link, self._link = self._link, None
        pooled, self._hold.pooled = self._hold.pooled, None
        try:
            if link is None:
                if pooled is not None:  # checked out, cut short before its link was made
                    with contextlib.suppress(Exception):
                        await greenlet_spawn(pooled.invalidate)
            elif committed:
                await link.close()
            else:
                await _roll_back_and_close(link, dirty=self._interrupted or link.state.interrupted)
        finally:
            self._leave()

    def _leave(self) -> None:
        """Closed: give up the turn at the pool (the connection is back) and the SQLite write lock."""
        self._open = False
        self._hold.release()

    async def commit(self) -> None:
        """Commit what the repositories wrote so far; the unit of work stays usable.

        A unit of work in which a database error happened cannot commit: it
        rolls back and raises that error again.
        """
        await self._commit()

    async def _commit(self) -> None:
        link = self._link
        assert link is not None
        earlier = link.state.failed
        if earlier is not None:
            await self._rollback()
            raise DatabaseError(f"this unit of work failed ({earlier}) and was rolled back") from earlier
        try:
            with translating():
                await link.commit()
        except MemormError as error:
            link.state.failed = error  # a failed COMMIT leaves nothing to commit later
            raise
        # Committed archive changes make those agents' cached vectors stale: drop
        # them now, so no deleted vector stays in memory until the next search.
        written = link.state.take_archive_writes()
        if written:
            self.backend.vector_cache.evict(written)

    async def rollback(self) -> None:
        """Discard what the repositories wrote since the last commit."""
        await self._rollback()

    async def _rollback(self) -> None:
        link = self._link
        assert link is not None
        link.state.rolled_back()
        with translating():
            await link.rollback()


async def _roll_back_and_close(link: Link, *, dirty: bool) -> None:
    """Roll back what is left on `link` and return its connection, or drop it when `dirty`."""
    if not dirty:
        try:
            await link.rollback()  # whatever is left
            dirty = in_transaction(link.driver)
        except Exception:
            dirty = True
    with contextlib.suppress(Exception):
        if dirty:
            await interrupt(link.driver)
        await link.close(invalidate=dirty)  # dirty: closed for good; the pool opens a new one


class UnitsOfWork(Reachable, Protocol):
    """What the services that run many units of work take: a `Database`, or a tenant view of it.

    Retention, tenant deletion and `scrub` open units of work and tenant
    views through this, not through `Database` itself, so they sit below it
    and `Database` calls them.
    """

    @property
    def tenant(self) -> str:
        """The tenant of this view's units of work."""
        ...

    @property
    def vector_cache(self) -> VectorCache:
        """Agents' embeddings held in memory, evicted when their rows go."""
        ...

    def unit_of_work(
        self, tenant: str | None = None, *, read_only: bool = False, all_tenants: bool = False
    ) -> UnitOfWork:
        """A new unit of work (see `Database.unit_of_work`)."""
        ...

    def for_tenant(self, tenant: str) -> UnitsOfWork:
        """A view whose units of work are scoped to `tenant`."""
        ...


_REPOSITORIES = tuple(name for name, value in vars(UnitOfWork).items() if isinstance(value, _Repository))
