"""Recall-memory benchmarks: full-text search against a LIKE scan.

One agent, one session, filled to 10,000 and then 100,000 messages of
synthetic chat text (a Zipf-distributed vocabulary, so some words are common
and most are rare); one word, ``zephyr``, is planted in 0.2% of messages.

* ``search`` (FTS5 / GIN tsvector, with its true total) against the raw driver
  running ``LIKE '%zephyr%'`` (``ILIKE`` on Postgres, to match case the same
  way) with its total, on the same data in the same run.  Target: the
  full-text search at least 10x faster at 100,000 messages, and growing
  slower than linearly from 10,000 to 100,000.

``context(max_tokens=8000)`` is measured in :mod:`benchmarks.core`, against
the raw driver's equivalent.
"""

from __future__ import annotations

import itertools
import random
import uuid
from collections.abc import Sequence
from typing import Any

from benchmarks.common import Row, Samples, Store, store, timed
from memorm import Database

WORD = "zephyr"
PLANT_EVERY = 500
SIZES = (10_000, 100_000)
VOCABULARY = [f"w{index}" for index in range(20_000)]


def chat_text(rng: random.Random, index: int) -> str:
    words = rng.choices(VOCABULARY, cum_weights=_CUMULATIVE, k=rng.randint(10, 120))  # ~100 tokens on average
    if index % PLANT_EVERY == 0:
        words[rng.randrange(len(words))] = WORD.capitalize() if index % 2 else WORD
    return " ".join(words)


_CUMULATIVE = list(itertools.accumulate(1 / (rank + 1) for rank in range(len(VOCABULARY))))  # Zipf


async def fill(db: Database, session_id: uuid.UUID, start: int, stop: int, rng: random.Random) -> None:
    for first in range(start, stop, 10_000):
        batch = [
            {"role": "user" if i % 2 else "assistant", "content": chat_text(rng, i)}
            for i in range(first, min(stop, first + 10_000))
        ]
        async with db.unit_of_work() as uow:
            await uow.messages.append(session_id, batch)


async def like_search(where: Store, raw: Any, agent_id: uuid.UUID) -> tuple[int, list[Any]]:
    """The raw driver's LIKE scan: the newest 10 matches and their count."""
    if where.engine == "sqlite":
        pattern = f"%{WORD}%"
        cursor = await raw.execute(
            "SELECT count(*) FROM messages WHERE agent_id = ? AND content LIKE ?", (agent_id.hex, pattern)
        )
        (total,) = await cursor.fetchone()
        cursor = await raw.execute(
            "SELECT id, seq, content, created_at FROM messages WHERE agent_id = ? AND content LIKE ? "
            "ORDER BY created_at DESC, id DESC LIMIT 10",
            (agent_id.hex, pattern),
        )
        return total, list(await cursor.fetchall())
    pattern = f"%{WORD}%"
    total = await raw.fetchval(
        "SELECT count(*) FROM messages WHERE agent_id = $1 AND content ILIKE $2", agent_id, pattern
    )
    rows = await raw.fetch(
        "SELECT id, seq, content, created_at FROM messages WHERE agent_id = $1 AND content ILIKE $2 "
        "ORDER BY created_at DESC, id DESC LIMIT 10",
        agent_id,
        pattern,
    )
    return total, list(rows)


async def run_engine(engine: str, *, quick: bool) -> list[Row]:
    rows: list[Row] = []
    reps = 10 if quick else 40
    rng = random.Random(7)
    async with store(engine) as where:
        db = where.database()
        raw = await (where.raw_sqlite() if engine == "sqlite" else where.raw_postgres())
        try:
            await db.create_all()
            async with db.unit_of_work() as uow:
                agent = await uow.agents.create("bench-recall")
                chat = await uow.sessions.create(agent.id)
            fts: dict[int, Samples] = {}
            filled = 0
            for size in SIZES:
                await fill(db, chat.id, filled, size, rng)
                filled = size
                if engine == "postgres":
                    await raw.execute("ANALYZE messages")
                memorm_samples, like_samples = Samples(), Samples()
                for _ in range(reps):
                    async with db.unit_of_work(read_only=True) as uow:
                        page = await timed(lambda: uow.messages.search(agent.id, WORD), memorm_samples)
                    total, _ = await timed(lambda: like_search(where, raw, agent.id), like_samples)
                    assert page.total == total == len(range(0, size, PLANT_EVERY)), (page.total, total)
                fts[size] = memorm_samples
                rows.append(
                    Row(
                        "recall",
                        engine,
                        f"search '{WORD}' in {size:,} msgs (raw: LIKE scan)",
                        memorm_samples,
                        like_samples,
                        target=0.1 if size == SIZES[-1] else None,  # the 10x is at 100,000
                        note=(
                            f"{page.total} matches; full-text "
                            f"{like_samples.median / memorm_samples.median:.0f}x faster than LIKE"
                        ),
                    )
                )
            growth = fts[SIZES[-1]].median / fts[SIZES[0]].median
            rows.append(
                Row(
                    "recall",
                    engine,
                    f"search growth {SIZES[0]:,} -> {SIZES[-1]:,} msgs",
                    status="PASS" if growth < SIZES[-1] / SIZES[0] else "MISS",
                    note=f"latency x{growth:.2f} for x{SIZES[-1] // SIZES[0]} data (sublinear if < x10)",
                )
            )
        finally:
            await raw.close()
            await db.dispose()
    return rows


async def run(engines: Sequence[str], *, quick: bool = False) -> list[Row]:
    rows: list[Row] = []
    for engine in engines:
        rows += await run_engine(engine, quick=quick)
    return rows
