"""Archival scenarios 2 and 3: HNSW search on Postgres, and warm and cold search on SQLite against numpy."""

from __future__ import annotations

import gc
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.archival_data import DIM, NAME, Corpus, Size, exact_top, recall, unit
from benchmarks.archival_insert import memorm_add
from benchmarks.raw.passages import MODEL, K, NumpySearch, RawPostgres, RawSQLite
from benchmarks.report import Row, format_seconds
from benchmarks.stores import statements_sent
from benchmarks.timing import Samples, timed
from memorm import Database

EF_SEARCHES = (None, 100)  # None: the connection's default, 40
WARM_TARGET = 1.5  # issue #16: SQLite warm vector search within 1.5x of numpy float32
RECALL_TARGET = 0.95
SPEEDUP_TARGET = 5.0
HNSW_TARGET = 1.3  # memorm's HNSW search against the same single raw query


async def memorm_search(
    db: Database, agent_id: uuid.UUID, query: Sequence[float], *, ef_search: int | None = None
) -> list[uuid.UUID]:
    async with db.unit_of_work(read_only=True) as uow:
        hits = await uow.passages.search(agent_id, query, k=K, ef_search=ef_search)
    return [hit.passage.id for hit in hits]


async def explain(raw: RawPostgres, sql: str, parameters: Sequence[Any]) -> str:
    return "\n".join(row[0] for row in await raw.connection.fetch("EXPLAIN " + sql, *parameters))


async def explain_memorm_search(
    db: Database, raw: RawPostgres, agent_id: uuid.UUID, query: list[float]
) -> tuple[str, int]:
    """The plan of the nearest-neighbour statement memorm sends for ``query`` (captured, then
    EXPLAINed), and how many statements the search sent in all."""
    await memorm_search(db, agent_id, query)  # warm: the model is cached on the Database
    with statements_sent(db, "") as sent:
        await memorm_search(db, agent_id, query)
    vector = [(statement, parameters) for statement, parameters in sent if "<=>" in statement]
    if len(vector) != 1:
        return f"(captured {len(vector)} vector statements)", len(sent)
    statement, parameters = vector[0]
    return await explain(raw, statement, parameters), len(sent)


def _uses(plan: str, index_name: str) -> str:
    if index_name in plan:
        return "yes"
    if plan.startswith("("):
        return f"unknown {plan}"
    first = plan.splitlines()[0] if plan else ""
    scan = next((line.strip().removeprefix("->  ") for line in plan.splitlines() if "Scan" in line), first)
    return f"NO ({scan.split('  (')[0]})"


async def bench_postgres_search(
    db: Database, raw: RawPostgres, agent_id: uuid.UUID, corpus: Corpus, ids: list[uuid.UUID]
) -> list[Row]:
    await raw.connection.execute("ANALYZE archival_passages")
    queries = [corpus.query(i) for i in range(len(corpus.queries))]
    count = len(ids)
    # Exact search: no index yet.  memorm's results are the ground truth.
    for query in queries[:3]:  # warm-up: buffers, prepared statements
        await memorm_search(db, agent_id, query)
        await raw.search(agent_id, query)
    exact_memorm, exact_raw = Samples(), Samples()
    truth = [[ids[i] for i in exact_top(corpus, vector)] for vector in corpus.queries]  # float64
    agree_raw = agree_numpy = 0.0
    for index, query in enumerate(queries):
        if index % 2:
            found_raw = await timed(lambda q=query: raw.search(agent_id, q), exact_raw)
            found = await timed(lambda q=query: memorm_search(db, agent_id, q), exact_memorm)
        else:
            found = await timed(lambda q=query: memorm_search(db, agent_id, q), exact_memorm)
            found_raw = await timed(lambda q=query: raw.search(agent_id, q), exact_raw)
        agree_raw += recall([hit["id"] for hit in found_raw], found)
        agree_numpy += recall(truth[index], found)
    rows = [
        Row(
            NAME,
            "postgres",
            f"exact search k={K} of {count:,}, no index",
            exact_memorm,
            exact_raw,
            rows=K,
            note=f"raw: one ORDER BY embedding <=> q LIMIT {K}; results agree (recall@{K}) with raw "
            f"{agree_raw / len(queries):.3f}, with float64 numpy {agree_numpy / len(queries):.3f}",
        )
    ]

    build = Samples()

    async def ensure() -> str:
        async with db.unit_of_work() as uow:
            return await uow.passages.ensure_index(MODEL, DIM, "cosine")

    index_name = await timed(ensure, build)
    raw_plan = await explain(raw, raw.search_statement, (queries[0], agent_id, K))
    memorm_plan, statements = await explain_memorm_search(db, raw, agent_id, queries[0])
    rows.append(
        Row(
            NAME,
            "postgres",
            f"HNSW build {count:,} x {DIM}-d (m=16, ef_c=64)",
            build,
            rows=count,
            note=f"{build.median:.1f} s, {count / build.median:,.0f} vectors/s; the index is used by "
            f"the raw query: {_uses(raw_plan, index_name)}, "
            f"by memorm's search: {_uses(memorm_plan, index_name)}; memorm sends {statements} "
            f"statement(s) per search (raw: 1)",
        )
    )
    for ef_search in EF_SEARCHES:
        for query in queries[:3]:
            await memorm_search(db, agent_id, query, ef_search=ef_search)
            await raw.search(agent_id, query, ef_search=ef_search)
        ours, theirs = Samples(), Samples()
        got = got_raw = 0.0
        for index, query in enumerate(queries):
            if index % 2:
                found_raw = await timed(
                    lambda q=query, e=ef_search: raw.search(agent_id, q, ef_search=e), theirs
                )
                found = await timed(
                    lambda q=query, e=ef_search: memorm_search(db, agent_id, q, ef_search=e), ours
                )
            else:
                found = await timed(
                    lambda q=query, e=ef_search: memorm_search(db, agent_id, q, ef_search=e), ours
                )
                found_raw = await timed(
                    lambda q=query, e=ef_search: raw.search(agent_id, q, ef_search=e), theirs
                )
            got += recall(found, truth[index])
            got_raw += recall([hit["id"] for hit in found_raw], truth[index])
        got /= len(queries)
        got_raw /= len(queries)
        speedup = exact_memorm.median / ours.median
        ratio = ours.median / theirs.median
        met = got >= RECALL_TARGET and speedup >= SPEEDUP_TARGET and ratio <= HNSW_TARGET
        rows.append(
            Row(
                NAME,
                "postgres",
                f"HNSW search k={K} ef_search={ef_search or '40 (default)'}",
                ours,
                theirs,
                rows=K,
                status="PASS" if met else "MISS",
                note=f"{ratio:.2f}x raw (target <= {HNSW_TARGET:g}x); recall@{K} against float64 numpy "
                f"{got:.3f} (raw {got_raw:.3f}; target >= {RECALL_TARGET}); "
                f"{format_seconds(ours.median)} vs exact {format_seconds(exact_memorm.median)}: "
                f"{speedup:.1f}x faster (target >= {SPEEDUP_TARGET:g}x); raw: "
                + (
                    "the same single query on a connection set up once"
                    if ef_search is None
                    else "BEGIN, SET LOCAL hnsw.ef_search, the same query, COMMIT"
                ),
            )
        )
    return rows


