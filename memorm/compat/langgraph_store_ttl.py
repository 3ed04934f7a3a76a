"""`MemormStore`'s TTL sweeps: deleting an agent's expired items, now or every few minutes in the background.

`sweep_expired` deletes them in batches.  A `TTLSweeper` runs it every
`sweep_seconds`, as one task: started from sync code on memorm's sync loop
(a future, as LangGraph's `PostgresStore.start_ttl_sweeper`), or from async
code on the running loop (a task, as `AsyncPostgresStore`'s); a store has
at most one running.  A sweep that fails is logged on
`memorm.compat.langgraph_store` and the next one tried.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import uuid
from collections.abc import Awaitable, Callable, Generator, Mapping
from typing import Any, cast

import anyio

from memorm.compat._sync import BRIDGE, BlockingCallError
from memorm.concurrency import protect
from memorm.db import Database
from memorm.errors import ConflictError, MemormError
from memorm.repositories.store_items import check_minutes
from memorm.types import utcnow

__all__ = ["SweeperFuture", "TTLSweeper", "sweep_expired", "sweep_seconds"]

_SWEEP_BATCH = 1000  # expired items deleted per transaction by a sweep
_SWEEP_EVERY = 5.0  # minutes between the sweeper's sweeps, unless the TTL config or the call says

# The store's own logger: its documentation names it as where failed sweeps are logged.
_log = logging.getLogger("memorm.compat.langgraph_store")


async def sweep_expired(db: Database, agent_id: uuid.UUID) -> int:
    """Delete the agent's expired items (with their embeddings), a batch per unit of work; how many."""
    total = 0
    while True:
        async with db.unit_of_work() as uow:
            done = await uow.graph_store.sweep(agent_id, now=utcnow(), batch=_SWEEP_BATCH)
        total += done
        if done < _SWEEP_BATCH:
            return total


def sweep_seconds(ttl_config: Mapping[str, object] | None, minutes: float | None) -> float | None:
    """The sweeper's period, checked; None when the store has no TTL config (nothing to sweep).

    `minutes`: the caller's, else the config's `sweep_interval_minutes`, else 5.
    """
    checked = check_minutes(minutes, "sweep_interval_minutes")
    if ttl_config is None:
        return None
    configured = ttl_config.get("sweep_interval_minutes")
    return 60 * (checked or check_minutes(configured, "ttl.sweep_interval_minutes") or _SWEEP_EVERY)


class SweeperFuture(concurrent.futures.Future[None]):
    """The future `MemormStore.start_ttl_sweeper()` returns: done when its sweeper stops.

    Awaited, as async code awaits `AsyncPostgresStore.start_ttl_sweeper()`,
    it stops the sweeper it stands for and raises `BlockingCallError` naming
    the coroutine to call: a failed call leaves no sweeper running.
    """

    def __await__(self) -> Generator[Any, None, None]:
        self.cancel()  # cancelling the future stops its sweeper (`TTLSweeper.start`)
        raise BlockingCallError(
            "MemormStore.start_ttl_sweeper() returns a concurrent future, which cannot be awaited "
            "(the sweeper it started is stopped): await store.astart_ttl_sweeper(), or use "
            "AsyncMemormStore, whose start_ttl_sweeper() is a coroutine as AsyncPostgresStore's"
        )
        yield  # a generator: the error is raised when awaited


class _RunningSweeper:
    """A running TTL sweeper: its task (on the caller's loop or memorm's sync loop)."""

    __slots__ = ("ended", "handle", "task")

    def __init__(
        self, task: asyncio.Task[None], handle: asyncio.Task[None] | concurrent.futures.Future[None]
    ) -> None:
        self.task = task
        self.handle = handle  # what the start method returned
        self.ended = threading.Event()
        task.add_done_callback(lambda _: self.ended.set())

    def stop(self) -> None:
        """Cancel the task (a sweep under way finishes first), from any thread."""
        try:
            self.task.get_loop().call_soon_threadsafe(self.task.cancel)
        except RuntimeError:  # its loop has closed: the task is gone with it
            self.ended.set()


