"""Archival text search, and hybrid search: text and vector hits fused by reciprocal rank."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from memorm import Agent, Database, ScoredPassage

pytestmark = pytest.mark.anyio

RRF_K = 60
T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)
QUERY = [1.0, 0.0, 0.0, 0.0]


async def _new_agent(db: Database, name: str = "sam") -> Agent:
    async with db.unit_of_work() as uow:
        return await uow.agents.create(name)


async def _add(db: Database, agent: Agent, items: list[dict[str, Any]]) -> dict[str, uuid.UUID]:
    async with db.unit_of_work() as uow:
        added = await uow.passages.add_many(agent.id, items)
    return {passage.text: passage.id for passage in added}


def _fused(vector_ids: list[uuid.UUID], text_ids: list[uuid.UUID]) -> list[tuple[uuid.UUID, float]]:
    """Reciprocal rank fusion of two rankings, best first, ties by id."""
    scores: dict[uuid.UUID, float] = {}
    for ranking in (vector_ids, text_ids):
        for rank, passage_id in enumerate(ranking, start=1):
            scores[passage_id] = scores.get(passage_id, 0.0) + 1.0 / (RRF_K + rank)
    return sorted(scores.items(), key=lambda pair: (-pair[1], pair[0]))


def _ids(hits: list[ScoredPassage]) -> list[uuid.UUID]:
    return [hit.passage.id for hit in hits]


async def test_text_search_finds_passages_with_every_word_of_the_query(db: Database) -> None:
    sam, other = await _new_agent(db), await _new_agent(db, "max")
    ids = await _add(
        db,
        sam,
        [
            {"text": "The cat sat on the mat", "embedding": QUERY},
            {"text": "a cat and a dog", "embedding": QUERY},
            {"text": "dogs bark at night", "embedding": QUERY},
        ],
    )
    await _add(db, other, [{"text": "another agent's cat", "embedding": QUERY}])
    async with db.unit_of_work(read_only=True) as uow:
        cats = await uow.passages.search_text(sam.id, "CAT")
        both = await uow.passages.search_text(sam.id, "dog cat")
        second = await uow.passages.search_text(sam.id, "cat", limit=1, offset=1)
        nothing = await uow.passages.search_text(sam.id, "!!! ***")
    assert {p.id for p in cats} == {ids["The cat sat on the mat"], ids["a cat and a dog"]}
    assert cats.total == 2
    assert [p.id for p in both] == [ids["a cat and a dog"]]
    assert (len(second), second.total, second.has_more) == (1, 2, False)
    assert second.items[0].id in {p.id for p in cats} - {cats.items[0].id}
    assert (nothing.items, nothing.total) == ([], 0)


async def test_hybrid_search_fuses_both_sides_by_reciprocal_rank(db: Database) -> None:
    agent = await _new_agent(db)
    ids = await _add(
        db,
        agent,
        [
            {"text": "apple pie", "embedding": [0.0, 1.0, 0.0, 0.0]},
            {"text": "apple banana smoothie", "embedding": [0.9, 0.1, 0.0, 0.0]},
            {"text": "banana bread", "embedding": [1.0, 0.0, 0.0, 0.0]},
            {"text": "cherry tart", "embedding": [0.5, 0.5, 0.0, 0.0]},
            {"text": "apple crumble", "embedding": [0.0, 0.0, 1.0, 0.0]},
            {"text": "plain rice", "embedding": [0.0, 0.0, 0.0, 1.0]},
        ],
    )
    async with db.unit_of_work(read_only=True) as uow:
        hits = await uow.passages.hybrid_search(agent.id, "apple", QUERY, k=10, candidates=3)
        top2 = await uow.passages.hybrid_search(agent.id, "apple", QUERY, k=2, candidates=3)
        vector = await uow.passages.search(agent.id, QUERY, k=3)
        text = await uow.passages.search_text(agent.id, "apple", limit=3)
    expected = _fused(_ids(vector), [p.id for p in text])
    assert _ids(hits) == [passage_id for passage_id, _ in expected]
    assert [hit.score for hit in hits] == pytest.approx([score for _, score in expected])
    assert _ids(top2) == [passage_id for passage_id, _ in expected[:2]]
    # Found by the vector side (3 nearest), the text side (3 apples), or both; rice by neither.
    found = {
        ids[t] for t in ("banana bread", "apple banana smoothie", "cherry tart", "apple pie", "apple crumble")
    }
    assert set(_ids(hits)) == found
    assert hits[0].passage.id == ids["apple banana smoothie"]  # the only passage both sides found
    distance = {hit.passage.id: hit.distance for hit in vector}
    assert {hit.passage.id: hit.distance for hit in hits} == {i: distance.get(i) for i in found}


async def test_hybrid_search_filter_applies_to_the_text_side_too(db: Database) -> None:
    agent = await _new_agent(db)
    ids = await _add(
        db,
        agent,
        [
            {"text": "apple pie", "embedding": [0.0, 1.0, 0.0, 0.0], "meta": {"keep": False}},
            {"text": "apple crumble", "embedding": [0.0, 0.0, 1.0, 0.0], "meta": {"keep": True}},
            {"text": "banana bread", "embedding": QUERY, "meta": {"keep": True}},
            {"text": "banana split", "embedding": [0.9, 0.1, 0.0, 0.0], "meta": {"keep": False}},
        ],
    )
    async with db.unit_of_work(read_only=True) as uow:
        hits = await uow.passages.hybrid_search(agent.id, "apple", QUERY, k=10, where={"keep": True})
    assert set(_ids(hits)) == {ids["apple crumble"], ids["banana bread"]}
    assert all(hit.passage.meta["keep"] for hit in hits)


@pytest.mark.parametrize("excluded_by", ["where", "model"])
async def test_hybrid_text_side_is_filtered_before_its_candidate_limit(
    db: Database, excluded_by: str
) -> None:
    agent = await _new_agent(db)
    # 25 newer "apple" passages the filter excludes outrank the one it keeps (equal text: newest first).
    excluded: dict[str, Any] = (
        {"meta": {"keep": False}} if excluded_by == "where" else {"embedding_model": "b"}
    )
    keep = {"text": "apple", "embedding": [-1.0, 0.0, 0.0, 0.0], "meta": {"keep": True}, "created_at": T0}
    others = [
        {"text": "apple", "embedding": [0.0, -1.0, 0.0, 0.0], "created_at": T0 + timedelta(minutes=i + 1)}
        | excluded
        for i in range(25)
    ]
    pears = [
        {"text": "pear", "embedding": [1.0, 0.01 * i, 0.0, 0.0], "meta": {"keep": True}} for i in range(25)
    ]
    ids = await _add(db, agent, [keep])
    await _add(db, agent, [*others, *pears])
    where = {"keep": True} if excluded_by == "where" else None
    async with db.unit_of_work(read_only=True) as uow:
        hits = await uow.passages.hybrid_search(agent.id, "apple", QUERY, k=5, where=where)
    by_id = {hit.passage.id: hit for hit in hits}
    assert ids["apple"] in by_id  # the best text match that passes the filter
    assert by_id[ids["apple"]].score == pytest.approx(1 / (RRF_K + 1))
    assert by_id[ids["apple"]].distance is None
