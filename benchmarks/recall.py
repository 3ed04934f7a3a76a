"""Recall-memory benchmarks: full-text search against a LIKE scan.

The table holds one agent of 100,000 messages, one of 1,000, and a crowd of
other agents (50,000 messages), all synthetic chat text (a Zipf-distributed
vocabulary).  Three words are planted at known rates in every agent's
messages: a rare one (one message in 5,000, and the first of each agent), one
in 2% and one in 20% of messages.

* ``search`` (FTS5 / GIN tsvector, with its true total) against the raw driver
  running ``LIKE '%word%'`` (``ILIKE`` on Postgres, to match case the same
  way) for the newest 10 matches and their count, on the same data in the same
  run.  Targets, for the 100,000-message agent: full-text at least 10x faster
  for the rare and the 2% word, 3x for the 20% word.  The 1,000-message
  agent's rows show that the other agents' matches cost nothing (its LIKE scan
  reads only its own rows through the agent index, so parity is the target).

``context(max_tokens=8000)`` is measured in :mod:`benchmarks.core`, against
the raw driver's equivalent.
"""

from __future__ import annotations

import itertools
import random
import uuid
from collections.abc import Sequence
from typing import Any

from benchmarks.report import Row
from benchmarks.stores import Store, store
from benchmarks.timing import Samples, timed
from memorm import Database

# word, planted in one message of every `every` (and in each agent's first message)
WORDS = (("zephyr", 5_000, "rare"), ("quartz", 50, "2%"), ("amber", 5, "20%"))
TARGETS = {"rare": 0.1, "2%": 0.1, "20%": 1 / 3}  # memorm/LIKE at 100,000 messages (issue 16)
BIG, SMALL = 100_000, 1_000
CROWD = (25, 2_000)  # other agents, messages each
VOCABULARY = [f"w{index}" for index in range(20_000)]
_CUMULATIVE = list(itertools.accumulate(1 / (rank + 1) for rank in range(len(VOCABULARY))))  # Zipf


def chat_text(rng: random.Random, index: int) -> str:
    words = rng.choices(VOCABULARY, cum_weights=_CUMULATIVE, k=rng.randint(10, 120))  # ~100 tokens on average
    for at, (word, every, _) in enumerate(WORDS):
        if index % every == at % every:  # at different offsets, so one message rarely holds two
            words[rng.randrange(len(words))] = word.capitalize() if index % 2 else word
    return " ".join(words)


def planted(word: str, size: int) -> int:
    at, every = next((at, every) for at, (name, every, _) in enumerate(WORDS) if name == word)
    return len(range(at % every, size, every))


async def fill(db: Database, name: str, size: int, rng: random.Random) -> tuple[uuid.UUID, uuid.UUID]:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create(name)
        chat = await uow.sessions.create(agent.id)
    for first in range(0, size, 10_000):
        batch = [
            {"role": "user" if i % 2 else "assistant", "content": chat_text(rng, i)}
            for i in range(first, min(size, first + 10_000))
        ]
        async with db.unit_of_work() as uow:
            await uow.messages.append(chat.id, batch)
    return agent.id, chat.id


async def like_search(where: Store, raw: Any, agent_id: uuid.UUID, word: str) -> tuple[int, list[Any]]:
    """The raw driver's LIKE scan of the agent's rows (by its index): the newest 10 matches, their count."""
    pattern = f"%{word}%"
    if where.engine == "sqlite":
        cursor = await raw.execute(
            "SELECT count(*) FROM messages WHERE tenant = 'default' AND agent_id = ? AND content LIKE ?",
            (agent_id.hex, pattern),
        )
        (total,) = await cursor.fetchone()
        cursor = await raw.execute(
            "SELECT id, seq, content, created_at FROM messages WHERE tenant = 'default' AND agent_id = ? "
            "AND content LIKE ? "
            "ORDER BY created_at DESC, id DESC LIMIT 10",
            (agent_id.hex, pattern),
        )
        return total, list(await cursor.fetchall())
    total = await raw.fetchval(
        "SELECT count(*) FROM messages WHERE tenant = 'default' AND agent_id = $1 AND content ILIKE $2",
        agent_id,
        pattern,
    )
    rows = await raw.fetch(
        "SELECT id, seq, content, created_at FROM messages WHERE tenant = 'default' AND agent_id = $1 "
        "AND content ILIKE $2 "
        "ORDER BY created_at DESC, id DESC LIMIT 10",
        agent_id,
        pattern,
    )
    return total, list(rows)


async def search_rows(
    where: Store, db: Database, raw: Any, agent_id: uuid.UUID, size: int, reps: int
) -> tuple[list[Row], dict[str, Samples]]:
    rows: list[Row] = []
    found: dict[str, Samples] = {}
    for word, _, share in WORDS:
        memorm_samples, like_samples = Samples(), Samples()
        for _ in range(reps):
            async with db.unit_of_work(read_only=True) as uow:
                page = await timed(lambda: uow.messages.search(agent_id, word), memorm_samples)  # noqa: B023
            total, _ = await timed(lambda: like_search(where, raw, agent_id, word), like_samples)  # noqa: B023
            assert page.total == total == planted(word, size), (word, page.total, total)
        found[share] = memorm_samples
        speedup = like_samples.median / memorm_samples.median
        rows.append(
            Row(
                "recall",
                where.engine,
                f"search {share} word in {size:,} msgs (raw: LIKE scan)",
                memorm_samples,
                like_samples,
                target=TARGETS[share] if size == BIG else 1.0,
                note=f"{page.total} matches; full-text {speedup:.1f}x faster than LIKE",
            )
        )
    return rows, found


async def run_engine(engine: str, *, quick: bool) -> list[Row]:
    rows: list[Row] = []
    reps = 10 if quick else 40
    rng = random.Random(7)
    async with store(engine) as where:
        db = where.database()
        raw = await (where.raw_sqlite() if engine == "sqlite" else where.raw_postgres())
        try:
            await db.create_all()
            agents, crowd_size = {}, 0
            for index, size in enumerate((BIG, SMALL)):
                agents[size] = await fill(db, f"bench-recall-{size}", size, rng)
                if index == 0:  # the crowd between the two
                    for other in range(CROWD[0]):
                        await fill(db, f"bench-crowd-{other}", CROWD[1], rng)
                        crowd_size += CROWD[1]
            if engine == "postgres":
                await raw.execute("VACUUM ANALYZE messages")
            latency: dict[int, dict[str, Samples]] = {}
            for size, (agent_id, _) in agents.items():
                found, latency[size] = await search_rows(where, db, raw, agent_id, size, reps)
                rows += found
            growth = latency[BIG]["rare"].median / latency[SMALL]["rare"].median
            rows.append(
                Row(
                    "recall",
                    engine,
                    f"search growth {SMALL:,} -> {BIG:,} msgs (rare word)",
                    status="PASS" if growth < BIG / SMALL else "MISS",
                    note=f"latency x{growth:.2f} for x{BIG // SMALL} data (sublinear if < x{BIG // SMALL}); "
                    f"{crowd_size:,} other agents' messages in the table",
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
