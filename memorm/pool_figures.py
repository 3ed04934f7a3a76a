"""The connection pools of one database in figures: what health probes and metrics report."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.pool import QueuePool

from memorm.engines import Engines

__all__ = ["PoolFigures", "pool_figures"]


@dataclass(frozen=True)
class PoolFigures:
    """The connection pools of one `Database`, summed over the event loops that use it.

    Attributes:
        loops: event loops with a pool of their own (one per loop that used the database).
        size: connections the pools keep open when idle (`pool_size`, per loop).
        limit: the most connections the pools may open at once (`pool_size + max_overflow`);
            None when one pool has no bound (`max_overflow=-1`) or is not a queue pool.
        in_use: connections checked out by units of work now.
        idle: connections open and waiting in the pools.
        waiting: units of work waiting for their turn at a pool.
    """

    loops: int
    size: int
    limit: int | None
    in_use: int
    idle: int
    waiting: int


def pool_figures(engines: Engines) -> PoolFigures:
    """The figures of a database's pools (`engines`), one per event loop that uses it."""
    loops = size = in_use = idle = waiting = 0
    limit: int | None = 0
    for state in engines.in_use():
        loops += 1
        pool = state.engine.sync_engine.pool
        if state.gate is not None:
            waiting += state.gate.waiting
        if not isinstance(pool, QueuePool):  # an in-memory SQLite database: one static connection
            limit = None
            continue
        size += pool.size()
        in_use += pool.checkedout()
        idle += pool.checkedin()
        overflow = pool._max_overflow  # SQLAlchemy keeps it private; -1: no bound
        limit = None if limit is None or overflow < 0 else limit + pool.size() + overflow
    return PoolFigures(loops, size, limit, in_use, idle, waiting)
