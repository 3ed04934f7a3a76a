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

import asyncio
import json
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import ENGINES, Store

from memorm import Database
from memorm.compat.langchain import adispose_sync
from memorm.compat.langgraph import MemormStore
from memorm.types import VectorType
from reliability.test_cancellation import KINDS, assert_clean
from reliability.test_langgraph_cancel import (
    ATTEMPTS,
    BURST,
    SYNC_RUNS,
    SYNC_THREADS,
    beside_threads,
    cancel_each,
)

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


Where = tuple[str, str]  # an item's namespace (joined) and key


async def _stored(db: Database) -> dict[Where, dict[str, Any]]:
    """Every item's value, by namespace and key, after checking it is whole.

    Whole: its embeddings are those of its value's fields, and no embedding
    is left without its item.
    """
    decode = VectorType().result_processor(db.engine.dialect, None)
    async with db.unit_of_work(read_only=True) as uow:
        items = await uow.session.execute(sa.text("SELECT namespace, key, value FROM graph_store_items"))
        values = {
            (ns, key): value if isinstance(value, dict) else json.loads(value) for ns, key, value in items
        }
        rows = await uow.session.execute(
            sa.text("SELECT namespace, key, field, embedding FROM graph_store_vectors")
        )
        vectors: dict[Where, dict[str, list[float]]] = {}
        for ns, key, field, embedding in rows:
            vectors.setdefault((ns, key), {})[field] = decode(embedding) if decode else embedding
    assert set(vectors) <= set(values)  # no embedding without its item
    for where, value in values.items():  # each item whole: its embeddings are its value's
        expected = dict(zip(("a", "b"), embed([value["a"], value["b"]]), strict=True))
        assert set(vectors[where]) == {"a", "b"}, where
        for field, vector in vectors[where].items():
            assert vector == pytest.approx(expected[field], abs=1e-5)
    return values


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
    values = await _stored(db)
    for key, m in finished.items():  # a put that returned is there, or a later one replaced it
        assert values["zoo", key]["n"] >= m
    await memories.aput(("zoo",), "after", _value(0))  # the next call works
    found = await memories.asearch(("zoo",), query="cat 0", limit=1)
    assert found[0].key in {"after", *(key for _, key in values)}


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


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
async def test_puts_from_threads_running_asyncio_run_beside_the_main_loop_cancel_cleanly(
    db: Database, store: Store
) -> None:
    """Each worker thread runs `asyncio.run`: sync `put`/`get`, and `aput`s its own loop cancels.

    Its loop cancels by `asyncio.wait_for` and by `task.cancel()`, while the main
    loop puts through the same `Database` and store: every item ends whole (its
    embeddings its value's) or as before, and every pool lets go.
    """
    memories = await _store(db)
    # The sync calls block the thread's loop: a store that allows it (by default they refuse there).
    blocking = MemormStore(db, agent=memories.agent_id, index=memories.index_config, allow_blocking=True)
    cancelled = [0] * SYNC_THREADS

    async def in_thread(index: int) -> None:
        for n in range(1, SYNC_RUNS + 1):
            blocking.put(("sync", str(index)), f"k{n}", _value(n))  # memorm's sync loop, from here
            found = blocking.get(("sync", str(index)), f"k{n}")
            assert found is not None
            assert found.value == _value(n)
            put = memories.aput(("cancelled", str(index)), f"k{n % 4}", _value(n))
            try:
                if n % 2:
                    await asyncio.wait_for(put, 0.0005 * (n % 6))
                else:
                    task = asyncio.ensure_future(put)
                    await asyncio.sleep(0.0005 * (n % 6))
                    task.cancel()
                    await task
            except (asyncio.TimeoutError, asyncio.CancelledError):
                cancelled[index] += 1

    async def main_loop_put(n: int) -> None:
        await memories.aput(("main",), f"k{n % 5}", _value(n))

    main_puts = await beside_threads(SYNC_THREADS, in_thread, main_loop_put)
    assert sum(cancelled) > 0  # the threads' own cancellations did land
    assert main_puts > 0
    await _stored(db)  # every item whole
    for index in range(SYNC_THREADS):
        listed = await memories.asearch(("sync", str(index)), limit=100)
        assert sorted(item.key for item in listed) == sorted(f"k{n}" for n in range(1, SYNC_RUNS + 1))
    await adispose_sync(db)  # the sync loop's pool, then the main loop's: both let go of everything
    await assert_clean(db, store)
