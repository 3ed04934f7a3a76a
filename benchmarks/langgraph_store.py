"""LangGraph's long-term store on memorm against LangGraph's own stores.

Issue #17's goal: `MemormStore` no slower than LangGraph's stores on the same
engine.  Each side has a store of its own; the two alternate call by call.

* Postgres: `AsyncPostgresStore` (`langgraph-checkpoint-postgres`, on a
  psycopg pool set up as LangGraph's docs say), without and with an index
  (pgvector, the same embedding function on both sides; each side's
  `setup()` builds its HNSW index).
* SQLite: `AsyncSqliteStore` (`langgraph-checkpoint-sqlite`, its own
  aiosqlite connection, WAL and `synchronous=NORMAL` as memorm's) without an
  index.  Its semantic search needs the sqlite-vec extension, which this machine's Python cannot load, so the
  indexed rows compare memorm with `InMemoryStore` (LangGraph's dict in
  memory, no database): no target there, for scale only.

Operations, over a namespace of `ITEMS` memories (a sentence of varied text,
a `kind` out of five, a number):

* `aput` of a new memory (embedded, with an index: the embedding is part of
  the work on both sides);
* `aget` of one;
* `asearch` with a filter on `kind` (a fifth of the items), 10 results;
* with an index, `asearch` by a query, 10 results.

The raw column is LangGraph's store; the target is 1.0 (no slower).
"""

from __future__ import annotations

import hashlib
import math
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from langgraph.store.base import BaseStore, PutOp

from benchmarks.report import Row
from benchmarks.stores import Store, asyncpg_dsn, like_memorm, store
from benchmarks.timing import alternate
from memorm.compat.langgraph import MemormStore

NAME = "langgraph_store"
TARGET = 1.0  # issue #17: no slower than LangGraph's own libraries
ITEMS = 1_000
DIMS = 64
NAMESPACE = ("users", "u-1", "memories")
KINDS = ("food", "travel", "work", "family", "music")
WORDS = [
    "likes",
    "prefers",
    "visited",
    "remembers",
    "mentioned",
    "birthday",
    "coffee",
    "tea",
    "pasta",
    "sushi",
    "tokyo",
    "lisbon",
    "guitar",
    "piano",
    "deadline",
    "project",
    "manager",
    "sister",
    "brother",
    "jazz",
    "hiking",
    "morning",
    "evening",
]


def embed(texts: Sequence[str]) -> list[list[float]]:
    """A cheap deterministic embedding (hashed words), the same on both sides."""
    vectors = []
    for text in texts:
        vector = [0.0] * DIMS
        for word in text.split():
            digest = hashlib.blake2b(word.encode(), digest_size=4).digest()
            vector[int.from_bytes(digest[:2], "little") % DIMS] += 1.0 if digest[2] & 1 else -1.0
        norm = math.sqrt(sum(value * value for value in vector)) or 1.0
        vectors.append([value / norm for value in vector])
    return vectors


INDEX: dict[str, Any] = {"dims": DIMS, "embed": embed, "fields": ["text"]}


def memory(rng: random.Random, number: int) -> dict[str, Any]:
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14)))
    return {"text": f"{text} ({number})", "kind": KINDS[number % len(KINDS)], "number": number}


@asynccontextmanager
async def _memorm(where: Store, *, indexed: bool) -> AsyncIterator[BaseStore]:
    db = where.database()
    await db.create_all()
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create(f"store-{uuid.uuid4().hex[:8]}")
    store = MemormStore(db, agent=agent.id, index=INDEX if indexed else None)
    await store.asetup()  # the HNSW index on Postgres, as AsyncPostgresStore.setup() builds one
    try:
        yield store
    finally:
        await db.dispose()


