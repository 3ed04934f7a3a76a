"""Sync methods for async adapters: memorm coroutines run on a private event loop thread.

A sync method of an adapter (LangChain's `messages`, `add_texts`…) may be
called from plain sync code, from a worker thread while the caller's loop runs
elsewhere, or (blocking it) from inside a running loop.  `SyncBridge`
runs the work on one private loop in a daemon thread.

Called on a running loop's thread, the call blocks that loop until it
returns, so no task of that loop can let go of what it holds meanwhile: the
work refuses to wait for such a task (SQLite's write lock, or a writing unit
of work of that loop open on the same database, whose rows it may hold) and
raises `memorm.errors.BlockedLoopError` at once instead of hanging for ever
(`memorm.concurrency.BLOCKED`).  The `Database` is the
caller's own: it serves every event loop, and gives the private loop an
engine (a pool) of its own (`memorm.engines`), so sync calls never touch
the pool the caller's loop uses.

[`dispose_sync`][memorm.compat.langchain.dispose_sync] closes the private loop's connections of a database; a
later sync call reopens them.  At interpreter exit they are closed too.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeVar

import anyio

from memorm.concurrency import BLOCKED, BlockedCaller
from memorm.db import Database
from memorm.errors import MemormError, ValidationError

__all__ = [
    "BRIDGE",
    "Blocking",
    "BlockingCallError",
    "SyncBridge",
    "adispose_sync",
    "blocking_flag",
    "dispose_sync",
    "run_off_loop",
]

T = TypeVar("T")

_EXIT_TIMEOUT = 10.0  # seconds the exit hook waits for the private loop's connections to close


class SyncBridge:
    """Runs memorm coroutines for sync callers on a private event loop in a daemon thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._used: weakref.WeakSet[Database] = weakref.WeakSet()
        self._spawned: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()

    def run(
        self,
        db: Database,
        work: Callable[[Database], Awaitable[T]],
        *,
        call: str = "a sync memorm call",
        instead: str = "Await the async method",
    ) -> T:
        """`await work(db)` on the private loop; blocks until it is done.

        On the thread of a running event loop, work that would wait for a
        task of that loop raises `BlockedLoopError` at once, its message
        naming the sync `call` and what to do `instead`
        (`"Await MemormStore.aput()"`).
        """
        loop = self._started()
        if threading.current_thread() is self._thread:
            raise RuntimeError("a sync memorm call from memorm's own sync loop would deadlock")
        self._used.add(db)
        try:
            caller = BlockedCaller(asyncio.get_running_loop(), call, instead)
        except RuntimeError:  # no loop runs on this thread: nothing is blocked but the thread
            caller = None
        future = asyncio.run_coroutine_threadsafe(_call(db, work, caller), loop)
        try:
            return future.result()
        finally:
            future.cancel()  # a no-op once done; stops the work if the caller was interrupted

    def spawn(self, db: Database, work: Callable[[Database], Coroutine[Any, Any, T]]) -> asyncio.Task[T]:
        """Start `work(db)` as a task on the private loop, without waiting for it to finish; the task.

        The task belongs to the private loop: stop it with
        `task.get_loop().call_soon_threadsafe(task.cancel)`.  At interpreter
        exit, tasks still running are cancelled before the connections close.
        """
        loop = self._started()
        self._used.add(db)

        def create() -> asyncio.Task[T]:
            task = loop.create_task(work(db))
            self._spawned.add(task)
            return task

        if threading.current_thread() is self._thread:
            return create()

        async def created() -> asyncio.Task[T]:
            return create()

        return asyncio.run_coroutine_threadsafe(created(), loop).result()

    def dispose(self, db: Database | None = None) -> None:
        """Close the private loop's connections of `db` (of every database, if None)."""
        loop = self._loop
        if loop is None or self._closed:
            return
        if threading.current_thread() is self._thread:
            raise RuntimeError("dispose() from memorm's own sync loop would deadlock")
        asyncio.run_coroutine_threadsafe(self._dispose(db), loop).result()

    async def _dispose(self, db: Database | None) -> None:
        for each in list(self._used) if db is None else [db]:
            await each.dispose_loop()

    async def _close(self) -> None:
        """Cancel the tasks `spawn` started that still run (sweepers), then close the connections.

        Only those: the tasks a unit of work runs its connection's clean-up in
        (`memorm.concurrency.protect`) must finish, or the connection stays open.
        """
        running = [task for task in self._spawned if not task.done()]
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await self._dispose(None)

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                # The loop has stopped: waiting on it would block forever.
                raise RuntimeError("memorm's sync loop has shut down (the interpreter is exiting)")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="memorm-sync", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
                # Plain atexit is enough, and runs late enough: the interpreter first
                # waits for non-daemon threads (which may still make sync calls), then
                # runs atexit hooks while daemon threads still run.  Every thread the
                # drivers start on the private loop (aiosqlite's, one per connection)
                # is started on this daemon thread and so is a daemon too.
                atexit.register(self._shutdown)
            return self._loop

    def _shutdown(self) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._closed = True
        if loop is None or thread is None or not thread.is_alive():
            return
        # Best effort at exit: a server that already went away must not hang the interpreter.
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._close(), loop).result(timeout=_EXIT_TIMEOUT)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=_EXIT_TIMEOUT)


