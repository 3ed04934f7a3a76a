"""The SQLite vector cache never serves stale vectors, and big searches leave the event loop free.

SQLite searches an in-process numpy matrix per (agent, model), reloaded when
the agent's ``archive_version`` moves.  Writes through another ``Database`` on
the same file (another process, in production) must be seen by the next search.
Postgres has no matrix cache; the same tests pin that it behaves alike.  Both
engines cache agents' embedding models on the ``Database``: a model another
process replaced or dropped must never yield wrong rows.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import AsyncIterator

import anyio
import numpy as np
import pytest
import sqlalchemy as sa
from conftest import Store

from memorm import Agent, Database, NotFoundError
from memorm.models import EMBEDDING_MODELS
from memorm.search import vector_scan as vector_search

pytestmark = pytest.mark.anyio

QUERY = [1.0, 0.0, 0.0]


@pytest.fixture
async def other(store: Store, db: Database) -> AsyncIterator[Database]:
    """A second Database on the same store: its own engine, pool and vector cache."""
    database = store.database()
    try:
        yield database
    finally:
        await database.dispose()


async def _agent_with_passages(db: Database) -> tuple[Agent, list[uuid.UUID]]:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("sam")
        added = await uow.passages.add_many(
            agent.id,
            [{"text": f"p{i}", "embedding": [0.5, 1.0, float(i)], "meta": {"i": i}} for i in range(5)],
        )
    return agent, [p.id for p in added]


async def _nearest(db: Database, agent: Agent, k: int = 10) -> list[tuple[uuid.UUID, float]]:
    async with db.unit_of_work(read_only=True) as uow:
        hits = await uow.passages.search(agent.id, QUERY, k=k, metric="l2")
    return [(hit.passage.id, round(hit.distance or 0.0, 6)) for hit in hits]


@pytest.mark.parametrize("write", ["add", "update_text", "delete", "delete_where"])
async def test_search_sees_writes_made_through_another_database(
    db: Database, other: Database, write: str
) -> None:
    agent, ids = await _agent_with_passages(db)
    before = await _nearest(db, agent)  # loads (and caches) the matrix
    assert await _nearest(db, agent) == before
    async with other.unit_of_work() as uow:
        if write == "add":
            new = await uow.passages.add(agent.id, "new", QUERY)
            expected = [(new.id, 0.0), *before]
        elif write == "update_text":
            await uow.passages.update_text(ids[0], "moved", QUERY)
            expected = [(ids[0], 0.0), *(pair for pair in before if pair[0] != ids[0])]
        elif write == "delete":
            await uow.passages.delete(ids[0])
            expected = [pair for pair in before if pair[0] != ids[0]]
        else:
            assert await uow.passages.delete_where(agent.id, {"i": {"$in": [1, 3]}}) == 2
            expected = [pair for pair in before if pair[0] not in (ids[1], ids[3])]
    # k = exactly what is left: a stale matrix would spend a slot on a deleted passage.
    assert await _nearest(db, agent, k=len(expected)) == expected


async def test_search_after_the_agent_is_deleted_elsewhere_raises_not_found(
    db: Database, other: Database
) -> None:
    agent, _ = await _agent_with_passages(db)
    assert len(await _nearest(db, agent)) == 5
    async with other.unit_of_work() as uow:
        await uow.agents.delete(agent.id)
    with pytest.raises(NotFoundError):
        await _nearest(db, agent)
    async with db.unit_of_work(read_only=True) as uow:
        with pytest.raises(NotFoundError):
            await uow.passages.search(agent.id, QUERY, where={"i": 1})


async def test_a_search_in_a_rolled_back_unit_of_work_does_not_poison_later_searches(db: Database) -> None:
    # The rolled-back unit of work bumped the archive version, then the committed write
    # reuses that number: a matrix cached from the uncommitted rows would look current.
    agent, _ = await _agent_with_passages(db)

    async def add_search_and_fail() -> None:
        async with db.unit_of_work() as uow:
            await uow.passages.add(agent.id, "phantom", QUERY)
            assert [h.passage.text for h in await uow.passages.search(agent.id, QUERY, k=1)] == ["phantom"]
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError, match="roll back"):
        await add_search_and_fail()
    async with db.unit_of_work() as uow:
        real = await uow.passages.add(agent.id, "real", QUERY)
    assert (await _nearest(db, agent))[0] == (real.id, 0.0)


async def test_many_agents_each_search_their_own_vectors(db: Database) -> None:
    # More agents than the cache holds (64), searched twice, so entries are evicted and reloaded.
    async with db.unit_of_work() as uow:
        agents = [await uow.agents.create(f"agent {i}") for i in range(70)]
        mine = {
            agent.id: (await uow.passages.add(agent.id, f"of {i}", [1.0, float(i)])).id
            for i, agent in enumerate(agents)
        }
    for agent in [*agents, *reversed(agents)]:
        assert [passage_id for passage_id, _ in await _nearest_2d(db, agent)] == [mine[agent.id]]


async def _nearest_2d(db: Database, agent: Agent) -> list[tuple[uuid.UUID, float | None]]:
    async with db.unit_of_work(read_only=True) as uow:
        hits = await uow.passages.search(agent.id, [1.0, 0.0], k=10)
    return [(hit.passage.id, hit.distance) for hit in hits]


async def _search_beside_a_ticker(db: Database, agent: Agent, queries: np.ndarray) -> list[float]:
    """Run one search per query, one after another, while a 1 ms ticker task keeps time: its ticks."""
    ticks: list[float] = []

    async def ticker() -> None:
        while True:
            ticks.append(time.perf_counter())
            await anyio.sleep(0.001)

    async with anyio.create_task_group() as group:
        group.start_soon(ticker)
        await anyio.sleep(0.01)
        for query in queries:
            async with db.unit_of_work(read_only=True) as uow:
                assert len(await uow.passages.search(agent.id, query, k=10)) == 10
        group.cancel_scope.cancel()
    return ticks


async def test_searching_a_big_archive_leaves_the_event_loop_running(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    vectors = np.random.default_rng(30).standard_normal((30_000, 64)).astype(np.float32)
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("big")
        for start in range(0, len(vectors), 10_000):
            await uow.passages.add_many(
                agent.id, [{"text": "t", "embedding": v} for v in vectors[start : start + 10_000]]
            )
    # Each numpy scan is made 30 ms slower, sleeping as a scan computes (without the event loop).
    # A scan that ran on the loop's thread would hold the loop for those 30 ms, and the ticker
    # would not tick inside it. Checked by where each scan ran and what ran during it, not by
    # timing ratios, which another busy process on the machine can skew.
    scans: list[tuple[int, float, float]] = []
    distances = vector_search._distances

    def slow_distances(*args: object) -> object:
        began = time.perf_counter()
        time.sleep(0.03)
        found = distances(*args)  # type: ignore[arg-type]
        scans.append((threading.get_ident(), began, time.perf_counter()))
        return found

    monkeypatch.setattr(vector_search, "_distances", slow_distances)
    loop_thread = threading.get_ident()
    ticks = await _search_beside_a_ticker(db, agent, vectors[:9])  # the first loads the matrix
    if db.dialect == "postgresql":  # pgvector scans in the server: the loop only awaits it
        assert not scans
    else:
        assert len(scans) == 9
        for thread, began, ended in scans:
            assert thread != loop_thread
            assert any(began < tick < ended for tick in ticks), (began, ended)
    assert len(ticks) >= 20  # other tasks ran while the searches were under way


# -- the embedding model cached on the Database ------------------------------------------------------


async def _replace_model(other: Database, agent: Agent, dim: int, precision: str) -> list[uuid.UUID]:
    """Another process drops the agent's model "default" and its passages, and registers a new one."""
    async with other.unit_of_work() as uow:
        await uow.passages.delete_where(agent.id, {"i": {"$in": list(range(5))}})
        await uow.session.execute(sa.delete(EMBEDDING_MODELS).where(EMBEDDING_MODELS.c.agent_id == agent.id))
        await uow.passages.define_model(agent.id, "default", dim, precision=precision)
        items = [{"text": f"new {i}", "embedding": [1.0, float(i), *[0.0] * (dim - 2)]} for i in range(3)]
        added = await uow.passages.add_many(agent.id, items)
    return [p.id for p in added]


