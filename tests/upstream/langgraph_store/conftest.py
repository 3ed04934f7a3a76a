"""The construction of LangGraph's store tests, on memorm: a `MemormStore` per test, on each engine."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from conftest import Store
from probes import tagged_database

from memorm.compat.langgraph import AsyncMemormStore, MemormStore

from .kit import CURRENT


@pytest.fixture
async def store(
    store: Store, request: pytest.FixtureRequest, anyio_backend: str
) -> AsyncIterator[MemormStore]:
    """LangGraph's `store` fixture: a store with the module's TTL (6 seconds) on a fresh memorm database.

    (The `store` it takes is memorm's own suite's: a SQLite file or a Postgres schema.)  As
    upstream's, its TTL sweeper runs every 3 seconds while the case runs: on memorm's sync
    loop for the sync suite (whose cases run while this loop waits), on this loop for the async one.
    """
    _, db = await tagged_database(store)
    try:
        async with db.unit_of_work() as uow:
            agent = await uow.agents.create("langgraph-store-tests")
        upstream = request.function.__globals__  # the upstream module's namespace
        ttl_minutes = upstream.get("TTL_SECONDS", 6) / 60
        ttl = {"default_ttl": ttl_minutes, "refresh_on_read": True, "sweep_interval_minutes": ttl_minutes / 2}
        kind = AsyncMemormStore if upstream["__name__"] == "tests.test_async_store" else MemormStore
        CURRENT.update(db=db, agent=agent.id, kind=kind)
        made = kind(db, agent=agent.id, ttl=ttl)
        if kind is MemormStore:
            made.start_ttl_sweeper()
        else:
            await made.astart_ttl_sweeper()
        try:
            yield made
        finally:
            assert await made.astop_ttl_sweeper(timeout=10)
    finally:
        CURRENT.clear()
        await db.dispose()


@pytest.fixture(autouse=True)
def _memorm_store(store: MemormStore) -> None:
    """Every case runs on both engines, with a database for the stores it makes itself."""
