"""What ``Database(url, transaction_pooling=True)`` costs, direct and behind PgBouncer (Postgres).

One database of its own per run (PgBouncer refuses a ``search_path`` at
startup, so not a schema): one agent, a session of 2,000 messages and 3,000
passages of 128 dimensions with no index (exact search).  The chat path's
cases of :func:`benchmarks.chat_memorm.chat_operations` (append one message in a
unit of work, ``window(limit=50)`` and ``context(max_tokens=2000)``
read-only, vector search k=10) each run on four sides, one call at a time,
the sides taking turns in a rotating order, all on the same rows:

a. memorm direct to Postgres, default options;
b. memorm direct with ``transaction_pooling=True``;
c. memorm through PgBouncer (transaction mode) with ``transaction_pooling=True``;
d. raw asyncpg through PgBouncer with ``statement_cache_size=0``
   (:mod:`benchmarks.raw.pooled`), the statements of :mod:`benchmarks.raw.chat`
   (and a hand-written nearest-neighbour ``SELECT``) sent as memorm sends them
   there: an append in a transaction, a window or context alone, a vector
   search in a read-only transaction whose ``BEGIN`` carries the ``SET LOCAL``s
   memorm sends, in one message.

Rows per case: c against d (what memorm adds behind the pooler) and b
against a (what the option itself costs: unnamed statements parsed on
every call, and a vector search's settings and transaction).
No goals: the numbers are reported for docs/production.md.  The module is
skipped, with a warning, when PgBouncer does not answer at
``MEMORM_BENCH_PGBOUNCER_URL`` (default ``…@127.0.0.1:6432``; its database
name is replaced by the run's).
"""

from __future__ import annotations

import os
import random
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial

import asyncpg
from sqlalchemy.engine import make_url

from benchmarks.chat_memorm import chat_operations, fill_session
from benchmarks.raw.pooled import Call, RawPooled
from benchmarks.report import Row
from benchmarks.stores import POSTGRES_URL, asyncpg_dsn
from benchmarks.timing import Samples, timed
from memorm import Database

NAME = "pooler"
POOLER_URL = os.environ.get("MEMORM_BENCH_PGBOUNCER_URL", "postgresql+asyncpg://root@127.0.0.1:6432/test")
HISTORY = 2_000
PASSAGES = 3_000
DIM = 128
K = 10
SIDES = ("direct", "direct, option", "pooler", "raw pooler")  # a, b, c, d


def _url(url: str, database: str) -> str:
    return make_url(url).set(database=database).render_as_string(hide_password=False)


async def pooler_unavailable() -> str | None:
    """Why PgBouncer cannot be used (None when it answers)."""
    try:
        connection = await asyncpg.connect(asyncpg_dsn(POOLER_URL), timeout=5, statement_cache_size=0)
    except Exception as error:
        return f"PgBouncer at {make_url(POOLER_URL)!r} does not answer: {error}"
    await connection.close()
    return None


@asynccontextmanager
async def fresh_database() -> AsyncIterator[str]:
    """A new database on the benchmark server, with pgvector and btree_gin; dropped afterwards."""
    name = f"memorm_bench_pooler_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(asyncpg_dsn())
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            setup = await asyncpg.connect(asyncpg_dsn(_url(POSTGRES_URL, name)))
            try:
                await setup.execute("CREATE EXTENSION vector; CREATE EXTENSION btree_gin")
            finally:
                await setup.close()
            yield name
        finally:
            # FORCE: PgBouncer may still hold server connections to it.
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def _fill(db: Database, rng: random.Random) -> tuple[uuid.UUID, uuid.UUID]:
    async with db.unit_of_work() as uow:
        agent = (await uow.agents.create("bench")).id
        chat = (await uow.sessions.create(agent)).id
    await fill_session(db, chat, HISTORY)
    async with db.unit_of_work() as uow:
        vectors = [[rng.uniform(-1.0, 1.0) for _ in range(DIM)] for _ in range(PASSAGES)]
        await uow.passages.add_many(
            agent, [{"text": f"passage {i}", "embedding": v} for i, v in enumerate(vectors)]
        )
    return agent, chat


