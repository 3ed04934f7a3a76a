"""LangGraph's checkpointer fixtures, on memorm: a `MemormSaver` per test, on each engine."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from conftest import Store
from probes import tagged_database

from memorm.compat.langgraph import MemormSaver

from .suite import ALLOWS_OWN_TYPES, GRAPH


@pytest.fixture
def own_types(request: pytest.FixtureRequest) -> Iterator[list[type]]:
    """The state types memorm is told to load for the case, with its upstream module importable.

    memorm loads only the types LangGraph's graphs store and those a caller allows
    (`allowed_types=`).  A `StateGraph` allows its state's types itself (LangGraph's
    `with_allowlist`), so its cases get none here; a functional `entrypoint` does so
    only under `LANGGRAPH_STRICT_MSGPACK`, so the cases in `ALLOWS_OWN_TYPES` (a
    pydantic entrypoint state) allow their module's classes, as memorm's docs tell a
    user to.  The module is importable by its name while the case runs, as under
    upstream's own runner, for the loader to find the class a value names.
    """
    with GRAPH.importable(request.function) as module:
        if request.function.__name__ not in ALLOWS_OWN_TYPES:
            yield []
            return
        yield [
            value
            for value in vars(module).values()
            if isinstance(value, type) and value.__module__ == module.__name__
        ]


@pytest.fixture
async def saver(store: Store, own_types: list[type]) -> AsyncIterator[MemormSaver]:
    """A saver of a new agent on a fresh memorm database (a SQLite file or a Postgres schema)."""
    _, db = await tagged_database(store)
    try:
        async with db.unit_of_work() as uow:
            agent = await uow.agents.create("langgraph-graph-tests")
        yield MemormSaver(db, agent=agent.id, allowed_types=own_types)
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
    """Mark this folder's cases `long`: ~830 graphs on two engines take minutes (.ci/run runs them
    in a lane of their own, on SQLite, Postgres and the Citus cluster)."""
    here = Path(__file__).parent
    for item in items:
        if item.path.parent == here:
            item.add_marker(pytest.mark.long)
