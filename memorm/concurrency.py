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

`Merger` runs a resource's calls a few at a time per event loop and merges
those that queue meanwhile into one run (LangGraph's store batches so).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, Generic, TypeVar

import anyio

__all__ = ["CrossLoopLock", "Merger", "protect"]

T = TypeVar("T")
C = TypeVar("C")  # a call, as `Merger` takes it
R = TypeVar("R")  # its result


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


_LEAD = object()  # what a waiting call is woken with when it is to run the next merged run


class _Waiting(Generic[C]):
    __slots__ = ("call", "future")

    def __init__(self, call: C, future: asyncio.Future[Any]) -> None:
        self.call = call
        self.future = future


class _Line(Generic[C]):
    """One event loop's calls of a `Merger`: how many run, and those waiting."""

    __slots__ = ("running", "waiting")

    def __init__(self) -> None:
        self.running = 0
        self.waiting: deque[_Waiting[C]] = deque()


class Merger(Generic[C, R]):
    """Runs calls through `work` at most `width` at a time per event loop, merging those that wait.

    A call runs at once, alone, while fewer than `width` runs are under way
    on its loop.  Otherwise it waits; when a run ends, the first waiting call
    runs the next one, taking up to `most` waiting calls with it in one
    `work(calls)` (which returns their results in order).  So a lone call
    costs what it did, and a burst of thousands becomes a few runs instead of
    thousands of waits for the pool.  Every run is awaited by a caller's own
    task; nothing runs in the background:

    * a waiting call that is cancelled leaves the line (skipped when reached);
    * a call merged into another's run that is cancelled returns at once,
      and the run goes on for the others;
    * when the caller running a merged run is cancelled, the run is
      cancelled (its unit of work rolls back) and the calls it carried wait
      on, first in line for the next run;
    * when `work` fails, every call of that run gets the error.
    """

    def __init__(self, work: Callable[[list[C]], Awaitable[Sequence[R]]], *, width: int, most: int) -> None:
        self._work = work
        self._width = width
        self._most = most
        self._lines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Line[C]] = (
            weakref.WeakKeyDictionary()
        )

    async def __call__(self, call: C) -> R:
        """`call`'s result: run at once, or merged with others waiting on this loop."""
        loop = asyncio.get_running_loop()
        line = self._lines.get(loop)
        if line is None:
            line = self._lines[loop] = _Line()
        if line.running < self._width:
            line.running += 1
            try:
                return (await self._work([call]))[0]
            finally:
                self._next(line)
        mine: _Waiting[C] = _Waiting(call, loop.create_future())
        line.waiting.append(mine)
        try:
            outcome = await mine.future
        except asyncio.CancelledError:
            # Cancelled while waiting, its future is cancelled too: the line skips it.  Woken
            # as the cancellation arrived (to run the next merged run, or with its result or
            # error): pass the run on, and leave no error unretrieved.
            woken = mine.future.done() and not mine.future.cancelled()
            if woken and mine.future.exception() is None and mine.future.result() is _LEAD:
                self._next(line)
            raise
        if outcome is not _LEAD:
            return outcome  # type: ignore[no-any-return]
        return await self._lead(line, mine)

    async def _lead(self, line: _Line[C], mine: _Waiting[C]) -> R:
        """Run `mine` and the calls waiting behind it (up to `most` in all) in one `work`."""
        group = [mine]
        while line.waiting and len(group) < self._most:
            other = line.waiting.popleft()
            if not other.future.done():
                group.append(other)
        try:
            results = await self._work([waiting.call for waiting in group])
        except asyncio.CancelledError:
            line.waiting.extendleft(reversed(group[1:]))  # they wait on, first in line
            raise
        except BaseException as error:
            for other in group[1:]:
                if not other.future.done():
                    other.future.set_exception(error)
            raise
        finally:
            self._next(line)
        for other, result in zip(group[1:], results[1:], strict=True):
            if not other.future.done():
                other.future.set_result(result)
        return results[0]

    def _next(self, line: _Line[C]) -> None:
        """A run ended: wake the first waiting call to run the next, or free its place."""
        while line.waiting:
            first = line.waiting.popleft()
            if not first.future.done():
                first.future.set_result(_LEAD)
                return
        line.running -= 1
