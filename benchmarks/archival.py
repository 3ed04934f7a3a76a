"""Archival memory: bulk insert, HNSW search on Postgres, numpy search on SQLite.

Data: 100,000 passages (20,000 with ``--quick``) of one agent, each a short
text and a 384-d embedding.  The embeddings are clustered like real ones: a
mixture of 300 Gaussian clusters of uneven size around random unit centres,
each cluster's noise following a power-law spectrum (per-axis scale
``i ** -0.5``, axes shuffled per cluster, so the data has a few dozen
effective dimensions rather than 384), then unit-normalised; a passage's
nearest neighbours have cosine similarity about 0.8, an unrelated passage
about 0.  The 100 queries are drawn near cluster centres (centre plus half a
cluster's noise), never copies of stored vectors.  Everything is seeded.

1. Bulk insert: ``uow.passages.add_many`` of 10,000 passages per unit of work
   against the raw driver doing the same work by hand, in a second store that
   grows in step: the ``agents.archive_version`` bump, the embedding model's
   lookup (registered by the first batch), and every column encoded the way
   memorm stores it (SQLite: ``executemany`` with 32-hex uuids,
   ``YYYY-MM-DD HH:MM:SS.ffffff`` text, JSON text, little-endian float32
   bytes; Postgres: ``COPY`` via ``copy_records_to_table`` with pgvector's
   binary codec, native uuid and timestamptz, jsonb as text).  Both pay the
   full-text triggers (SQLite) or GIN index (Postgres).  Target: 1.5x.
2. Postgres: exact search (no index; memorm against a raw ``ORDER BY
   embedding <=> q LIMIT 10``), then ``ensure_index`` (HNSW, m=16,
   ef_construction=64) and its build time, then search at the default
   ``ef_search`` (40) and at 100.  The raw side is the same single query a
   raw asyncpg caller sends (the passage's columns and the distance, decoded
   to dicts; the partial index's predicate as literals), on a connection
   set up once with ``hnsw.ef_search = 40`` and ``hnsw.iterative_scan =
   strict_order``; at ``ef_search`` 100 both sides set it per search
   (raw: ``BEGIN``, ``SET LOCAL``, the query, ``COMMIT``).  Recall's truth
   is numpy's exact top 10 in float64.  Targets: memorm within 1.3x of raw,
   recall@10 >= 0.95, and a median latency at least 5x below memorm's exact
   search.
3. SQLite: warm search (vector cache loaded) in a read-only unit of work
   against plain numpy on the same float32 matrix (pre-normalised; per query:
   normalise, matmul, argpartition, sort the top 10).  Target: 2x.  Cold search
   (the first after a write, which reloads the matrix) is reported against a
   raw reload (``SELECT id, embedding`` + ``np.frombuffer``) plus the numpy
   search, without a target.

The data is :mod:`benchmarks.archival_data`, scenario 1
:mod:`benchmarks.archival_insert`, scenarios 2 and 3
:mod:`benchmarks.archival_search`; the raw side :mod:`benchmarks.raw.passages`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from benchmarks.archival_data import DIM, FULL, QUICK, Corpus, Size, make_corpus
from benchmarks.archival_insert import bench_insert, check_equivalence, new_agent
from benchmarks.archival_search import bench_postgres_search, bench_sqlite_search
from benchmarks.raw.passages import RawPostgres, RawSQLite
from benchmarks.report import Row
from benchmarks.stores import store


async def run_engine(engine: str, corpus: Corpus, size: Size) -> list[Row]:
    rows: list[Row] = []
    async with store(engine) as where:
        db = where.database()
        raw: RawSQLite | RawPostgres | None = None
        try:
            await db.create_all()
            raw = (
                RawSQLite(await where.raw_sqlite())
                if engine == "sqlite"
                else await RawPostgres.open(where, DIM)
            )
            await check_equivalence(db, raw)
            agent_id = await new_agent(db, "archival")
            # The raw side fills a second store, growing in step with memorm's.
            async with store(engine) as other:
                raw_db = other.database()
                try:
                    await raw_db.create_all()
                    raw_agent = await new_agent(raw_db, "archival-raw")
                    raw_store = (
                        RawSQLite(await other.raw_sqlite())
                        if engine == "sqlite"
                        else await RawPostgres.open(other, DIM)
                    )
                    try:
                        started = time.perf_counter()
                        row, ids = await bench_insert(db, raw_store, raw_agent, agent_id, engine, corpus)
                        row.note += f"; {time.perf_counter() - started:.1f} s wall"
                        rows.append(row)
                    finally:
                        await raw_store.close()
                finally:
                    await raw_db.dispose()
            if isinstance(raw, RawPostgres):
                rows += await bench_postgres_search(db, raw, agent_id, corpus, ids)
            else:
                rows += await bench_sqlite_search(db, raw, agent_id, corpus, ids, size)
        finally:
            if raw is not None:
                await raw.close()
            await db.dispose()
    return rows


async def run(engines: Sequence[str], *, quick: bool = False) -> list[Row]:
    """Every archival benchmark on each engine in ``engines``."""
    size = QUICK if quick else FULL
    corpus = make_corpus(size.passages, size.queries)
    rows: list[Row] = []
    for engine in engines:
        rows += await run_engine(engine, corpus, size)
    return rows