async def bench_sqlite_search(
    db: Database, raw: RawSQLite, agent_id: uuid.UUID, corpus: Corpus, ids: list[uuid.UUID], size: Size
) -> list[Row]:
    queries = [corpus.query(i) for i in range(len(corpus.queries))]
    baseline = NumpySearch(corpus.vectors)
    count = len(ids)

    async def numpy_search(query: list[float]) -> np.ndarray:
        return baseline.search(query)

    for query in queries[:3]:  # warm-up: loads the vector cache
        await memorm_search(db, agent_id, query)
        await numpy_search(query)
    warm, plain = Samples(), Samples()
    agree = 0.0
    for index, query in enumerate(queries):
        if index % 2:
            positions = await timed(lambda q=query: numpy_search(q), plain)
            found = await timed(lambda q=query: memorm_search(db, agent_id, q), warm)
        else:
            found = await timed(lambda q=query: memorm_search(db, agent_id, q), warm)
            positions = await timed(lambda q=query: numpy_search(q), plain)
        agree += recall(found, [ids[i] for i in positions])
    rows = [
        Row(
            NAME,
            "sqlite",
            f"warm search k={K} of {count:,} (raw: numpy)",
            warm,
            plain,
            rows=K,
            target=WARM_TARGET,
            note=f"memorm {format_seconds(warm.median)} (read-only uow, cache warm, 10 passages loaded) vs "
            f"numpy {format_seconds(plain.median)} (normalise, matmul, argpartition); "
            f"results agree {agree / len(queries):.3f} (recall@{K})",
        )
    ]
    cold, reload = Samples(), Samples()
    for rep in range(size.cold_reps):
        query = queries[rep]
        fresh = unit(np.random.default_rng(rep).standard_normal((1, DIM), dtype=np.float32))
        await memorm_add(db, agent_id, [{"text": f"cold {rep}", "embedding": fresh[0].tolist()}])
        gc.collect()
        found = await timed(lambda q=query: memorm_search(db, agent_id, q), cold, collect=True)
        found_raw = await timed(lambda q=query: raw.cold_search(agent_id, q), reload, collect=True)
        if {i.hex for i in found} != set(found_raw):
            raise AssertionError("cold searches disagree")
    rows.append(
        Row(
            NAME,
            "sqlite",
            f"cold search k={K} of {count:,} after a write",
            cold,
            reload,
            rows=K,
            note=f"memorm {format_seconds(cold.median)} (reloads the matrix) vs raw "
            f"{format_seconds(reload.median)} (SELECT id, embedding + np.frombuffer + numpy search); "
            f"warm memorm {format_seconds(warm.median)}; no target",
        )
    )
    return rows
