"""Archival vector search is exact: it matches a float64 numpy reference, on both engines.

Vectors are rounded to float32 before the reference sees them, as
the store keeps them; queries are rounded too, because Postgres casts the query
to the column's type.  Components are scaled by 1/sqrt(dim) so distances are
O(1) and float32 arithmetic on the server stays far inside the 1e-5 tolerance.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import pytest
from archival_reference import assert_matches, reference, scaled_vectors
from archival_reference import new_agent as _new_agent
from archival_reference import store_vectors as _store

from memorm import Database, ValidationError

pytestmark = pytest.mark.anyio

METRICS = ["cosine", "l2", "inner_product"]
T0 = datetime(2024, 3, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize("metric", METRICS)
async def test_search_returns_the_exact_nearest_in_reference_order(db: Database, metric: str) -> None:
    agent = await _new_agent(db)
    vectors = scaled_vectors(1500, 1500, 32)
    ids = await _store(db, agent, vectors)
    queries = scaled_vectors(99, 4, 32)
    async with db.unit_of_work(read_only=True) as uow:
        for query in queries:
            expected = reference(vectors, ids, query, metric, 21)
            gaps = np.diff([distance for _, distance in expected])
            # Postgres computes in float32 (error ~1e-7 here): a closer tie could swap places.
            assert gaps.min() > 1e-6, "the data has a near tie; pick another seed"
            hits = await uow.passages.search(agent.id, query, k=20, metric=metric)
            assert_matches(hits, expected[:20])
            for hit in hits:  # scores follow the metric's documented formula
                assert hit.score == pytest.approx(
                    {"cosine": 1 - hit.distance, "l2": 1 / (1 + hit.distance)}.get(metric, -hit.distance)
                )


@pytest.mark.parametrize("metric", METRICS)
async def test_offset_pages_continue_the_same_order(db: Database, metric: str) -> None:
    agent = await _new_agent(db)
    vectors = scaled_vectors(3, 400, 16)
    ids = await _store(db, agent, vectors)
    query = scaled_vectors(4, 1, 16)[0]
    async with db.unit_of_work(read_only=True) as uow:
        pages = [await uow.passages.search(agent.id, query, k=7, offset=o, metric=metric) for o in (0, 7, 14)]
        whole = await uow.passages.search(agent.id, query, k=21, metric=metric)
    assert [h.passage.id for page in pages for h in page] == [h.passage.id for h in whole]
    assert_matches(whole, reference(vectors, ids, query, metric, 21))


async def test_k_larger_than_the_archive_returns_every_passage_in_order(db: Database) -> None:
    agent = await _new_agent(db)
    vectors = scaled_vectors(5, 5, 8)
    ids = await _store(db, agent, vectors)
    async with db.unit_of_work(read_only=True) as uow:
        hits = await uow.passages.search(agent.id, vectors[0], k=1000, metric="l2")
        beyond = await uow.passages.search(agent.id, vectors[0], k=10, offset=5)
    assert_matches(hits, reference(vectors, ids, vectors[0], "l2", 1000))
    assert beyond == []


@pytest.mark.parametrize(
    "twins",
    [
        9,
        60,  # more ties than the candidate margin
    ],
)
@pytest.mark.parametrize("metric", METRICS)
async def test_equal_distances_are_ordered_by_id_across_pages(db: Database, metric: str, twins: int) -> None:
    agent = await _new_agent(db)
    twin = [0.5, -0.25, 0.75, 0.125]
    # Ids inserted out of order, so neither insertion nor physical order can pass for id order.
    twin_ids = sorted((uuid.uuid4() for _ in range(twins)), key=lambda u: u.hex[::-1])
    async with db.unit_of_work() as uow:
        await uow.passages.add_many(
            agent.id, [{"text": "twin", "embedding": twin, "id": i} for i in twin_ids]
        )
        await uow.passages.add_many(agent.id, [{"text": "far", "embedding": [-1.0, 1.0, -1.0, -1.0]}] * 3)
    async with db.unit_of_work(read_only=True) as uow:
        pages = [
            await uow.passages.search(agent.id, twin, k=4, offset=o, metric=metric)
            for o in range(0, twins, 4)
        ]
        first = await uow.passages.search(agent.id, twin, k=1, metric=metric)
    found = [hit.passage.id for page in pages for hit in page]
    assert len(set(found[:twins])) == twins  # paging shows every twin exactly once
    assert found[:twins] == sorted(twin_ids)
    assert [hit.passage.id for hit in first] == [min(twin_ids)]
    assert len({hit.distance for page in pages for hit in page if hit.passage.text == "twin"}) == 1


async def test_filter_is_applied_before_the_limit(db: Database) -> None:
    agent = await _new_agent(db)
    vectors = scaled_vectors(7, 1500, 32)
    rare = [i % 100 < 7 for i in range(len(vectors))]  # 105 rows, 7%
    async with db.unit_of_work() as uow:
        added = await uow.passages.add_many(
            agent.id,
            [
                {"text": "t", "embedding": v, "meta": {"tier": "rare" if r else "common"}}
                for v, r in zip(vectors, rare, strict=True)
            ],
        )
    keep = np.array(rare)
    ids = [p.id for p, r in zip(added, rare, strict=True) if r]
    query = scaled_vectors(8, 1, 32)[0]
    async with db.unit_of_work(read_only=True) as uow:
        hits = await uow.passages.search(agent.id, query, k=50, where={"tier": "rare"})
    assert len(hits) == 50
    assert {hit.passage.meta["tier"] for hit in hits} == {"rare"}
    assert_matches(hits, reference(vectors[keep], ids, query, "cosine", 50))


async def test_in_filter_and_several_keys_must_all_hold(db: Database) -> None:
    agent = await _new_agent(db)
    vectors = scaled_vectors(9, 300, 16)
    langs = ["en", "fr", "de", "es", "it"]
    metas = [{"lang": langs[i % 5], "draft": i % 3 == 0} for i in range(len(vectors))]
    async with db.unit_of_work() as uow:
        added = await uow.passages.add_many(
            agent.id, [{"text": "t", "embedding": v, "meta": m} for v, m in zip(vectors, metas, strict=True)]
        )
    query = scaled_vectors(10, 1, 16)[0]
    cases = [
        ({"lang": {"$in": ["fr", "it"]}}, lambda m: m["lang"] in ("fr", "it")),
        ({"lang": {"$in": ["de"]}, "draft": True}, lambda m: m["lang"] == "de" and m["draft"]),
        ({"lang": {"$in": ["xx", "yy"]}}, lambda m: False),
    ]
    async with db.unit_of_work(read_only=True) as uow:
        for where, wanted in cases:
            hits = await uow.passages.search(agent.id, query, k=1000, metric="l2", where=where)
            keep = np.array([wanted(m) for m in metas], dtype=bool)
            ids = [p.id for p, k in zip(added, keep, strict=True) if k]
            assert_matches(hits, reference(vectors[keep], ids, query, "l2", 1000))


async def test_created_at_ranges_select_by_time(db: Database) -> None:
    agent = await _new_agent(db)
    vectors = scaled_vectors(11, 120, 8)
    times = [T0 + timedelta(minutes=i) for i in range(len(vectors))]
    async with db.unit_of_work() as uow:
        added = await uow.passages.add_many(
            agent.id,
            [{"text": "t", "embedding": v, "created_at": t} for v, t in zip(vectors, times, strict=True)],
        )
    paris = timezone(timedelta(hours=2))  # the same instants, spelled in another zone
    cases = [
        ({"$gte": T0 + timedelta(minutes=10), "$lt": T0 + timedelta(minutes=30)}, range(10, 30)),
        ({"$gt": T0 + timedelta(minutes=10), "$lte": T0 + timedelta(minutes=30)}, range(11, 31)),
        ({"$gte": (T0 + timedelta(minutes=100)).astimezone(paris)}, range(100, 120)),
        ({"$lt": T0}, range(0)),
    ]
    async with db.unit_of_work(read_only=True) as uow:
        for bounds, wanted in cases:
            hits = await uow.passages.search(agent.id, vectors[0], k=1000, where={"created_at": bounds})
            assert sorted(hit.passage.id for hit in hits) == sorted(added[i].id for i in wanted)
            assert {hit.passage.created_at for hit in hits} == {times[i] for i in wanted}


async def test_meta_values_match_only_their_own_json_type(db: Database) -> None:
    agent = await _new_agent(db)
    values: dict[str, Any] = {"int": 1, "str": "1", "true": True, "false": False, "zero": 0, "null": None}
    async with db.unit_of_work() as uow:
        await uow.passages.add_many(
            agent.id,
            [{"text": name, "embedding": [1.0, 0.0], "meta": {"v": v}} for name, v in values.items()],
        )
        await uow.passages.add(agent.id, "missing", [1.0, 0.0], meta={"other": 1})
        await uow.passages.add(agent.id, "list", [1.0, 0.0], meta={"v": [1, "1", True]})
    async with db.unit_of_work(read_only=True) as uow:
        for name, value in values.items():
            hits = await uow.passages.search(agent.id, [1.0, 0.0], k=100, where={"v": value})
            assert [hit.passage.text for hit in hits] == [name], value
        hits = await uow.passages.search(agent.id, [1.0, 0.0], k=100, where={"v": {"$in": [1, True]}})
        assert sorted(hit.passage.text for hit in hits) == ["int", "true"]
        hits = await uow.passages.search(agent.id, [1.0, 0.0], k=100, where={"v": {"$in": [1.0, "0"]}})
        assert [hit.passage.text for hit in hits] == ["int"]


@pytest.mark.parametrize("metric", ["cosine", "l2", "inner_product"])
async def test_the_longest_storable_vectors_rank_alike_on_both_engines_without_warnings(
    db: Database, metric: str
) -> None:
    import warnings

    top = 6.0e18  # rows of length ~8.5e18, just under MAX_VECTOR_LENGTH: float32 sums stay finite
    vectors = [[top, top, 0.0], [top, 0.0, top], [0.0, top, top], [-top, -top, 0.0]]
    query = [top, top * 0.9, 0.0]
    async with db.unit_of_work() as uow:
        agent = (await uow.agents.create(f"long-{metric}")).id
        stored = [(await uow.passages.add(agent, f"p{i}", v)).id for i, v in enumerate(vectors)]
    expected = reference(np.array(vectors), stored, np.array(query), metric, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow in numpy would warn (and log in a server)
        async with db.unit_of_work(read_only=True) as uow:
            hits = await uow.passages.search(agent, query, k=4, metric=metric)
    assert [hit.passage.id for hit in hits] == [passage_id for passage_id, _ in expected]


@pytest.mark.parametrize("vector", [[7.0e18, 7.0e18, 0.0], [3.0e38, 0.0, 0.0]], ids=["9.9e18", "3e38"])
async def test_vectors_too_long_for_float32_distances_are_refused(db: Database, vector: list[float]) -> None:
    async with db.unit_of_work() as uow:
        agent = (await uow.agents.create("too-long")).id
        with pytest.raises(ValidationError, match="longer than"):
            await uow.passages.add(agent, "p", vector)
        with pytest.raises(ValidationError, match="longer than"):
            await uow.passages.search(agent, vector, k=1)
