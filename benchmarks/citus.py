"""memorm on the local Citus cluster against single-node Postgres, in the same run.

The same data and memorm calls on a distributed database (a coordinator and
two workers from ../shared/recipes/citus-cluster, on this machine's cores)
and on the single Postgres server.  Both Databases know their session's
agent (warm routing), so on the cluster every call goes to one shard.  The
"raw" column is single-node Postgres: the rows report what routing through
the coordinator adds (goal: at most 1.5x).  Skipped without a cluster.

1. The chat path and searches of one agent (2,000 messages, 1,000 passages
   of 64 dimensions), the sides taking turns call by call.
2. HNSW: 16 agents of 2,500 passages each (4 with ``--quick``), 384-d
   clustered embeddings (``benchmarks.archival.make_corpus``), one index built
   by ``ensure_index`` on each side (on the cluster: one per shard, built on
   the workers); then ``search(k=10)`` at ``ef_search`` 40 and 100, the
   queries going round the agents.  Recall@10 is against the exact top 10 of
   the agent's own passages (numpy, float64), and the notes say whether each
   side's plan used the index.
3. Throughput: 200 sessions (one agent each) talking at once, each an
   asyncio task doing turns (append one message in a unit of work, then read
   a window of 20 in a read-only one) on one shared Database with a pool of
   32 connections, for a fixed time, the sides taking turns twice.  Reported:
   turns per second on each side, their ratio, the median turn latency, and
   how evenly the sessions were served: SQLAlchemy's pool hands a returned
   connection to whoever asks next, and a task that checks out again at once
   (its next unit of work) beats the waiters, so a few sessions take most
   turns.
"""

from __future__ import annotations

import random
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import numpy as np
from sqlalchemy import text

from benchmarks.archival_data import make_corpus, recall
from benchmarks.chat_data import make_messages
from benchmarks.chat_memorm import chat_operations, reading
from benchmarks.report import Row
from benchmarks.stores import Store, statements_sent, store
from benchmarks.timing import Samples, timed
from memorm import Database

NAME = "citus"
TARGET = 1.5
HISTORY = 2_000
PASSAGES = 1_000
DIM = 64
HNSW_MODEL = "hnsw"  # its own partial index: the exact-search row's passages stay unindexed
K = 10
EF_SEARCHES = (40, 100)
SESSIONS = 200
POOL = 32  # connections per Database: the single server allows 100, shared with others
_RECIPES = (Path(__file__).resolve().parents[2] / "shared" / "recipes", Path("/work/shared/recipes"))


@dataclass
class Size:
    reps: int  # calls per chat-path operation and side
    agents: int  # HNSW: agents ...
    per_agent: int  # ... of this many passages each
    queries: int
    seconds: float  # throughput: each side's time in each of its two turns


FULL = Size(reps=200, agents=16, per_agent=2_500, queries=100, seconds=10.0)
QUICK = Size(reps=30, agents=4, per_agent=2_500, queries=20, seconds=2.0)


def _recipe() -> Path | None:
    for folder in _RECIPES:
        if (folder / "citus-cluster").is_file():
            return folder / "citus-cluster"
    return None


async def _fill(db: Database, rng: random.Random) -> tuple[uuid.UUID, uuid.UUID]:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("bench")
        chat = await uow.sessions.create(agent.id)
        await uow.messages.append(chat.id, make_messages(HISTORY))
        items = [
            {"text": f"passage {i} common words", "embedding": [rng.uniform(-1, 1) for _ in range(DIM)]}
            for i in range(PASSAGES)
        ]
        await uow.passages.add_many(agent.id, items)
    return agent.id, chat.id


async def bench_chat(dbs: dict[str, Database], reps: int) -> list[Row]:
    """Each chat-path operation on both sides, taking turns call by call."""
    rng = random.Random(11)
    query = [rng.uniform(-1, 1) for _ in range(DIM)]
    sides = {side: await _fill(db, rng) for side, db in dbs.items()}
    ops = {side: chat_operations(*ids, query) for side, ids in sides.items()}
    rows = []
    for operation in ops["cluster"]:
        on_cluster, on_single = Samples(), Samples()
        for _ in range(5):
            await ops["cluster"][operation](dbs["cluster"])
            await ops["single"][operation](dbs["single"])
        for _ in range(reps):
            await timed(lambda op=ops["cluster"][operation]: op(dbs["cluster"]), on_cluster)
            await timed(lambda op=ops["single"][operation]: op(dbs["single"]), on_single)
        rows.append(
            Row(
                NAME,
                "postgres",
                f"{operation}: Citus vs one server",
                on_cluster,
                on_single,
                target=TARGET,
                note="raw column: the same memorm call on single-node Postgres",
            )
        )
    return rows


# -- HNSW -----------------------------------------------------------------------------------------


