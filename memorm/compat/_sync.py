"""Sync methods for async adapters: memorm coroutines run on a private event loop thread.

An engine's pooled connections belong to the event loop that opened them
(asyncpg's cannot be used from another loop at all), so a sync call must never
touch the pool the caller's own loop uses.  :class:`SyncBridge` runs the work
on one private loop in a daemon thread, against a clone of the caller's
``Database`` (:meth:`Database.clone <memorm.Database.clone>`: same URL, token
counter and engine options, its own pool).  The clone is made on first sync
use and shared by every adapter over the same ``Database``.

It closes on :func:`dispose_sync`, when the source ``Database`` is
garbage-collected, and at interpreter exit.  Calls are safe from plain sync
code, from worker threads while the caller's loop runs elsewhere, and
(blocking it) from inside a running loop.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

from memorm.db import Database
from memorm.errors import ValidationError

__all__ = ["BRIDGE", "SyncBridge", "adispose_sync", "dispose_sync", "private_copy"]

T = TypeVar("T")

_EXIT_TIMEOUT = 10.0  # seconds the exit hook waits for clones to close before giving up


class SyncBridge:
    """Runs memorm coroutines for sync callers on a private event loop in a daemon thread.

    Each source ``Database`` gets one private copy, made lazily inside that
    loop (its pool is bound to it) and shared by every adapter over the same
    database: per-request adapter objects do not each open a pool.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._copies: weakref.WeakKeyDictionary[Database, Database] = weakref.WeakKeyDictionary()
        self._finalizers: dict[Database, weakref.finalize[Any, Any]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def run(self, db: Database, work: Callable[[Database], Awaitable[T]]) -> T:
        """``await work(copy_of_db)`` on the private loop; blocks until it is done."""
        loop = self._started()
        if threading.current_thread() is self._thread:
            raise RuntimeError("a sync memorm call from memorm's own sync loop would deadlock")
        future = asyncio.run_coroutine_threadsafe(self._call(db, work), loop)
        try:
            return future.result()
        finally:
            future.cancel()  # a no-op once done; stops the work if the caller was interrupted

    def dispose(self, db: Database | None = None) -> None:
        """Close the private copy of ``db`` (of every database, if None); it reopens on next use."""
        loop = self._loop
        if loop is None or self._closed:
            return
        if threading.current_thread() is self._thread:
            raise RuntimeError("dispose() from memorm's own sync loop would deadlock")
        asyncio.run_coroutine_threadsafe(self._dispose(db), loop).result()

    async def _call(self, db: Database, work: Callable[[Database], Awaitable[T]]) -> T:
        return await work(self._copy_of(db))

    def _copy_of(self, db: Database) -> Database:
        # Only ever runs on the private loop's thread, so check-then-set cannot race.
        copy = self._copies.get(db)
        if copy is None:
            copy = private_copy(db)
            self._copies[db] = copy
            finalizer = weakref.finalize(db, self._dispose_soon, copy)
            finalizer.atexit = False  # at exit, _shutdown closes every copy in order
            self._finalizers[copy] = finalizer
        return copy

    async def _dispose(self, db: Database | None) -> None:
        sources = list(self._copies) if db is None else [db]
        for source in sources:
            copy = self._copies.pop(source, None)
            if copy is not None:
                finalizer = self._finalizers.pop(copy, None)
                if finalizer is not None:
                    finalizer.detach()
                await copy.dispose()

    def _dispose_soon(self, copy: Database) -> None:
        """The source database was garbage-collected (in any thread): close its copy."""
        loop = self._loop
        self._finalizers.pop(copy, None)
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop is shutting down
                loop.call_soon_threadsafe(self._spawn_dispose, copy)

    def _spawn_dispose(self, copy: Database) -> None:
        task = asyncio.get_running_loop().create_task(copy.dispose())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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
                # copies' drivers start (aiosqlite's, one per connection) is started on
                # this daemon thread and so is a daemon too: none holds up that wait.
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
            asyncio.run_coroutine_threadsafe(self._dispose(None), loop).result(timeout=_EXIT_TIMEOUT)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=_EXIT_TIMEOUT)


def private_copy(db: Database) -> Database:
    """A new ``Database`` on the same store as ``db``, with its own pool (for another event loop)."""
    url = db.url
    if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
        # A clone would open a second, empty in-memory database.
        raise ValidationError(
            "an in-memory SQLite database lives in one connection and cannot be shared with "
            "memorm's sync loop: use a database file, or the async methods"
        )
    return db.clone()


BRIDGE = SyncBridge()
"""The process's one bridge: every adapter's sync methods share its loop and copies."""


def dispose_sync(db: Database | None = None) -> None:
    """Close the private copy of ``db`` that sync methods use (of every database, if None).

    Call it where you dispose ``db`` itself; a later sync call reopens it.
    """
    BRIDGE.dispose(db)


async def adispose_sync(db: Database | None = None) -> None:
    """:func:`dispose_sync` for async code (the wait runs in a worker thread)."""
    await anyio.to_thread.run_sync(BRIDGE.dispose, db)
