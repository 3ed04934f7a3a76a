"""One engine (one connection pool) per event loop, for one `Database`.

A pooled connection belongs to the event loop that opened it: asyncpg's
transport and SQLAlchemy's pool queue are bound to that loop, and using them
from another one fails ("attached to a different loop", "another operation is
in progress") or worse.  Yet a server calls memorm from several loops: its own,
and the short-lived ones that `asyncio.run` starts in worker threads
(FastAPI's `def` endpoints, the Agents SDK's `Runner.run_sync`).  So each
loop that uses a `Database` gets an engine of its own.

When a loop shuts down (`asyncio.run`, `asyncio.Runner`, anyio and most
servers end with `loop.shutdown_asyncgens()`), its engine's connections are
closed on that loop: a watcher, an async generator started on the loop, does
it from its `finally` block.  The emptied engine is kept for the next loop,
which so skips the engine's set-up (the dialect's first-connect queries), as
SQLAlchemy allows for an engine disposed before it moves to another loop.  A
loop that ends without that step leaves its connections to
`Engines.dispose`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import QueuePool
from sqlalchemy.util.concurrency import in_greenlet

from memorm.concurrency import BLOCKED, Gate, protect
from memorm.errors import ValidationError

__all__ = ["Engines", "LoopEngine", "NeedsBridge", "Reachable", "bridged", "is_closed"]

_OTHER_LOOP_TIMEOUT = 10.0  # seconds dispose() waits for another running loop to close its pool


class Reachable(Protocol):
    """A database the services below `Database` reach: a [`Backend`][memorm.backend.Backend], or a `Database`.

    Migrations, distribution, roles and the schema facts take this rather
    than `Database`, so they sit below it and it can call them.
    """

    @property
    def engine(self) -> AsyncEngine:
        """The engine (pool) of the running event loop."""
        ...

    @property
    def dialect(self) -> str:
        """`"sqlite"` or `"postgresql"`."""
        ...

    async def check_schema(self) -> None:
        """Raise `SchemaError` unless the schema is at the head revision."""
        ...


class NeedsBridge(Exception):
    """A connection was to be opened outside SQLAlchemy's greenlet bridge.

    memorm's connection makers (`bridged`) raise it before they start any IO,
    so a check-out tried without the bridge (a connection waiting in the
    pool is taken so, in microseconds) fails cleanly when the connection it
    took must reconnect instead: nothing was opened, nothing is left
    unawaited, and the check-out is made again through the bridge.
    """


def bridged(creator: Callable[..., Any]) -> Callable[..., Any]:
    """`creator` (an `async_creator_fn`), refusing with `NeedsBridge` to run outside the greenlet bridge."""

    def create(*args: Any, **kwargs: Any) -> Any:
        if not in_greenlet():
            raise NeedsBridge
        return creator(*args, **kwargs)

    return create


@dataclass(eq=False)
class LoopEngine:
    """An engine, and what memorm tracks of it while one event loop uses it."""

    engine: AsyncEngine
    # Whether its connections are made by a `bridged` creator (not a user's own).
    bridged: bool = False
    loop: asyncio.AbstractEventLoop | None = None
    watcher: AsyncGenerator[None, None] | None = None
    # Driver connections it opened, to close by force if its loop dies unseen.
    drivers: list[Any] = field(default_factory=list)
    variants: dict[Any, AsyncEngine] = field(default_factory=dict)
    # Units of work wait here for their turn at the pool, in arrival order (made per loop).
    gate: Gate | None = None
    # Writing units of work of its loop open, or queued for SQLite's write lock: what a
    # sync call that blocks this loop must not wait for (`open_writer`).
    writers: int = 0

    def with_options(self, key: Any, options: dict[str, Any]) -> AsyncEngine:
        """This engine with execution `options` (made once per `key`; it shares the pool)."""
        found = self.variants.get(key)
        if found is None:
            found = self.variants[key] = self.engine.execution_options(**options)
        return found

    def checks_out_without_io(self) -> bool:
        """Whether a check-out may be tried without the greenlet bridge.

        Only when a connection waits in the pool (taking one is then a
        queue pop), and its check-out does no IO of its own (no pre-ping, no
        recycling age); a connection that must reconnect first makes the
        attempt fail with `NeedsBridge`, and the caller goes through the bridge.
        """
        pool = self.engine.sync_engine.pool
        return (
            self.bridged
            and isinstance(pool, QueuePool)
            and not pool._pre_ping
            and pool._recycle < 0
            and pool.checkedin() > 0
        )

    def _adopt(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serve `loop`: a gate of the pool's capacity and timeout, on that loop."""
        self.loop = loop
        pool = self.engine.sync_engine.pool
        if isinstance(pool, QueuePool) and pool._max_overflow >= 0:
            self.gate = Gate(pool.size() + pool._max_overflow, pool.timeout())