async def _search(db: Database, agent: uuid.UUID, query: list[float], ef_search: int) -> list[uuid.UUID]:
    hits = await reading(
        db, lambda u: u.passages.search(agent, query, k=K, embedding_model=HNSW_MODEL, ef_search=ef_search)
    )
    return [hit.passage.id for hit in hits]


async def _plan(db: Database, agent: uuid.UUID, query: list[float]) -> str:
    """EXPLAIN of the nearest-neighbour statement memorm sends (on Citus: with the worker's plan)."""
    with statements_sent(db, "ORDER BY distance") as sent:
        async with db.unit_of_work(read_only=True) as uow:
            await uow.passages.search(agent, query, k=K, embedding_model=HNSW_MODEL)
            statement, parameters = sent[-1]
            driver = (await (await uow.session.connection()).get_raw_connection()).driver_connection
            # ANALYZE: a plain EXPLAIN with parameters fails on the Citus worker ("could
            # not determine data type of parameter $1") and breaks the transaction.
            plan = await driver.fetch(f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) {statement}", *parameters)
    return "\n".join(row[0] for row in plan)


async def bench_hnsw(dbs: dict[str, Database], size: Size) -> list[Row]:
    """HNSW search on the cluster (an index per shard) against one server (one index)."""
    corpus = make_corpus(size.agents * size.per_agent, size.queries)
    dim = corpus.vectors.shape[1]
    agents: dict[str, list[uuid.UUID]] = {side: [] for side in dbs}
    ids: dict[str, list[list[uuid.UUID]]] = {side: [] for side in dbs}
    for n in range(size.agents):
        items = [
            {**item, "embedding_model": HNSW_MODEL}
            for item in corpus.items(n * size.per_agent, (n + 1) * size.per_agent)
        ]
        for side, db in dbs.items():
            async with db.unit_of_work() as uow:
                agent = await uow.agents.create(f"hnsw-{n}")
                added = await uow.passages.add_many(agent.id, items)
            agents[side].append(agent.id)
            ids[side].append([passage.id for passage in added])
    rows = []
    built: dict[str, Samples] = {side: Samples() for side in dbs}
    names = {}
    for side, db in dbs.items():

        async def ensure(db: Database = db) -> str:
            async with db.unit_of_work() as uow:
                return await uow.passages.ensure_index(HNSW_MODEL, dim, "cosine")

        names[side] = await timed(ensure, built[side])
        async with db.engine.connect() as connection:  # on Citus, ANALYZE runs on every shard
            await connection.execute(text("ANALYZE archival_passages"))
            await connection.commit()
    count = size.agents * size.per_agent
    rows.append(
        Row(
            NAME,
            "postgres",
            f"HNSW build {count:,} x {dim}-d: Citus vs one server",
            built["cluster"],
            built["single"],
            rows=count,
            note=f"ensure_index, m=16, ef_construction=64; {size.agents} agents of {size.per_agent:,}; "
            "on Citus an index per shard, built on the workers",
        )
    )
    used = {side: 0 for side in dbs}  # agents whose search plan walks the index (a shard's, on Citus)
    for side, db in dbs.items():
        for n, agent in enumerate(agents[side]):
            used[side] += names[side] in await _plan(db, agent, corpus.query(n))
    # The ground truth: the exact top K of the query's agent's own passages.
    truth = []
    for index in range(size.queries):
        n = index % size.agents
        mine = corpus.vectors[n * size.per_agent : (n + 1) * size.per_agent].astype(np.float64)
        scores = mine @ corpus.queries[index].astype(np.float64)
        truth.append(np.argsort(-scores)[:K].tolist())
    for ef_search in EF_SEARCHES:
        samples = {side: Samples() for side in dbs}
        got = {side: 0.0 for side in dbs}
        for at in range(3):  # warm-up: buffers, prepared statements
            for side, db in dbs.items():
                await _search(db, agents[side][at % size.agents], corpus.query(at), ef_search)
        for at in range(size.queries):
            n, query = at % size.agents, corpus.query(at)
            for side in ("cluster", "single") if at % 2 else ("single", "cluster"):
                found = await timed(
                    lambda s=side, a=agents[side][n], q=query, e=ef_search: _search(dbs[s], a, q, e),
                    samples[side],
                )
                got[side] += recall(found, [ids[side][n][i] for i in truth[at]])
        recalls = {side: got[side] / size.queries for side in dbs}
        rows.append(
            Row(
                NAME,
                "postgres",
                f"HNSW search k={K} ef_search={ef_search}: Citus vs one server",
                samples["cluster"],
                samples["single"],
                rows=K,
                target=TARGET,
                note=f"recall@{K}: Citus {recalls['cluster']:.3f}, one server {recalls['single']:.3f}; "
                f"the index used for {used['cluster']} (Citus) and {used['single']} (one server) "
                f"of the {size.agents} agents; {size.queries} queries going round them",
            )
        )
    return rows


# -- throughput -----------------------------------------------------------------------------------


