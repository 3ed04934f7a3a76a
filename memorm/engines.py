"""One engine (one connection pool) per event loop, for one ``Database``.

A pooled connection belongs to the event loop that opened it: asyncpg's
transport and SQLAlchemy's pool queue are bound to that loop, and using them
from another one fails ("attached to a different loop", "another operation is
in progress") or worse.  Yet a server calls memorm from several loops: its own,
and the short-lived ones that ``asyncio.run`` starts in worker threads
(FastAPI's ``def`` endpoints, the Agents SDK's ``Runner.run_sync``).  So each
loop that uses a ``Database`` gets an engine of its own, made on first use.

When a loop shuts down (``asyncio.run``, ``asyncio.Runner``, anyio and most
servers end with ``loop.shutdown_asyncgens()``), its engine is disposed on
that loop: a watcher, an async generator started on the loop, closes it from
its ``finally`` block.  A loop that ends without that step leaves its engine
to :meth:`Engines.dispose`.
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

from memorm.concurrency import protect
from memorm.errors import ValidationError

__all__ = ["Engines", "LoopEngine"]

_OTHER_LOOP_TIMEOUT = 10.0  # seconds dispose() waits for another running loop to close its engine


@dataclass(eq=False)
class LoopEngine:
    """The engine one event loop uses, and the watcher that disposes it with the loop."""

    engine: AsyncEngine
    loop: asyncio.AbstractEventLoop | None
    watcher: AsyncGenerator[None, None] | None = None
    closed: bool = False
    # Driver connections opened by this engine, to close by force if the loop dies unseen.
    drivers: list[Any] = field(default_factory=list)


class Engines:
    """The engines of one ``Database``, one per event loop, made by ``make``."""

    def __init__(self, make: Callable[[], AsyncEngine], *, single_loop: bool = False) -> None:
        self._make = make
        # An in-memory SQLite database is one connection: another loop's engine
        # would open a second, empty database, so only one loop may use it.
        self._single_loop = single_loop
        self._mutex = threading.Lock()
        self._by_loop: dict[asyncio.AbstractEventLoop, LoopEngine] = {}
        # Made now, so code outside any loop (dialect checks, sync tools) has an
        # engine; the first loop to need one adopts it.
        self._spare: LoopEngine | None = self._new(None)

    def current(self) -> LoopEngine:
        """The engine of the running event loop (made on first use); outside any loop, a spare one."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            with self._mutex:
                if self._spare is None:
                    self._spare = self._new(None)
                return self._spare
        found = self._by_loop.get(loop)  # the hot path: one dict lookup, no lock
        if found is not None:
            return found
        with self._mutex:
            found = self._by_loop.get(loop)
            if found is None and self._single_loop and self._by_loop:
                raise ValidationError(
                    "an in-memory SQLite database lives in one connection on one event loop: "
                    "use a database file to share it with other loops and threads"
                )
            if found is None:
                found, self._spare = self._spare or self._new(loop), None
                found.loop = loop
                self._by_loop[loop] = found
        if found.watcher is None:
            found.watcher = self._watch(found)
            _start(found.watcher)
        return found

    async def dispose_current(self) -> None:
        """Close the running loop's engine (a later call on this loop makes a new one)."""
        loop = asyncio.get_running_loop()
        found = self._by_loop.get(loop)
        if found is not None:
            await self._close(found)

    async def dispose(self) -> None:
        """Close every engine: this loop's here, other running loops' on their loop, dead loops' by force."""
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
        with self._mutex:
            spare, self._spare = self._spare, None
        if spare is not None:
            await protect(spare.engine.dispose())

    def _new(self, loop: asyncio.AbstractEventLoop | None) -> LoopEngine:
        state = LoopEngine(self._make(), loop)

        @event.listens_for(state.engine.sync_engine, "connect")
        def _opened(dbapi_connection: Any, _record: Any) -> None:
            state.drivers.append(dbapi_connection.driver_connection)
            if len(state.drivers) > 64:  # keep only those still open
                state.drivers[:] = [d for d in state.drivers if not _is_closed(d)]

        return state

    async def _watch(self, state: LoopEngine) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            # The loop is shutting down (shutdown_asyncgens) or dispose_current() closed us.
            await self._close(state)

    async def _close(self, state: LoopEngine) -> None:
        if state.closed:
            return
        state.closed = True
        with self._mutex:
            if state.loop is not None and self._by_loop.get(state.loop) is state:
                del self._by_loop[state.loop]
        watcher, state.watcher = state.watcher, None
        if watcher is not None:
            with contextlib.suppress(RuntimeError):  # we are that watcher's finally block
                await watcher.aclose()
        await protect(state.engine.dispose())

    async def _abandon(self, state: LoopEngine) -> None:
        """Close a dead loop's connections without it: nothing can be awaited there any more."""
        state.closed = True
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
        state.drivers.clear()
        # aiosqlite's thread reports its stop to this loop: if the loop closed first,
        # the thread would die on "Event loop is closed", with a traceback on stderr.
        if stopping:
            with contextlib.suppress(asyncio.TimeoutError):
                waiting = asyncio.gather(*stopping, return_exceptions=True)
                await protect(asyncio.wait_for(waiting, _OTHER_LOOP_TIMEOUT))


def _start(watcher: AsyncGenerator[None, None]) -> None:
    """Run ``watcher`` to its first ``yield``, registering it with the running loop's asyncgen hooks."""
    step = watcher.asend(None)
    with contextlib.suppress(StopIteration):
        step.send(None)


def _is_closed(driver: Any) -> bool:
    if hasattr(driver, "is_closed"):  # asyncpg
        return bool(driver.is_closed())
    return getattr(driver, "_connection", True) is None  # aiosqlite