@asynccontextmanager
async def _langgraph(where: Store, *, indexed: bool) -> AsyncIterator[tuple[BaseStore, str]]:
    """LangGraph's store for the engine, in tables of its own; and what it is."""
    if where.engine == "sqlite" and indexed:
        from langgraph.store.memory import InMemoryStore

        yield InMemoryStore(index=INDEX), "InMemoryStore (a dict in memory; no target)"  # type: ignore[arg-type]
        return
    if where.engine == "sqlite":
        import aiosqlite
        from langgraph.store.sqlite.aio import AsyncSqliteStore

        assert where.path is not None
        path = Path(where.path).with_name("langgraph-store.db")
        async with aiosqlite.connect(path, isolation_level=None) as connection:  # as from_conn_string
            await like_memorm(connection)
            sqlite_store = AsyncSqliteStore(connection)
            await sqlite_store.setup()
            yield sqlite_store, "langgraph-checkpoint-sqlite's AsyncSqliteStore"
        return
    from langgraph.store.postgres.aio import AsyncPostgresStore
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    assert where.schema is not None
    dsn = asyncpg_dsn() + f"?options=-csearch_path%3D{where.schema},public"
    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    async with AsyncConnectionPool(dsn, kwargs=kwargs, min_size=1, max_size=4, open=False) as pool:
        postgres_store = AsyncPostgresStore(pool, index=INDEX if indexed else None)  # type: ignore[arg-type]
        await postgres_store.setup()
        yield postgres_store, "langgraph-checkpoint-postgres's AsyncPostgresStore"


async def _analyze(where: Store) -> None:
    """ANALYZE both sides' tables (memorm's and LangGraph's) in the store's schema."""
    connection = await where.raw_postgres()
    try:
        tables = await connection.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = $1 AND tablename LIKE ANY ($2)",
            where.schema,
            ["graph_store_%", "store%"],
        )
        for row in tables:
            await connection.execute(f'ANALYZE "{where.schema}"."{row[0]}"')
    finally:
        await connection.close()


def _operations(
    target: BaseStore, rng: random.Random, keys: list[str], *, indexed: bool
) -> dict[str, Callable[[], Awaitable[Any]]]:
    async def put() -> None:
        await target.aput(NAMESPACE, str(uuid.uuid4()), memory(rng, rng.randrange(10**6)))

    async def get() -> None:
        found = await target.aget(NAMESPACE, rng.choice(keys))
        assert found is not None

    async def by_filter() -> None:
        found = await target.asearch(NAMESPACE, filter={"kind": rng.choice(KINDS)}, limit=10)
        assert len(found) == 10

    async def by_query() -> None:
        found = await target.asearch(NAMESPACE, query=memory(rng, 0)["text"], limit=10)
        assert len(found) == 10

    operations: dict[str, Callable[[], Awaitable[Any]]] = {
        "aget": get,
        "asearch, filter on kind, 10": by_filter,
    }
    if indexed:
        operations["asearch by query, 10 (vector)"] = by_query
    operations["aput (embedded)" if indexed else "aput"] = put  # last: it grows the namespace
    return operations


async def run(engines: Sequence[str], *, quick: bool = False) -> list[Row]:
    reps = 30 if quick else 300
    rows: list[Row] = []
    for engine in engines:
        for indexed in (False, True):
            async with AsyncExitStack() as stack:
                where = await stack.enter_async_context(store(engine))
                ours = await stack.enter_async_context(_memorm(where, indexed=indexed))
                theirs, label = await stack.enter_async_context(_langgraph(where, indexed=indexed))
                seed = random.Random(11)
                items = [(f"m-{number}", memory(seed, number)) for number in range(ITEMS)]
                for target in (ours, theirs):  # the same items on both sides, in batches
                    for start in range(0, ITEMS, 100):
                        await target.abatch(
                            [PutOp(NAMESPACE, key, value) for key, value in items[start : start + 100]]
                        )
                if engine == "postgres":  # statistics for the planner on both sides, as autovacuum keeps them
                    await _analyze(where)
                keys = [key for key, _ in items]
                mine = _operations(ours, random.Random(5), keys, indexed=indexed)
                other = _operations(theirs, random.Random(5), keys, indexed=indexed)
                like_for_like = not (engine == "sqlite" and indexed)
                for name in mine:
                    for _ in range(5):  # warm-up: connections, prepared statements
                        await mine[name]()
                        await other[name]()
                    ours_samples, their_samples = await alternate((mine[name], other[name]), reps)
                    rows.append(
                        Row(
                            NAME,
                            engine,
                            f"{name}{', index' if indexed else ''}",
                            ours_samples,
                            their_samples,
                            target=TARGET if like_for_like else None,
                            note=f"raw column: {label}",
                        )
                    )
    return rows