@pytest.mark.parametrize(("dim", "precision"), [(3, "float16"), (4, "float32")])
async def test_a_search_after_the_model_was_replaced_elsewhere_finds_the_new_passages(
    db: Database, other: Database, dim: int, precision: str
) -> None:
    agent, _ = await _agent_with_passages(db)
    await _nearest(db, agent)  # caches the model (3-d float32) on db
    assert db.vector_cache.models.get("default", agent.id, "default") is not None
    new = await _replace_model(other, agent, dim, precision)
    query = [1.0, 0.0, *[0.0] * (dim - 2)]
    async with db.unit_of_work(read_only=True) as uow:
        hits = await uow.passages.search(agent.id, query, k=10, metric="l2")
    assert [hit.passage.id for hit in hits] == new
    assert [hit.passage.text for hit in hits] == ["new 0", "new 1", "new 2"]
    assert [round(hit.distance or 0.0, 3) for hit in hits] == [0.0, 1.0, 2.0]
    cached = db.vector_cache.models.get("default", agent.id, "default")
    assert cached is not None
    assert (cached.dim, cached.precision) == (dim, precision)


async def test_a_cached_model_is_the_tenants_own(db: Database) -> None:
    agent, _ = await _agent_with_passages(db)
    await _nearest(db, agent)
    async with db.unit_of_work(tenant="acme", read_only=True) as uow:
        with pytest.raises(NotFoundError):
            await uow.passages.search(agent.id, QUERY, k=3)
    assert db.vector_cache.models.get("acme", agent.id, "default") is None
    await db.delete_tenant("default")
    assert db.vector_cache.models.get("default", agent.id, "default") is None
