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
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import QueuePool

from memorm.concurrency import protect
from memorm.errors import ValidationError

__all__ = ["Engines", "LoopEngine"]

_OTHER_LOOP_TIMEOUT = 10.0  # seconds dispose() waits for another running loop to close its pool


@dataclass(eq=False)
class LoopEngine:
    """An engine, and what memorm tracks of it while one event loop uses it."""

    engine: AsyncEngine
    loop: asyncio.AbstractEventLoop | None = None
    watcher: AsyncGenerator[None, None] | None = None
    # Driver connections it opened, to close by force if its loop dies unseen.
    drivers: list[Any] = field(default_factory=list)
    # Pooled connections that were invalidated and reconnect at their next check-out.
    stale: int = 0
    variants: dict[Any, AsyncEngine] = field(default_factory=dict)

    def with_options(self, key: Any, options: dict[str, Any]) -> AsyncEngine:
        """This engine with execution `options` (made once per `key`; it shares the pool)."""
        found = self.variants.get(key)
        if found is None:
            found = self.variants[key] = self.engine.execution_options(**options)
        return found

    def checkout_may_connect(self) -> bool:
        """Whether a check-out may open a connection (network or thread IO), not just hand one over.

        A check-out that opens a connection must not be cut short by a
        cancellation (asyncpg would abandon its handshake; SQLAlchemy would
        drop the half-made connection unclosed), so callers protect it.  One
        that only waits for a connection to come back must stay cancellable.
        """
        pool = self.engine.sync_engine.pool
        if not isinstance(pool, QueuePool):
            return True
        if self.stale or pool._pre_ping or pool._recycle >= 0:
            return True
        if pool.checkedin():
            return False
        return pool._max_overflow < 0 or pool.overflow() < pool._max_overflow


class Engines:
    """The engines of one `Database`, one per event loop, made by `make`."""

    def __init__(self, make: Callable[[], AsyncEngine], *, single_loop: bool = False) -> None:
        self._make = make
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
                found.loop = loop
                self._by_loop[loop] = found
        if found.watcher is None:
            found.watcher = self._watch(found)
            _start(found.watcher)
        return found

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
        state = LoopEngine(self._make())
        pool = state.engine.sync_engine.pool  # dispose() replaces it; listeners carry over

        @event.listens_for(pool, "connect")
        def _opened(dbapi_connection: Any, _record: Any) -> None:
            state.stale = max(0, state.stale - 1)
            state.drivers.append(dbapi_connection.driver_connection)
            if len(state.drivers) > 64:  # keep only those still open
                state.drivers[:] = [d for d in state.drivers if not _is_closed(d)]

        @event.listens_for(pool, "invalidate")
        def _invalidated(_dbapi_connection: Any, _record: Any, _exception: Any) -> None:
            # One connection, or (after a disconnect) every connection of its
            # generation, reconnects at its next check-out.
            now = state.engine.sync_engine.pool
            state.stale = max(1, now.checkedin() + now.checkedout()) if isinstance(now, QueuePool) else 1

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
        state.loop, state.stale = None, 0
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
            if _is_closed(driver):
                continue
            with contextlib.suppress(Exception):
                if hasattr(driver, "terminate"):  # asyncpg
                    driver.terminate()
                elif (stopped := driver.stop()) is not None:  # aiosqlite: its thread closes the connection
                    stopping.append(stopped)
        state.drivers.clear()  # its pool still lists the dead connections: the engine is not reused
        # aiosqlite's thread reports its stop to this loop: if the loop closed first,
        # the thread would die on "Event loop is closed", with a traceback on stderr.
        if stopping:
            with contextlib.suppress(asyncio.TimeoutError):
                waiting = asyncio.gather(*stopping, return_exceptions=True)
                await protect(asyncio.wait_for(waiting, _OTHER_LOOP_TIMEOUT))


def _start(watcher: AsyncGenerator[None, None]) -> None:
    """Run `watcher` to its first `yield`, registering it with the running loop's asyncgen hooks."""
    step = watcher.asend(None)
    with contextlib.suppress(StopIteration):
        step.send(None)


def _is_closed(driver: Any) -> bool:
    if hasattr(driver, "is_closed"):  # asyncpg
        return bool(driver.is_closed())
    return getattr(driver, "_connection", True) is None  # aiosqlite