class TTLSweeper:
    """One store's background sweeper: started and stopped from sync or async code, one at a time.

    Args:
        label: the store as its log lines name it.
        find_agent: the agent whose expired items it deletes, found before each
            sweep (None: no agent yet, nothing to sweep).
    """

    def __init__(self, label: str, find_agent: Callable[[Database], Awaitable[uuid.UUID | None]]) -> None:
        self.label = label
        self.find_agent = find_agent
        self._running: _RunningSweeper | None = None
        self._lock = threading.Lock()

    def start(self, db: Database, seconds: float | None) -> concurrent.futures.Future[None]:
        """Sweep every `seconds` on memorm's sync loop (None: a finished future); the sweeper's future."""
        if seconds is None:
            finished = SweeperFuture()
            finished.set_result(None)
            return finished
        with self._lock:
            running = self._still_running("start_ttl_sweeper")
            if running is not None:
                return cast("concurrent.futures.Future[None]", running.handle)
            task = BRIDGE.spawn(db, lambda db: self._sweep_every(db, seconds))
            future = SweeperFuture()
            sweeper = self._running = _RunningSweeper(task, future)
        task.add_done_callback(lambda done: _settle(future, done))
        future.add_done_callback(lambda done: sweeper.stop() if done.cancelled() else None)
        return future

    async def astart(self, db: Database, seconds: float | None) -> asyncio.Task[None]:
        """Sweep every `seconds` as a task on the running loop (None: a task that does nothing); the task."""
        loop = asyncio.get_running_loop()
        if seconds is None:
            return loop.create_task(asyncio.sleep(0))
        with self._lock:
            running = self._still_running("astart_ttl_sweeper")
            if running is not None:
                return cast("asyncio.Task[None]", running.handle)
            task = loop.create_task(self._sweep_every(db, seconds), name="memorm-ttl-sweeper")
            self._running = _RunningSweeper(task, task)
        return task

    def stop(self, timeout: float | None) -> bool:
        """Stop the sweeper and wait up to `timeout` seconds (None: until it has); whether it has stopped.

        On the thread of a running event loop it asks the sweeper to stop and
        returns at once, without blocking that loop.
        """
        sweeper = self._running
        if sweeper is None:
            return True
        sweeper.stop()
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            sweeper.ended.wait(timeout)
        return self._stopped(sweeper)

    async def astop(self, timeout: float | None) -> bool:  # noqa: ASYNC109 (LangGraph's)
        """`stop` for async code: waits (up to `timeout` seconds) without blocking the loop."""
        sweeper = self._running
        if sweeper is None:
            return True
        sweeper.stop()
        if sweeper.task.get_loop() is asyncio.get_running_loop():
            await asyncio.wait({sweeper.task}, timeout=timeout)
        else:
            with anyio.move_on_after(timeout):
                await anyio.to_thread.run_sync(sweeper.ended.wait, abandon_on_cancel=True)
        return self._stopped(sweeper)

    def _still_running(self, method: str) -> _RunningSweeper | None:
        """The sweeper still running, if `method` may return it (started the same way)."""
        running = self._running
        if running is None or running.ended.is_set():
            return None
        if isinstance(running.handle, asyncio.Task) != method.startswith("a"):
            other = "astart_ttl_sweeper" if method == "start_ttl_sweeper" else "start_ttl_sweeper"
            raise ConflictError(f"a sweeper started by {other}() is running: stop it first")
        return running

    def _stopped(self, sweeper: _RunningSweeper) -> bool:
        with self._lock:
            if not sweeper.ended.is_set():
                return False
            if self._running is sweeper:
                self._running = None
            return True

    async def _sweep_every(self, db: Database, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await protect(self._sweep(db))  # stopped meanwhile: this sweep finishes first
            except MemormError as error:
                _log.warning("%s: a TTL sweep failed (the next is in %g s): %s", self.label, seconds, error)

    async def _sweep(self, db: Database) -> None:
        agent = await self.find_agent(db)
        if agent is not None:
            await sweep_expired(db, agent)


def _settle(future: concurrent.futures.Future[None], task: asyncio.Task[None]) -> None:
    """Finish the sync sweeper's future as its task ended (unless the caller cancelled it first)."""
    try:
        if task.cancelled():
            future.cancel()
        elif task.exception() is not None:
            future.set_exception(cast("BaseException", task.exception()))
        else:
            future.set_result(None)
    except concurrent.futures.InvalidStateError:  # cancelled by its caller meanwhile
        pass
