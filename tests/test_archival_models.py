"""Embedding models: several dimensions side by side, per-agent shapes, half precision.

Only passages of the searched model are ever compared, and a float16 model
stores, and searches, float16-rounded vectors exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from archival_reference import assert_matches, reference, scaled_vectors
from archival_reference import new_agent as _new_agent
from archival_reference import store_vectors as _store

from memorm import Database, ValidationError

pytestmark = pytest.mark.anyio

METRICS = ["cosine", "l2", "inner_product"]


async def test_models_of_different_dimensions_are_searched_separately(db: Database) -> None:
    agent = await _new_agent(db)
    small, large = scaled_vectors(12, 30, 384), scaled_vectors(13, 20, 1536)
    small_ids = await _store(db, agent, small, embedding_model="mini")
    large_ids = await _store(db, agent, large, embedding_model="large")
    async with db.unit_of_work(read_only=True) as uow:
        mini_hits = await uow.passages.search(agent.id, small[3], k=100, embedding_model="mini")
        large_hits = await uow.passages.search(agent.id, large[3], k=100, embedding_model="large")
        with pytest.raises(ValidationError):
            await uow.passages.search(agent.id, small[3], embedding_model="large")
    assert_matches(mini_hits, reference(small, small_ids, small[3], "cosine", 100))
    assert_matches(large_hits, reference(large, large_ids, large[3], "cosine", 100))
    assert {len(hit.passage.vector) for hit in mini_hits} == {384}


async def test_search_under_a_model_the_agent_lacks_names_the_models_it_has(db: Database) -> None:
    # Passages stored under a model's name, searched without `embedding_model=`
    # (so under "default"): an empty list would read as "nothing is near".
    agent = await _new_agent(db)
    await _store(db, agent, scaled_vectors(20, 5, 8), embedding_model="mini")
    await _store(db, agent, scaled_vectors(21, 5, 4), embedding_model="large")
    query = scaled_vectors(22, 1, 8)[0]
    expected = f"agent {agent.id} has no embedding model 'default'; its models are 'large', 'mini'"
    for rounds in range(2):  # again once the Database's model cache holds the agent's "mini"
        async with db.unit_of_work(read_only=True) as uow:
            with pytest.raises(ValidationError, match=expected):
                await uow.passages.search(agent.id, query)
            with pytest.raises(ValidationError, match="no embedding model 'minii'; its models are"):
                await uow.passages.search(agent.id, query, embedding_model="minii")
            with pytest.raises(ValidationError, match=expected):
                await uow.passages.hybrid_search(agent.id, "p1", query)
            assert len(await uow.passages.search(agent.id, query, embedding_model="mini")) == 5, rounds


async def test_search_of_an_agent_without_passages_is_empty(db: Database) -> None:
    agent = await _new_agent(db)
    async with db.unit_of_work(read_only=True) as uow:
        assert await uow.passages.search(agent.id, [1.0, 0.0]) == []
        assert await uow.passages.search(agent.id, [1.0, 0.0], embedding_model="mini") == []
        assert await uow.passages.hybrid_search(agent.id, "anything", [1.0, 0.0]) == []


async def test_an_unknown_model_error_names_at_most_ten_models(db: Database) -> None:
    agent = await _new_agent(db)
    async with db.unit_of_work() as uow:
        for n in range(12):
            await uow.passages.define_model(agent.id, f"m{n:02d}", 2)
    async with db.unit_of_work(read_only=True) as uow:
        with pytest.raises(ValidationError) as raised:
            await uow.passages.search(agent.id, [1.0, 0.0])
    listed = ", ".join(f"'m{n:02d}'" for n in range(10))
    assert f"its models are {listed}, …: pass one as embedding_model=" in str(raised.value)


async def test_one_model_name_may_have_another_dimension_for_another_agent(db: Database) -> None:
    sam, max_ = await _new_agent(db, "sam"), await _new_agent(db, "max")
    sams, maxs = scaled_vectors(14, 10, 8), scaled_vectors(15, 10, 12)
    sam_ids = await _store(db, sam, sams, embedding_model="m")
    max_ids = await _store(db, max_, maxs, embedding_model="m")
    async with db.unit_of_work(read_only=True) as uow:
        sam_hits = await uow.passages.search(sam.id, sams[0], k=50, embedding_model="m", metric="l2")
        max_hits = await uow.passages.search(max_.id, maxs[0], k=50, embedding_model="m", metric="l2")
        with pytest.raises(ValidationError):
            await uow.passages.search(sam.id, maxs[0], embedding_model="m")
        assert (await uow.passages.get_model(max_.id, "m")).dim == 12
    assert_matches(sam_hits, reference(sams, sam_ids, sams[0], "l2", 50))
    assert_matches(max_hits, reference(maxs, max_ids, maxs[0], "l2", 50))


@pytest.mark.parametrize("metric", METRICS)
async def test_half_precision_model_stores_float16_and_searches_exactly(db: Database, metric: str) -> None:
    agent = await _new_agent(db)
    raw = np.random.default_rng(16).standard_normal((300, 48)) / np.sqrt(48)
    halves = raw.astype(np.float16).astype(np.float64)
    async with db.unit_of_work() as uow:
        model = await uow.passages.define_model(agent.id, "half", 48, precision="float16")
        added = await uow.passages.add_many(
            agent.id, [{"text": "t", "embedding": v, "embedding_model": "half"} for v in raw]
        )
    assert (model.dim, model.precision) == (48, "float16")
    ids = [p.id for p in added]
    # Queries exactly representable in float16: Postgres compares halfvec to halfvec.
    queries = scaled_vectors(17, 3, 48, np.float16)
    async with db.unit_of_work(read_only=True) as uow:
        stored = await uow.passages.get(ids[5])
        for query in queries:
            hits = await uow.passages.search(agent.id, query, k=15, embedding_model="half", metric=metric)
            assert_matches(hits, reference(halves, ids, query, metric, 15))
    assert stored.embedding is None
    assert stored.vector == halves[5].tolist()
    assert stored.vector != raw[5].astype(np.float32).astype(np.float64).tolist()


async def test_half_precision_search_rounds_the_query_to_float16_on_both_engines(
    db: Database, request: pytest.FixtureRequest
) -> None:
    agent = await _new_agent(db)
    halves = scaled_vectors(18, 50, 8, np.float16)
    async with db.unit_of_work() as uow:
        await uow.passages.define_model(agent.id, "half", 8, precision="float16")
        added = await uow.passages.add_many(
            agent.id, [{"text": "t", "embedding": v, "embedding_model": "half"} for v in halves]
        )
    query = scaled_vectors(19, 1, 8, np.float32)[0]  # not representable in float16
    rounded = query.astype(np.float16).astype(np.float64)
    expected = reference(halves, [p.id for p in added], rounded, "inner_product", 50)
    unrounded = dict(reference(halves, [p.id for p in added], query, "inner_product", 50))
    assert max(abs(unrounded[i] - d) for i, d in expected) > 1e-4  # the rounding shows
    async with db.unit_of_work(read_only=True) as uow:
        hits = await uow.passages.search(
            agent.id, query, k=50, embedding_model="half", metric="inner_product"
        )
    assert_matches(hits, expected)