async def _call(db: Database, work: Callable[[Database], Awaitable[T]], caller: BlockedCaller | None) -> T:
    if caller is not None:
        BLOCKED.set((*BLOCKED.get(), caller))  # in this task's own context: nothing to reset
    return await work(db)


class BlockingCallError(MemormError, asyncio.InvalidStateError):
    """A sync method was called on a thread whose event loop is running: it would stall that loop.

    LangGraph's adapters refuse such calls, as LangGraph's own async savers
    and stores do (hence also an `asyncio.InvalidStateError`): await the
    async method instead, or call from another thread.  (It lives here, not
    in `memorm.errors`, which does not import asyncio.)
    """


class Blocking(Protocol):
    """An adapter whose sync methods refuse a running loop's thread unless `allow_blocking`."""

    db: Database
    allow_blocking: bool


def blocking_flag(allow_blocking: object) -> bool:
    """An adapter's `allow_blocking` argument, checked."""
    if not isinstance(allow_blocking, bool):
        raise ValidationError("allow_blocking: expected a bool")
    return allow_blocking


def run_off_loop(adapter: Blocking, method: str, work: Callable[[Database], Awaitable[T]]) -> T:
    """`BRIDGE.run(adapter.db, work)` for the sync `method`, from a thread that runs no event loop.

    On a running loop's thread it would block every task of that loop until
    done: it raises `BlockingCallError` there (before any statement), unless
    `adapter.allow_blocking`; even then, work that would wait for a task of
    that loop raises `BlockedLoopError` (`SyncBridge.run`).
    """
    if not adapter.allow_blocking:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            name = type(adapter).__name__
            raise BlockingCallError(
                f"{name}.{method}() on the thread of a running event loop would block that loop: "
                f"await {name}.a{method}() instead, or call {method}() from another thread"
                f"{getattr(adapter, 'blocking_hint', '')} (allow_blocking=True blocks the loop instead)"
            )
    name = type(adapter).__name__
    return BRIDGE.run(adapter.db, work, call=f"{name}.{method}()", instead=f"Await {name}.a{method}()")


BRIDGE = SyncBridge()
"""The process's one bridge: every adapter's sync methods share its loop."""


def dispose_sync(db: Database | None = None) -> None:
    """Close the connections that sync methods opened for `db` (for every database, if None).

    Call it where you dispose `db` itself; a later sync call reopens them.
    """
    BRIDGE.dispose(db)


async def adispose_sync(db: Database | None = None) -> None:
    """[`dispose_sync`][memorm.compat.langchain.dispose_sync] for async code.

    The wait runs in a worker thread.
    """
    await anyio.to_thread.run_sync(BRIDGE.dispose, db)