class Engines:
    """The engines of one `Database`, one per event loop, made by `make`."""

    def __init__(
        self, make: Callable[[], AsyncEngine], *, single_loop: bool = False, bridged: bool = False
    ) -> None:
        self._make = make
        self._bridged = bridged
        # An in-memory SQLite database is one connection: another loop's engine
        # would open a second, empty database, so only one loop may use it.
        self._single_loop = single_loop
        self._mutex = threading.Lock()
        self._by_loop: dict[asyncio.AbstractEventLoop, LoopEngine] = {}
        # Engines no loop uses, their pools empty.  One is made now, so code
        # outside any loop (sync tools) has an engine; loops adopt them first.
        self._free: list[LoopEngine] = [self._new()]

    def current(self) -> LoopEngine:
        """The engine of the running event loop; outside any loop, a free one."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            with self._mutex:
                if not self._free:
                    self._free.append(self._new())
                return self._free[-1]
        found = self._by_loop.get(loop)  # the hot path: one dict lookup, no lock
        if found is not None:
            return found
        with self._mutex:
            found = self._by_loop.get(loop)
            if found is None:
                if self._single_loop and self._by_loop:
                    raise ValidationError(
                        "an in-memory SQLite database lives in one connection on one event loop: "
                        "use a database file to share it with other loops and threads"
                    )
                found = self._free.pop() if self._free else self._new()
                found._adopt(loop)
                self._by_loop[loop] = found
        if found.watcher is None:
            found.watcher = self._watch(found)
            _start(found.watcher)
        return found

    def in_use(self) -> list[LoopEngine]:
        """The engines of the event loops using this database now."""
        with self._mutex:
            return list(self._by_loop.values())

    def open_writer(self) -> LoopEngine:
        """The running loop's engine, counting one more writing unit of work open on it.

        The unit of work takes one off `writers` as it closes.  A loop
        blocked until this task's work is done (`memorm.concurrency.BLOCKED`:
        a sync call made on its thread) runs none of its tasks meanwhile: if
        it has a writing unit of work open, that one holds SQLite's write
        lock, or on Postgres maybe the very rows this one would write, and
        cannot let go.  So this raises `BlockedLoopError` instead.
        """
        for caller in BLOCKED.get():
            blocked = self._by_loop.get(caller.loop)
            if blocked is not None and blocked.writers > 0:
                raise caller.refuse(
                    "has a writing unit of work of this database open, whose rows (on SQLite, "
                    "whose write lock) the call would wait for"
                )
        state = self.current()
        state.writers += 1
        return state

    async def dispose_current(self) -> None:
        """Close the running loop's connections (a later call on this loop opens new ones)."""
        found = self._by_loop.get(asyncio.get_running_loop())
        if found is not None:
            await self._close(found)

    async def dispose(self) -> None:
        """Close every connection: this loop's here, other live loops' on their loop, dead loops' by force."""
        current = asyncio.get_running_loop()
        with self._mutex:
            others = [state for loop, state in self._by_loop.items() if loop is not current]
        for state in others:
            loop = state.loop
            if loop is not None and loop.is_running() and not loop.is_closed():
                future = asyncio.run_coroutine_threadsafe(self._close(state), loop)
                try:
                    await protect(asyncio.wait_for(asyncio.wrap_future(future), _OTHER_LOOP_TIMEOUT))
                except (asyncio.TimeoutError, RuntimeError):
                    future.cancel()
            else:
                await self._abandon(state)
        await self.dispose_current()

    def _new(self) -> LoopEngine:
        state = LoopEngine(self._make(), bridged=self._bridged)
        pool = state.engine.sync_engine.pool  # dispose() replaces it; listeners carry over

        @event.listens_for(pool, "connect")
        def _opened(dbapi_connection: Any, _record: Any) -> None:
            state.drivers.append(dbapi_connection.driver_connection)
            if len(state.drivers) > 64:  # keep only those still open
                state.drivers[:] = [d for d in state.drivers if not is_closed(d)]

        return state

    async def _watch(self, state: LoopEngine) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            # The loop is shutting down (shutdown_asyncgens) or dispose_current() closed us.
            await self._close(state)

    async def _close(self, state: LoopEngine) -> None:
        with self._mutex:
            if state.loop is None or self._by_loop.get(state.loop) is not state:
                return  # already closed
            del self._by_loop[state.loop]
        watcher, state.watcher = state.watcher, None
        if watcher is not None:
            with contextlib.suppress(RuntimeError):  # we are that watcher's finally block
                await watcher.aclose()
        await protect(state.engine.dispose())
        state.loop, state.gate = None, None
        state.drivers.clear()
        with self._mutex:
            self._free.append(state)

    async def _abandon(self, state: LoopEngine) -> None:
        """Close a dead loop's connections from here: nothing can be awaited on that loop any more."""
        with self._mutex:
            if state.loop is not None and self._by_loop.get(state.loop) is state:
                del self._by_loop[state.loop]
        stopping: list[asyncio.Future[Any]] = []
        for driver in state.drivers:
            if is_closed(driver):
                continue
            with contextlib.suppress(Exception):
                if hasattr(driver, "terminate"):  # asyncpg
                    _terminate_asyncpg(driver)
                elif (stopped := driver.stop()) is not None:  # aiosqlite: its thread closes the connection
                    stopping.append(stopped)
        state.drivers.clear()  # its pool still lists the dead connections: the engine is not reused
        # aiosqlite's thread reports its stop to this loop: if the loop closed first,
        # the thread would die on "Event loop is closed", with a traceback on stderr.
        if stopping:
            with contextlib.suppress(asyncio.TimeoutError):
                waiting = asyncio.gather(*stopping, return_exceptions=True)
                await protect(asyncio.wait_for(waiting, _OTHER_LOOP_TIMEOUT))


