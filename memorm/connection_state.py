"""What a driver connection is doing, for the unit of work and its link, on both drivers.

Whether a connection is inside a transaction (`in_transaction`), stopping a
statement on one being abandoned (`interrupt`), and the watchers told of
every statement memorm sends on the driver itself (`WATCHERS`, `sent`:
`memorm.testing.capture_statements`, benchmarks).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["WATCHERS", "Watcher", "in_transaction", "interrupt", "sent"]

Watcher = Callable[[Any, str, Sequence[Any]], None]  # (the engine's pool, SQL, parameters)
WATCHERS: list[Watcher] = []  # `memorm.testing.capture_statements`: what memorm sends on the driver


def sent(engine: AsyncEngine, sql: str, values: Sequence[Any] = ()) -> None:
    """Tell the watchers (if any: tests, benchmarks) about a statement sent on `engine`'s driver."""
    pool = engine.sync_engine.pool
    for watcher in WATCHERS:
        watcher(pool, sql, values)


def in_transaction(driver: Any) -> bool:
    """Whether a driver connection is inside a transaction (so must not go back to the pool)."""
    if hasattr(driver, "is_in_transaction"):  # asyncpg
        return bool(driver.is_in_transaction())
    return bool(driver.in_transaction)  # aiosqlite


async def interrupt(driver: Any) -> None:
    """Stop a statement still running on a connection that is being abandoned.

    aiosqlite runs statements in a thread that cancelling the task cannot
    stop; `sqlite3_interrupt` can, from any thread.  asyncpg has already
    asked the server to cancel the statement (a CancelRequest) when its task
    was cancelled.
    """
    if hasattr(driver, "interrupt"):  # aiosqlite
        await driver.interrupt()