async def check_equivalence(
    db: Database, raw: RawPooled, agent: uuid.UUID, chat: uuid.UUID, query: list[float]
) -> None:
    """Guard the comparison: memorm behind the pooler and the raw side read the same rows."""
    async with db.unit_of_work(read_only=True) as uow:
        ours = (
            [m.id for m in await uow.messages.window(chat, limit=50)],
            [m.id for m in await uow.messages.context(chat, max_tokens=2_000)],
            [hit.passage.id for hit in await uow.passages.search(agent, query, k=K)],
        )
    theirs = (
        [m["id"] for m in await raw.chat.window(chat, 50)],
        [m["id"] for m in await raw.chat.context(chat, 2_000)],
        [p["id"] for p in await raw.search(agent, query)],
    )
    for case, mine, raws in zip(("window", "context", "vector search"), ours, theirs, strict=True):
        if mine != raws or not mine:
            raise AssertionError(f"memorm and raw read different rows in {case}")


async def measure(calls: dict[str, Call], reps: int) -> dict[str, Samples]:
    """Each side's call `reps` times, one at a time, in a rotating order (reversed every other round)."""
    for call in calls.values():  # warm-up: pools, connections, buffers
        for _ in range(5):
            await call()
    samples = {side: Samples() for side in calls}
    sides = list(calls)
    for turn in range(reps):
        shift = turn % len(sides)
        order = sides[shift:] + sides[:shift]
        for side in order[:: -1 if (turn // len(sides)) % 2 else 1]:
            await timed(calls[side], samples[side])
    return samples


def rows_for(operation: str, samples: dict[str, Samples], load: tuple[float, float]) -> list[Row]:
    direct, option, pooler, raw = (samples[side] for side in SIDES)
    return [
        Row(
            NAME,
            "postgres",
            f"{operation}: via PgBouncer vs raw asyncpg via PgBouncer",
            pooler,
            raw,
            rows=1,
            note="raw column: asyncpg (statement_cache_size=0) via PgBouncer, the statements memorm sends; "
            f"load average {load[0]:.1f} -> {load[1]:.1f} on {os.cpu_count()} CPUs",
        ),
        Row(
            NAME,
            "postgres",
            f"{operation}: transaction_pooling=True vs default (direct)",
            option,
            direct,
            rows=1,
            note=f"raw column: memorm with default options, direct; via PgBouncer with the option: "
            f"{pooler.median / direct.median:.2f}x that",
        ),
    ]


async def run(engines: Sequence[str], *, quick: bool = False) -> list[Row]:
    """The pooler rows (Postgres only; none without PgBouncer)."""
    if "postgres" not in engines:
        return []
    reason = await pooler_unavailable()
    if reason is not None:
        print(f"warning: skipping {NAME}: {reason}", file=sys.stderr)
        return []
    reps = 40 if quick else 300
    rng = random.Random(5)
    query = [rng.uniform(-1.0, 1.0) for _ in range(DIM)]
    rows: list[Row] = []
    async with fresh_database() as name:
        direct_url, pooler_url = _url(POSTGRES_URL, name), _url(POOLER_URL, name)
        dbs = {
            "direct": Database(direct_url),
            "direct, option": Database(direct_url, transaction_pooling=True),
            "pooler": Database(pooler_url, transaction_pooling=True),
        }
        raw = None
        try:
            await dbs["direct"].upgrade()
            agent, chat = await _fill(dbs["direct"], rng)
            analyze = await asyncpg.connect(asyncpg_dsn(direct_url))
            try:
                await analyze.execute("VACUUM ANALYZE")
            finally:
                await analyze.close()
            raw = await RawPooled.open(asyncpg_dsn(pooler_url), DIM)
            await check_equivalence(dbs["pooler"], raw, agent, chat, query)
            ours = chat_operations(agent, chat, query)
            theirs = raw.operations(agent, chat, query)
            for operation, call in theirs.items():  # appends first, as chat_operations lists them
                calls: dict[str, Call] = {side: partial(ours[operation], db) for side, db in dbs.items()}
                calls["raw pooler"] = call
                before = os.getloadavg()[0]
                samples = await measure(calls, reps)
                rows += rows_for(operation, samples, (before, os.getloadavg()[0]))
        finally:
            if raw is not None:
                await raw.close()
            for db in dbs.values():
                await db.dispose()
    return rows