def _terminate_asyncpg(driver: Any) -> None:
    """Terminate an asyncpg connection of a dead loop, its socket closed even if that loop is closed.

    asyncio closes an aborted transport's socket in a callback it schedules
    on the transport's loop.  A closed loop refuses it ("Event loop is
    closed", raised once the transport is marked closing), and the socket
    would stay open until the garbage collector warns "unclosed transport":
    here the transport runs that callback itself (the loop never will).
    """
    with contextlib.suppress(RuntimeError):  # "Event loop is closed"
        driver.terminate()
    loop, transport = getattr(driver, "_loop", None), getattr(driver, "_transport", None)
    if loop is not None and loop.is_closed() and getattr(transport, "_sock", None) is not None:
        with contextlib.suppress(Exception):  # the protocol's clean-up may touch the closed loop too
            transport._call_connection_lost(None)  # type: ignore[union-attr]


def _start(watcher: AsyncGenerator[None, None]) -> None:
    """Run `watcher` to its first `yield`, registering it with the running loop's asyncgen hooks."""
    step = watcher.asend(None)
    with contextlib.suppress(StopIteration):
        step.send(None)


def is_closed(driver: Any) -> bool:
    """Whether a driver connection is closed (by us, or by the server or network: asyncpg notices at once)."""
    if hasattr(driver, "is_closed"):  # asyncpg
        return bool(driver.is_closed())
    return getattr(driver, "_connection", True) is None  # aiosqlite