async def _turn(db: Database, chat: uuid.UUID) -> None:
    async with db.unit_of_work() as uow:
        await uow.messages.append(chat, {"role": "user", "content": "one more turn of common words"})
    async with db.unit_of_work(read_only=True) as uow:
        await uow.messages.window(chat, limit=20)


async def _talk(
    db: Database, chats: Sequence[uuid.UUID], seconds: float, samples: Samples, turns: dict[uuid.UUID, int]
) -> float:
    """Every session in its own task, turn after turn, for `seconds`; the time it took.

    Counts each session's turns in `turns`.
    """
    deadline = time.perf_counter() + seconds

    async def talker(chat: uuid.UUID) -> None:
        while time.perf_counter() < deadline:
            await timed(lambda: _turn(db, chat), samples)
            turns[chat] += 1

    started = time.perf_counter()
    async with anyio.create_task_group() as group:
        for chat in chats:
            group.start_soon(talker, chat)
    return time.perf_counter() - started


async def bench_throughput(urls: dict[str, tuple[str, dict[str, Any]]], seconds: float) -> list[Row]:
    """SESSIONS sessions talking at once over one Database per side, with a pool of POOL connections."""
    dbs = {
        side: Database(url, **options, pool_size=POOL, max_overflow=0)
        for side, (url, options) in urls.items()
    }
    try:
        chats: dict[str, list[uuid.UUID]] = {side: [] for side in dbs}
        for side, db in dbs.items():
            async with db.unit_of_work() as uow:  # sessions this Database made: their agents are known
                for n in range(SESSIONS):
                    agent = await uow.agents.create(f"talker-{n}")
                    chat = await uow.sessions.create(agent.id)
                    await uow.messages.append(chat.id, make_messages(20))
                    chats[side].append(chat.id)
            async with anyio.create_task_group() as group:  # warm-up: a turn each, the pool filled
                for chat in chats[side]:
                    group.start_soon(_turn, db, chat)
        samples = {side: Samples() for side in dbs}
        turns = {side: dict.fromkeys(chats[side], 0) for side in dbs}
        elapsed = {side: 0.0 for side in dbs}
        for order in (("cluster", "single"), ("single", "cluster")):
            for side in order:
                elapsed[side] += await _talk(dbs[side], chats[side], seconds, samples[side], turns[side])
    finally:
        for db in dbs.values():
            await db.dispose()
    rate = {side: sum(turns[side].values()) / elapsed[side] for side in dbs}
    spread = {}  # how evenly the pool served the sessions
    for side in dbs:
        counts = sorted(turns[side].values())
        p99 = sorted(samples[side].seconds)[int(len(samples[side].seconds) * 0.99)]
        spread[side] = f"{counts[0]}/{counts[len(counts) // 2]}/{counts[-1]}, p99 {p99:.1f} s"
    return [
        Row(
            NAME,
            "postgres",
            f"{SESSIONS} sessions at once, turn latency: Citus vs one server",
            samples["cluster"],
            samples["single"],
            note=f"throughput: Citus {rate['cluster']:,.0f} turns/s, "
            f"one server {rate['single']:,.0f} turns/s "
            f"(one server / Citus {rate['single'] / rate['cluster']:.2f}x); a turn: append one message "
            f"(a unit of work), then window(limit=20) (read-only); {SESSIONS} asyncio tasks on one "
            f"Database, pool {POOL} (a turn's latency includes its wait for a connection), "
            f"{2 * seconds:g} s per side; turns per session min/median/max: Citus {spread['cluster']}, "
            f"one server {spread['single']} (the pool does not serve its waiters in turn)",
        )
    ]


async def run(engines: Sequence[str], *, quick: bool = False) -> list[Row]:
    recipe = _recipe()
    if "postgres" not in engines or recipe is None:
        return []
    name = f"memorm_bench_{uuid.uuid4().hex[:8]}"
    try:
        made = await anyio.run_process([str(recipe), "newdb", name], check=True)
    except (OSError, subprocess.CalledProcessError):
        return []  # no cluster: nothing to compare
    url = made.stdout.decode().strip().splitlines()[-1]
    cluster = Database(url)
    size = QUICK if quick else FULL
    rows: list[Row] = []
    try:
        async with store("postgres") as where:
            single = where.database()
            try:
                await cluster.upgrade()
                await cluster.distribute()
                await single.create_all()
                dbs = {"cluster": cluster, "single": single}
                rows += await bench_chat(dbs, size.reps)
                rows += await bench_hnsw(dbs, size)
                rows += await bench_throughput(_urls(url, where), size.seconds)
            finally:
                await single.dispose()
    finally:
        await cluster.dispose()
        await anyio.run_process([str(recipe), "dropdb", name], check=False)
    return rows


def _urls(cluster: str, where: Store) -> dict[str, tuple[str, dict[str, Any]]]:
    return {"cluster": (cluster, {}), "single": (where.url, dict(where.options))}
