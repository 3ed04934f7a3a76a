"""LangGraph's checkpointer fixtures, on memorm: a `MemormSaver` per test, on each engine."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from conftest import Store
from probes import tagged_database

from memorm.compat.langgraph import MemormSaver


@pytest.fixture
async def saver(store: Store) -> AsyncIterator[MemormSaver]:
    """A saver of a new agent on a fresh memorm database (a SQLite file or a Postgres schema)."""
    _, db = await tagged_database(store)
    try:
        async with db.unit_of_work() as uow:
            agent = await uow.agents.create("langgraph-graph-tests")
        yield MemormSaver(db, agent=agent.id)
    finally:
        await db.dispose()


@pytest.fixture
def sync_checkpointer(saver: MemormSaver) -> MemormSaver:
    """LangGraph's `sync_checkpointer`: the cases call `graph.invoke`, which runs on memorm's sync loop."""
    return saver


@pytest.fixture
def async_checkpointer(saver: MemormSaver) -> MemormSaver:
    """LangGraph's `async_checkpointer`: the cases await `graph.ainvoke` on the test's loop."""
    return saver


@pytest.fixture(params=["sync", "async", "exit"])
def durability(request: pytest.FixtureRequest) -> str:
    """LangGraph's `durability` fixture: when a graph's checkpoints are written (each one's own run)."""
    return str(request.param)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark this folder's cases `long`: ~490 graphs on two engines take minutes (.ci/run runs them
    in a lane of their own, on SQLite, Postgres and the Citus cluster)."""
    here = Path(__file__).parent
    for item in items:
        if item.path.parent == here:
            item.add_marker(pytest.mark.long)
