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

`Gate` lets a pool's worth of tasks of one event loop through at a time,
strictly in arrival order, with a bounded wait (the unit of work's way to
its connection).

`Merger` runs a resource's calls a few at a time per event loop and merges
those that queue meanwhile into one run (LangGraph's store batches so).

`BLOCKED` names the threads (and so the event loops) blocked until the
current task's work is done: memorm's sync bridge sets it.  Work that would
wait for a task of such a loop (a `CrossLoopLock` it holds or queues for, a
writing unit of work it has open: `memorm.engines`) raises
`BlockedLoopError` instead of hanging for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeVar

import anyio

from memorm.errors import BlockedLoopError

__all__ = ["BLOCKED", "BlockedCaller", "CrossLoopLock", "Gate", "Merger", "protect"]

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


@dataclass(frozen=True)
class BlockedCaller:
    """A thread blocked in a sync call until a task of another loop has done the call's work.

    Attributes:
        loop: the event loop that thread runs: none of its tasks runs until the call returns.
        call: the sync call, as error messages name it (`"MemormStore.put()"`).
        instead: what to do instead, as error messages say it (`"Await MemormStore.aput()"`).
    """

    loop: asyncio.AbstractEventLoop
    call: str
    instead: str

    def refuse(self, holding: str) -> BlockedLoopError:
        """The error for work that would wait for what a task of the blocked loop is `holding`."""
        return BlockedLoopError(
            f"{self.call} would wait for ever: it blocks the event loop it was called on, and a task "
            f"of that loop {holding}. {self.instead} instead, or call it from a thread that runs "
            "no event loop"
        )


BLOCKED: contextvars.ContextVar[tuple[BlockedCaller, ...]] = contextvars.ContextVar(
    "memorm_blocked", default=()
)
"""The callers blocked until the current task's work is done (memorm's sync bridge sets it)."""


class CrossLoopLock:
    """A fair (FIFO) lock for tasks on any event loop, in any thread.

    The state sits behind a `threading.Lock` held only for a few
    instructions; waiters wait on a future of their own loop, which
    `release` completes through that loop's `call_soon_threadsafe`.
    Ownership passes straight to the next waiter, so a newcomer cannot barge
    ahead of a waiter that is being woken.  Use it as `async with lock:`.

    A task that would wait behind a task of a loop in `BLOCKED` (the holder,
    or a waiter ahead) raises `BlockedLoopError` instead, naming the lock
    by its `name`: that loop runs nothing until the task is done.
    """

    def __init__(self, name: str = "a memorm lock") -> None:
        self.name = name
        self._mutex = threading.Lock()
        self._locked = False
        # The holder's loop (or the loop of the waiter it is being handed to): see BLOCKED.
        self._holder: asyncio.AbstractEventLoop | None = None
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()

    def locked(self) -> bool:
        """Whether some task holds the lock."""
        return self._locked

    def waiting(self) -> int:
        """How many tasks wait for the lock."""
        return len(self._waiters)

    async def acquire(
        self, give_up_after: float | None = None, expired: Callable[[], BaseException] | None = None
    ) -> None:
        """Wait for the lock (cancellable: a cancelled waiter leaves the queue).

        With `give_up_after`, a waiter that waited that many seconds leaves the queue
        raising `expired()` (a `TimeoutError` without it).
        """
        loop = asyncio.get_running_loop()
        with self._mutex:
            if not self._locked:
                self._locked = True
                self._holder = loop
                return
            for caller in BLOCKED.get():
                if self._holder is caller.loop or any(other is caller.loop for other, _ in self._waiters):
                    raise caller.refuse(f"holds or waits for {self.name}, which the call needs")
            future: asyncio.Future[None] = loop.create_future()
            waiter = (loop, future)
            self._waiters.append(waiter)
        timer = (
            None
            if give_up_after is None
            else loop.call_later(give_up_after, _expire, future, expired or TimeoutError)
        )
        try:
            await future
        except BaseException:
            with self._mutex:
                queued = waiter in self._waiters
                if queued:
                    self._waiters.remove(waiter)
            handed = future.done() and not future.cancelled() and future.exception() is None
            if not queued and handed:
                self.release()  # handed the lock as the cancellation arrived: pass it on
            # (a handover still on its way finds the future done and passes it on)
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def release(self) -> None:
        """Release the lock, handing it to the longest waiter if there is one."""
        with self._mutex:
            while self._waiters:
                loop, future = self._waiters.popleft()
                try:
                    loop.call_soon_threadsafe(self._hand_over, future)
                    self._holder = loop
                    return
                except RuntimeError:  # that waiter's loop is closed: it will never run
                    continue
            self._locked = False
            self._holder = None

    def _hand_over(self, future: asyncio.Future[None]) -> None:
        # Runs on the waiter's own loop.
        if future.done():
            self.release()  # the waiter gave up (cancelled, or its wait expired) before it could take it
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


class Gate:
    """At most `capacity` holders at a time, admitted in arrival order (one event loop's tasks).

    A pool hands a returned connection to whichever task asks next, and the
    task that returned it asks again at once, before a waiting task wakes:
    with more tasks than connections, a few tasks take nearly every turn
    (Jain's fairness index 0.07 with 256 sessions on 16 connections).  Here
    a holder that leaves hands its place straight to the longest waiter, so
    nobody can overtake a waiter that is being woken, and a task waits at
    most `timeout` seconds before `expired()` is raised (None: no bound).

    `enter` without a wait is a counter decrement, nothing more.
    """

    __slots__ = ("_free", "_waiters", "timeout")

    def __init__(self, capacity: int, timeout: float | None) -> None:
        self._free = capacity
        self._waiters: deque[asyncio.Future[None]] = deque()
        self.timeout = timeout

    @property
    def waiting(self) -> int:
        """How many tasks wait to enter."""
        return len(self._waiters)

    async def enter(self, expired: Callable[[], BaseException]) -> None:
        """Wait for a place; raise `expired()` after `timeout` seconds (cancellable: leaves the line)."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._waiters.append(future)
        timer = None if self.timeout is None else loop.call_later(self.timeout, _expire, future, expired)
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled() and future.exception() is None:
                self.leave()  # handed a place as the cancellation arrived: pass it on
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(future)
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def leave(self) -> None:
        """Give the place back: to the longest waiter if there is one."""
        waiters = self._waiters
        while waiters:
            future = waiters.popleft()
            if not future.done():
                future.set_result(None)
                return
        self._free += 1


def _expire(future: asyncio.Future[Any], expired: Callable[[], BaseException]) -> None:
    if not future.done():
        future.set_exception(expired())


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
        # A call that blocks another loop's thread (BLOCKED) never waits in line: the runs
        # ahead may be waiting for that loop, which waits for this call.
        if line.running < self._width or BLOCKED.get():
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
