"""Archival storage: passages and embeddings are written, changed and deleted together."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from conftest import count_rows

from memorm import Agent, ArchivalPassage, ConflictError, Database, DatabaseError, NotFoundError

pytestmark = pytest.mark.anyio

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


async def _new_agent(db: Database, name: str = "sam") -> Agent:
    async with db.unit_of_work() as uow:
        return await uow.agents.create(name)


def _float32(values: object) -> list[float]:
    return np.asarray(values, dtype=np.float32).astype(np.float64).tolist()


async def test_add_and_add_many_round_trip_text_meta_and_float32_embedding(db: Database) -> None:
    agent = await _new_agent(db)
    given_id = uuid.uuid4()
    async with db.unit_of_work() as uow:
        one = await uow.passages.add(
            agent.id, "Zoë's café ☕", [0.1, 0.2, 0.3], meta={"n": {"deep": [1, None]}}
        )
        many = await uow.passages.add_many(
            agent.id,
            [
                {"text": "dict", "embedding": np.array([0.7, 0.8, 0.9]), "id": given_id, "created_at": T0},
                ArchivalPassage(text="object", embedding=[1e-3, -2.5, 3e7], meta={"src": "obj"}),
                {"text": "other model", "embedding": [0.5] * 5, "embedding_model": "wide"},
            ],
        )
    async with db.unit_of_work(read_only=True) as uow:
        stored = [await uow.passages.get(p.id) for p in (one, *many)]
        listed = await uow.passages.list(agent.id)
        assert (await uow.passages.get_model(agent.id, "wide")).dim == 5
    assert [(p.text, p.meta, p.embedding_model) for p in stored] == [
        ("Zoë's café ☕", {"n": {"deep": [1, None]}}, "default"),
        ("dict", {}, "default"),
        ("object", {"src": "obj"}, "default"),
        ("other model", {}, "wide"),
    ]
    assert [p.embedding for p in stored] == [
        _float32([0.1, 0.2, 0.3]),
        _float32([0.7, 0.8, 0.9]),
        _float32([1e-3, -2.5, 3e7]),
        [0.5] * 5,
    ]
    assert (stored[1].id, stored[1].created_at) == (given_id, T0)
    assert [p.id for p in listed] == [given_id, one.id, many[1].id, many[2].id]  # oldest first
    assert {p.agent_id for p in stored} == {agent.id}


async def test_bulk_batch_round_trips_every_row(db: Database) -> None:
    # 300 rows: above the threshold where Postgres switches from INSERT to COPY.
    agent = await _new_agent(db)
    vectors = np.random.default_rng(1).standard_normal((300, 24)).astype(np.float32)
    items = [
        {"text": f"passage {i}", "embedding": vectors[i], "meta": {"i": i, "odd": i % 2 == 1}}
        for i in range(300)
    ]
    async with db.unit_of_work() as uow:
        added = await uow.passages.add_many(agent.id, items)
    async with db.unit_of_work(read_only=True) as uow:
        page = await uow.passages.list(agent.id, limit=1000)
        assert await uow.passages.count(agent.id) == 300
    by_id = {p.id: p for p in page}
    for i, passage in enumerate(added):
        stored = by_id[passage.id]
        assert (stored.text, stored.meta) == (f"passage {i}", {"i": i, "odd": i % 2 == 1})
        assert stored.embedding == vectors[i].astype(np.float64).tolist()


async def test_add_many_returns_what_it_stored_keeping_the_given_lists_and_meta(db: Database) -> None:
    agent = await _new_agent(db)
    async with db.unit_of_work() as uow:
        await uow.passages.define_model(agent.id, "half", 3, precision="float16")
    floats, meta = [0.5, -0.25, 2.0], {"k": [1]}
    items: list[dict[str, Any]] = [
        {"text": "floats", "embedding": floats, "meta": meta},
        {"text": "ints", "embedding": [1, 2, 3]},  # not floats: checked into a new list of floats
        {"text": "tuple", "embedding": (0.5, 1.5, 2.5), "embedding_model": "half"},
        {"text": "half", "embedding": [0.25, 0.5, 1.0], "embedding_model": "half"},
    ]
    async with db.unit_of_work() as uow:
        added = await uow.passages.add_many(agent.id, items)
    assert added[0].embedding is floats
    assert added[0].meta is meta
    assert added[1].embedding == [1.0, 2.0, 3.0]
    assert all(type(x) is float for x in added[1].embedding)
    assert [(p.embedding, p.embedding_half) for p in added[2:]] == [
        (None, [0.5, 1.5, 2.5]),
        (None, [0.25, 0.5, 1.0]),
    ]
    async with db.unit_of_work(read_only=True) as uow:
        stored = [await uow.passages.get(p.id) for p in added]
    fields = ("text", "embedding", "embedding_half", "embedding_model", "embedding_dim", "meta", "created_at")
    assert [tuple(getattr(p, f) for f in fields) for p in stored] == [
        tuple(getattr(p, f) for f in fields) for p in added
    ]
    assert [p.embedding_dim for p in added] == [3, 3, 3, 3]


async def test_update_text_changes_text_and_embedding_together(db: Database) -> None:
    agent = await _new_agent(db)
    async with db.unit_of_work() as uow:
        moved = await uow.passages.add(agent.id, "the red kite", [1.0, 0.0, 0.0])
        await uow.passages.add(agent.id, "a blue whale", [0.0, 1.0, 0.0])
    async with db.unit_of_work() as uow:
        updated = await uow.passages.update_text(moved.id, "a green frog", [0.0, 0.0, 1.0])
    async with db.unit_of_work(read_only=True) as uow:
        stored = await uow.passages.get(moved.id)
        nearest = await uow.passages.search(agent.id, [0.0, 0.0, 1.0], k=1)
        old_place = await uow.passages.search(agent.id, [1.0, 0.0, 0.0], k=2)
        assert [p.id for p in await uow.passages.search_text(agent.id, "frog")] == [moved.id]
        assert (await uow.passages.search_text(agent.id, "kite")).total == 0
    assert (stored.text, stored.embedding) == ("a green frog", [0.0, 0.0, 1.0])
    assert (updated.text, updated.embedding) == (stored.text, stored.embedding)
    assert stored.created_at == moved.created_at
    assert stored.updated_at > moved.updated_at
    assert (nearest[0].passage.id, nearest[0].distance) == (moved.id, pytest.approx(0.0))
    assert old_place[0].distance == pytest.approx(1.0)  # nothing sits at the old vector any more


async def test_update_text_keeps_a_half_precision_model_half(db: Database) -> None:
    agent = await _new_agent(db)
    async with db.unit_of_work() as uow:
        await uow.passages.define_model(agent.id, "half", 2, precision="float16")
        passage = await uow.passages.add(agent.id, "x", [0.5, 0.5], embedding_model="half")
        await uow.passages.update_text(passage.id, "y", [0.1, 0.3])
    async with db.unit_of_work(read_only=True) as uow:
        stored = await uow.passages.get(passage.id)
        [hit] = await uow.passages.search(agent.id, [0.1, 0.3], embedding_model="half", metric="l2")
    assert stored.embedding is None
    assert stored.embedding_half == np.array([0.1, 0.3], dtype=np.float16).astype(np.float64).tolist()
    assert hit.passage.text == "y"


async def test_delete_removes_the_passage_from_every_read(db: Database) -> None:
    agent = await _new_agent(db)
    async with db.unit_of_work() as uow:
        gone = await uow.passages.add(agent.id, "forget this lemon", [1.0, 0.0])
        kept = await uow.passages.add(agent.id, "keep this lime", [0.9, 0.1])
    async with db.unit_of_work() as uow:
        await uow.passages.delete(gone.id)
    async with db.unit_of_work(read_only=True) as uow:
        hits = await uow.passages.search(agent.id, [1.0, 0.0])
        assert (await uow.passages.search_text(agent.id, "lemon")).total == 0
        assert await uow.passages.count(agent.id) == 1
        with pytest.raises(NotFoundError):
            await uow.passages.get(gone.id)
    assert [hit.passage.id for hit in hits] == [kept.id]
    async with db.unit_of_work() as uow:
        with pytest.raises(NotFoundError):
            await uow.passages.delete(gone.id)


async def test_delete_where_deletes_only_the_agents_matching_passages(db: Database) -> None:
    sam, max_ = await _new_agent(db), await _new_agent(db, "max")
    for agent in (sam, max_):
        async with db.unit_of_work() as uow:
            await uow.passages.add_many(
                agent.id,
                [
                    {"text": f"p{i}", "embedding": [1.0, float(i)], "meta": {"topic": ["a", "b", "c"][i % 3]}}
                    | {"created_at": T0 + timedelta(days=i)}
                    for i in range(9)
                ],
            )
    async with db.unit_of_work() as uow:
        assert await uow.passages.delete_where(sam.id, {"topic": "a"}) == 3
        assert await uow.passages.delete_where(sam.id, {"topic": {"$in": ["b", "zz"]}}) == 3
        assert await uow.passages.delete_where(sam.id, {"created_at": {"$gte": T0 + timedelta(days=8)}}) == 1
        assert await uow.passages.delete_where(sam.id, {"topic": "a"}) == 0
    async with db.unit_of_work(read_only=True) as uow:
        left = await uow.passages.list(sam.id)
        hits = await uow.passages.search(sam.id, [1.0, 0.0], k=100)
        assert await uow.passages.count(max_.id) == 9
    assert [p.text for p in left] == ["p2", "p5"]
    assert sorted(hit.passage.text for hit in hits) == ["p2", "p5"]


async def test_unit_of_work_that_raises_after_add_many_leaves_no_trace(db: Database) -> None:
    agent = await _new_agent(db)

    async def add_then_fail() -> None:
        async with db.unit_of_work() as uow:
            items = [
                {"text": f"walrus {i}", "embedding": [1.0, i], "embedding_model": "m"} for i in range(100)
            ]
            await uow.passages.add_many(agent.id, items)
            assert await uow.passages.count(agent.id) == 100
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await add_then_fail()
    assert await count_rows(db, "archival_passages") == 0
    assert await count_rows(db, "embedding_models") == 0
    async with db.unit_of_work(read_only=True) as uow:
        assert (await uow.passages.search_text(agent.id, "walrus")).total == 0
        assert await uow.passages.search(agent.id, [1.0, 0.0], embedding_model="m") == []
        assert (await uow.agents.get(agent.id)).archive_version == 0
        if db.dialect == "sqlite":  # the FTS5 index agrees with the table (raises if not)
            fts = "archival_passages_fts"
            await uow.session.execute(sa.text(f"INSERT INTO {fts}({fts}) VALUES ('integrity-check')"))


async def test_a_batch_with_a_duplicate_id_is_written_all_or_nothing(db: Database) -> None:
    agent = await _new_agent(db)
    twice = uuid.uuid4()
    items = [{"text": f"t{i}", "embedding": [1.0], "id": twice if i in (3, 80) else None} for i in range(100)]

    async def add(batch: list[dict[str, Any]], *, catch: bool) -> None:
        async with db.unit_of_work() as uow:
            if not catch:
                await uow.passages.add_many(agent.id, batch)
                return
            with pytest.raises(ConflictError):
                await uow.passages.add_many(agent.id, batch)

    with pytest.raises(ConflictError):
        await add(items, catch=False)  # 100 rows: COPY on Postgres
    # Catching the error does not let the unit of work commit the rows before the duplicate.
    with pytest.raises(DatabaseError):
        await add(items[:10] + items[80:81], catch=True)  # 11 rows: INSERT on Postgres
    assert await count_rows(db, "archival_passages") == 0


@pytest.mark.parametrize("engine", [pytest.param("sqlite", marks=pytest.mark.sqlite)], indirect=True)
async def test_ensure_index_is_a_no_op_on_sqlite(db: Database) -> None:
    agent = await _new_agent(db)
    async with db.unit_of_work() as uow:
        await uow.passages.add_many(agent.id, [{"text": "t", "embedding": [1.0, float(i)]} for i in range(5)])
        assert await uow.passages.ensure_index("default", 2, "cosine") == ""
        indexes = await uow.session.execute(sa.text("SELECT name FROM sqlite_master WHERE type = 'index'"))
        hits = await uow.passages.search(agent.id, [1.0, 0.0], k=5)
    assert not [name for (name,) in indexes if "hnsw" in name]
    assert [hit.passage.text for hit in hits] == ["t"] * 5
    assert [hit.distance for hit in hits] == sorted(hit.distance or 0.0 for hit in hits)
