"""Cancellation and locking that hold across event loops and threads.

A server cancels work in three ways (`asyncio.wait_for` and
`asyncio.timeout`, `task.cancel()`, anyio cancel scopes) and calls memorm
from more than one event loop (`asyncio.run` in worker threads, as
FastAPI's `def` endpoints and `Runner.run_sync` do).  Two primitives make
the rest of memorm indifferent to both:

* `protect` runs an awaitable to its end whatever cancellation arrives
  meanwhile, then delivers the cancellation.  The unit of work opens and
  closes its connection under it, so a connection is never abandoned halfway
  through a checkout, a `BEGIN` or a `ROLLBACK`.
* `CrossLoopLock` is a first-come-first-served lock that tasks of any
  loop in any thread can wait on (`asyncio.Lock` and `anyio.Lock` belong
  to one loop: a waiter from another is never woken).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Awaitable
from types import TracebackType
from typing import TypeVar

import anyio

__all__ = ["CrossLoopLock", "protect"]

T = TypeVar("T")


async def protect(awaitable: Awaitable[T]) -> T:
    """Await `awaitable` to completion even if the caller is cancelled meanwhile.

    The work runs in a task of its own, which no cancellation of the caller
    reaches (neither anyio's, held off by a shielded scope, nor asyncio's,
    held off by `asyncio.shield`).  When the caller was cancelled
    meanwhile, the cancellation is raised once the work is done, even if the
    work failed (the failure is its `__cause__`); an anyio cancellation is
    delivered at the caller's next checkpoint, as usual.
    """
    task = asyncio.ensure_future(awaitable)
    cancelled: asyncio.CancelledError | None = None
    failure: BaseException | None = None
    with anyio.CancelScope(shield=True):
        while True:
            try:
                result = await asyncio.shield(task)
                break
            except asyncio.CancelledError as error:
                if task.done():  # the work itself was cancelled (the loop is shutting down)
                    raise
                cancelled = error  # keep waiting: the work must not be abandoned halfway
            except BaseException as error:
                if cancelled is None:
                    raise
                failure = error
                break
    if cancelled is not None:
        # Cancellation must propagate, even past a failure of the work (kept as its cause):
        # a caller that asked to stop gets CancelledError, as asyncio's machinery expects.
        if failure is not None:
            raise cancelled from failure
        raise cancelled
    return result


class CrossLoopLock:
    """A fair (FIFO) lock for tasks on any event loop, in any thread.

    The state sits behind a `threading.Lock` held only for a few
    instructions; waiters wait on a future of their own loop, which
    `release` completes through that loop's `call_soon_threadsafe`.
    Ownership passes straight to the next waiter, so a newcomer cannot barge
    ahead of a waiter that is being woken.  Use it as `async with lock:`.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._locked = False
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()

    def locked(self) -> bool:
        """Whether some task holds the lock."""
        return self._locked

    def waiting(self) -> int:
        """How many tasks wait for the lock."""
        return len(self._waiters)

    async def acquire(self) -> None:
        """Wait for the lock (cancellable: a cancelled waiter leaves the queue)."""
        loop = asyncio.get_running_loop()
        with self._mutex:
            if not self._locked:
                self._locked = True
                return
            future: asyncio.Future[None] = loop.create_future()
            waiter = (loop, future)
            self._waiters.append(waiter)
        try:
            await future
        except BaseException:
            with self._mutex:
                queued = waiter in self._waiters
                if queued:
                    self._waiters.remove(waiter)
            if not queued and future.done() and not future.cancelled():
                self.release()  # handed the lock as the cancellation arrived: pass it on
            # (a handover still on its way finds the future cancelled and passes it on)
            raise

    def release(self) -> None:
        """Release the lock, handing it to the longest waiter if there is one."""
        with self._mutex:
            while self._waiters:
                loop, future = self._waiters.popleft()
                try:
                    loop.call_soon_threadsafe(self._hand_over, future)
                    return
                except RuntimeError:  # that waiter's loop is closed: it will never run
                    continue
            self._locked = False

    def _hand_over(self, future: asyncio.Future[None]) -> None:
        # Runs on the waiter's own loop.
        if future.cancelled():
            self.release()  # the waiter gave up before it could take the lock
        else:
            future.set_result(None)

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
