"""LangGraph's checkpointer fixtures, on memorm: a `MemormSaver` per test, on each engine."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ENGINES, Store
from langgraph._internal import _serde as langgraph_serde
from langgraph.cache.base import BaseCache
from langgraph.cache.memory import InMemoryCache
from langgraph.cache.sqlite import SqliteCache
from probes import tagged_database
from pytest_mock import MockerFixture
from syrupy.assertion import SnapshotAssertion
from syrupy.extensions.amber import AmberSnapshotExtension
from syrupy.location import PyTestLocation
from syrupy.types import SnapshotIndex

from memorm import Database
from memorm.compat.langgraph import AsyncMemormStore, MemormSaver, MemormStore

from .suite import GRAPH, STRICT_MODE


@pytest.fixture
def upstream_module(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The case's upstream module importable by its name, and LangGraph's strict mode where named.

    As under upstream's runner, the sdist's modules are importable while the case runs
    (as `tests.<module>`), for the serializer to find a class a stored value names.  memorm
    loads only the types LangGraph's graphs store and those it is given: the cases in
    `STRICT_MODE`, whose state holds types of their own (pydantic models, dataclasses,
    LangChain's agent actions), compile their graphs as under LangGraph's strict mode
    (`LANGGRAPH_STRICT_MSGPACK=true`), which hands the saver the types the state schema
    names (`with_allowlist`): the way memorm's docs tell a user to, besides `allowed_types=`.
    """
    if request.function.__name__ in STRICT_MODE:
        monkeypatch.setattr(langgraph_serde, "STRICT_MSGPACK_ENABLED", True)
    with GRAPH.importable():
        yield


@pytest.fixture
async def graph_database(store: Store) -> AsyncIterator[tuple[Database, uuid.UUID]]:
    """A fresh memorm database (a SQLite file or a Postgres schema) and an agent for the graphs."""
    _, db = await tagged_database(store)
    try:
        async with db.unit_of_work() as uow:
            agent = await uow.agents.create("langgraph-graph-tests")
        yield db, agent.id
    finally:
        await db.dispose()


@pytest.fixture
def saver(graph_database: tuple[Database, uuid.UUID], upstream_module: None) -> MemormSaver:
    """A saver of the case's agent on its fresh memorm database."""
    db, agent = graph_database
    return MemormSaver(db, agent=agent)


@pytest.fixture
def sync_store(graph_database: tuple[Database, uuid.UUID]) -> MemormStore:
    """LangGraph's `sync_store`: a `MemormStore` of the case's agent, beside its checkpointer."""
    db, agent = graph_database
    return MemormStore(db, agent=agent)


@pytest.fixture
def async_store(graph_database: tuple[Database, uuid.UUID]) -> AsyncMemormStore:
    """LangGraph's `async_store`: an `AsyncMemormStore` of the case's agent, beside its checkpointer."""
    db, agent = graph_database
    return AsyncMemormStore(db, agent=agent)


@pytest.fixture(params=["memory", "sqlite"])
def cache(request: pytest.FixtureRequest) -> BaseCache[Any]:
    """LangGraph's `cache` fixture without Redis: its in-memory and SQLite node caches (not memorm's)."""
    return InMemoryCache() if request.param == "memory" else SqliteCache(path=":memory:")


@pytest.fixture
def deterministic_uuids(mocker: MockerFixture, graph_database: tuple[Database, uuid.UUID]) -> Any:
    """LangGraph's `deterministic_uuids`: `uuid.uuid4` returns 00000000-0000-4000-8000-000000000000, …1, …

    Patched once the case's database is made (which names its connections with a uuid4),
    as upstream's checkpointers take none of the case's ids.
    """
    made = (uuid.UUID(f"00000000-0000-4000-8000-{i:012}", version=4) for i in range(10000))
    return mocker.patch("uuid.uuid4", side_effect=made)


class _UpstreamSnapshots(AmberSnapshotExtension):
    """The sdist's own syrupy snapshots, read where the plugin unpacked them.

    Upstream's names carry its checkpointer's id (`[memory]`, `[memory-False]`) where a
    case takes one, and none where it does not; here the case's id carries memorm's engine
    in that place, so it is read as upstream's in-memory saver's name (the snapshots are of
    graphs and schemas, the same whatever saves them).
    """

    @classmethod
    def dirname(cls, *, test_location: PyTestLocation) -> str:
        return str(GRAPH.sdist.folder / "tests" / "__snapshots__")

    @classmethod
    def get_snapshot_name(cls, *, test_location: PyTestLocation, index: SnapshotIndex = 0) -> str:
        name = super().get_snapshot_name(test_location=test_location, index=index)
        saves = bool({"sync_checkpointer", "async_checkpointer"} & set(test_location.item.fixturenames))
        for engine in ENGINES:
            name = name.replace(f"[{engine}-", "[memory-" if saves else "[")
            name = name.replace(f"[{engine}]", "[memory]" if saves else "")
        return name


@pytest.fixture
def snapshot(snapshot: SnapshotAssertion) -> SnapshotAssertion:
    """syrupy's `snapshot`, on the sdist's snapshot files."""
    return snapshot.use_extension(_UpstreamSnapshots)


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
