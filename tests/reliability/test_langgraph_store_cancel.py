"""MemormStore cancelled mid-flight, on both engines.

LangGraph cancels a run's store calls when the run is cancelled.  `aput`
(an item and its embeddings, replacing what the key held: on Postgres one
statement that commits by itself, on SQLite one hop with its BEGIN and
COMMIT) and `asearch` (by filter and by query) are cancelled at random
moments, every way servers cancel (the patterns of test_cancellation.py):
afterwards each item is stored whole, its embeddings those of its value,
or not at all; no embedding outlives its item; every put that returned is
there; the pool holds no connection, the SQLite write lock is free, the next
call works, and nothing reached the loop's exception handler.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import ENGINES, Store

from memorm import Database
from memorm.compat.langgraph import MemormStore
from memorm.types import VectorType
from reliability.test_cancellation import KINDS
from reliability.test_langgraph_cancel import ATTEMPTS, BURST, cancel_each

pytestmark = [pytest.mark.anyio, pytest.mark.reliability, pytest.mark.long]

DIMS = 8
KEYS = 7  # puts reuse keys, so most replace an item and its embeddings


def embed(texts: list[str]) -> list[list[float]]:
    """A deterministic embedding: the text's bytes folded onto `DIMS` axes."""
    vectors = []
    for text in texts:
        vector = [0.0] * DIMS
        for position, byte in enumerate(text.encode()):
            vector[position % DIMS] += byte / 255
        vectors.append(vector)
    return vectors


def _value(n: int) -> dict[str, Any]:
    return {"a": f"cat {n}", "b": f"dog {n} " + "z" * (n % 5), "n": n}


async def _store(db: Database) -> MemormStore:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create(f"store-{uuid.uuid4().hex[:8]}")
    return MemormStore(db, agent=agent.id, index={"dims": DIMS, "embed": embed, "fields": ["a", "b"]})


async def _stored(db: Database) -> tuple[dict[str, Any], dict[str, dict[str, list[float]]]]:
    """The items' values by key, and their embeddings by key and field."""
    decode = VectorType().result_processor(db.engine.dialect, None)
    async with db.unit_of_work(read_only=True) as uow:
        items = await uow.session.execute(sa.text("SELECT key, value FROM graph_store_items"))
        values = {key: value if isinstance(value, dict) else json.loads(value) for key, value in items}
        rows = await uow.session.execute(sa.text("SELECT key, field, embedding FROM graph_store_vectors"))
        vectors: dict[str, dict[str, list[float]]] = {}
        for key, field, embedding in rows:
            vectors.setdefault(key, {})[field] = decode(embedding) if decode else embedding
    return values, vectors


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("engine", ENGINES, indirect=True)
async def test_a_cancelled_aput_stores_the_item_with_its_embeddings_or_leaves_the_old_one(
    db: Database, store: Store, kind: str
) -> None:
    memories = await _store(db)
    finished: dict[str, int] = {}  # key: the n of the last put to it that returned

    async def put(n: int) -> None:  # attempt n: BURST puts, in turn
        for m in range(n * BURST, (n + 1) * BURST):
            key = f"k{m % KEYS}"
            await memories.aput(("zoo",), key, _value(m))
            finished[key] = m

    await cancel_each(db, store, kind, put)
    values, vectors = await _stored(db)
    assert set(vectors) <= set(values)  # no embedding without its item
    for key, value in values.items():  # each item whole: its embeddings are its value's
        expected = dict(zip(("a", "b"), embed([value["a"], value["b"]]), strict=True))
        assert set(vectors[key]) == {"a", "b"}
        for field, vector in vectors[key].items():
            assert vector == pytest.approx(expected[field], abs=1e-5)
    for key, m in finished.items():  # a put that returned is there, or a later one replaced it
        assert values[key]["n"] >= m
    await memories.aput(("zoo",), "after", _value(0))  # the next call works
    found = await memories.asearch(("zoo",), query="cat 0", limit=1)
    assert found[0].key in {"after", *values}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("engine", ENGINES, indirect=True)
async def test_cancelled_searches_leave_nothing_behind_and_the_next_search_is_whole(
    db: Database, store: Store, kind: str
) -> None:
    memories = await _store(db)
    for n in range(60):
        await memories.aput(("zoo", f"n{n % 3}"), f"k{n}", _value(n))

    async def by_query(_: int) -> None:
        for _ in range(BURST):
            assert len(await memories.asearch(("zoo",), query="dog 7", limit=20)) == 20

    async def by_filter(_: int) -> None:
        for _ in range(BURST):
            assert len(await memories.asearch(("zoo",), filter={"n": {"$gte": 10}}, limit=20)) == 20

    for search in (by_query, by_filter):
        await cancel_each(db, store, kind, search, ATTEMPTS // 2)
    assert [item.key for item in await memories.asearch(("zoo",), filter={"n": 7})] == ["k7"]
    found = await memories.asearch(("zoo",), query="cat 7", limit=60)
    assert len(found) == 60
