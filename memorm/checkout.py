"""`Hold`: what an open unit of work holds of its database, taken in turn and given back at once.

In the order a unit of work takes them as it opens:

1. a writer's place on its event loop's engine (`LoopEngine.writers`), so a
   sync call blocking that loop raises instead of waiting for it
   (`memorm.engines`);
2. SQLite's write lock, in this process's queue of writers
   (`Backend.writer_lock`), first come first served;
3. its turn at the connection pool (`memorm.concurrency.Gate`), in arrival
   order, bounded by the pool's `pool_timeout`;
4. a live connection from the pool: those found dead at check-out are
   dropped and the next taken.

`release` gives back what it holds, whatever was taken; the connection
itself goes back through the unit of work's link first.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.util import greenlet_spawn

from memorm.backend import Backend
from memorm.concurrency import CrossLoopLock, Gate, protect
from memorm.engines import LoopEngine, NeedsBridge, is_closed
from memorm.errors import DatabaseError, PoolTimeoutError
from memorm.telemetry import connection_dead
from memorm.translate import translating

__all__ = ["Hold"]

_DEAD_IN_A_ROW = 64  # dead connections one check-out drops before it gives up (a pool's worth, and more)


class Hold:
    """One unit of work's place among writers, write lock, turn at the pool and checked-out connection."""

    __slots__ = ("gate", "pooled", "writer", "writing")

    def __init__(self) -> None:
        self.writing: LoopEngine | None = None  # counted in its `writers` while held
        self.writer: CrossLoopLock | None = None  # SQLite's write lock, held
        self.gate: Gate | None = None  # passed: the unit of work has its turn at the pool
        self.pooled: PoolProxiedConnection | None = None  # checked out, not yet given back

    async def take_write_lock(self, backend: Backend) -> None:
        """Count as a writer, and on SQLite wait for the write lock (cancellable, bounded as the pool is)."""
        # Counted from here (queued for the write lock too), so a sync call blocking
        # this loop raises instead of waiting for this unit of work (`memorm.engines`).
        self.writing = backend.engines.open_writer()
        writer = backend.writer_lock
        if writer is not None:
            try:
                # Cancellable (a cancelled waiter just leaves the queue), and bounded as the pool is.
                gate = self.writing.gate
                await writer.acquire(None if gate is None else gate.timeout, _write_lock_timeout)
            except BaseException:
                self.release()
                raise
        self.writer = writer

    def loop_engine(self, backend: Backend) -> LoopEngine:
        """The running loop's engine (a writer's was found as it was counted)."""
        return self.writing or backend.engines.current()

    async def take_connection(self, state: LoopEngine, engine: AsyncEngine) -> PoolProxiedConnection:
        """Wait for a turn at the pool, then check out a live connection (`engine`: `state`'s, optioned)."""
        gate = state.gate
        if gate is not None:
            await gate.enter(_pool_timeout)  # cancellable: a cancelled waiter just leaves the line
            self.gate = gate
        with translating():
            await self._check_out(state, engine)
        assert self.pooled is not None
        return self.pooled

    async def replace(self, state: LoopEngine, engine: AsyncEngine) -> PoolProxiedConnection:
        """A live connection in place of the one held, which died at its first trip."""
        dead, self.pooled = self.pooled, None
        connection_dead()
        if dead is not None:
            await protect(greenlet_spawn(dead.invalidate))
        with translating():
            await self._check_out(state, engine)
        assert self.pooled is not None
        return self.pooled

    async def _check_out(self, state: LoopEngine, engine: AsyncEngine) -> None:
        """Check out a live connection into `self.pooled`, dropping those that died in the pool.

        A connection waiting in the pool is taken without IO, so without the
        greenlet bridge; one that must be opened (or reopened) is opened
        through the bridge, protected from cancellation (asyncpg would
        abandon its handshake, SQLAlchemy the half-made connection).  A
        connection the server or the network closed while it waited (a
        restart, an idle timeout) is seen closed as it is taken: closed for
        good, and the next one taken, at no cost to the caller.
        """
        pool = engine.sync_engine.pool
        for _ in range(_DEAD_IN_A_ROW):
            pooled = None
            if state.checks_out_without_io():
                try:
                    pooled = pool.connect()
                except NeedsBridge:  # it must reconnect: through the bridge, below
                    pooled = None
            if pooled is None:
                await protect(self._connect(pool))
            else:
                self.pooled = pooled
            taken = self.pooled
            assert taken is not None
            if not is_closed(taken.driver_connection):
                return
            self.pooled = None
            connection_dead()
            await protect(greenlet_spawn(taken.invalidate))  # closed for good, and checked in
        raise DatabaseError("the connection to the database was lost: every connection opened was closed")

    async def _connect(self, pool: Any) -> None:
        # Kept on self at once: a cancellation delivered after this protected
        # check-out must still find the connection to return.
        self.pooled = await greenlet_spawn(pool.connect)

    def release(self) -> None:
        """Give up the turn at the pool (the connection is back), the write lock and the writer's place."""
        gate, self.gate = self.gate, None
        if gate is not None:
            gate.leave()
        writer, self.writer = self.writer, None
        writing, self.writing = self.writing, None
        if writing is not None:
            writing.writers -= 1
        if writer is not None:
            writer.release()


def _pool_timeout() -> PoolTimeoutError:
    return PoolTimeoutError(
        "no database connection became free within pool_timeout: every pooled connection is in use "
        "(more units of work at once than pool_size + max_overflow, or some held open across slow work)"
    )


def _write_lock_timeout() -> PoolTimeoutError:
    return PoolTimeoutError(
        "SQLite's write lock did not become free within pool_timeout: other units of work of this "
        "process kept it (one held open across slow work, or more writers than the file can serve)"
    )
