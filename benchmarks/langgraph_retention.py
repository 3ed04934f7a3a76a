"""Retention of graph state (issue #31): a thread of 10,000 checkpoints purged to its newest 100.

The thread is a chat graph's, as `benchmarks.langgraph` builds it: each step
a checkpoint whose `messages` channel (~40 messages of ~150 tokens) and
`step` counter changed, then a task's two writes.  Reported per engine:

* `uow.checkpoints.purge(keep_last=100)`: its time (one run: it is
  destructive), and the thread's rows and value bytes (checkpoints, writes,
  channel values) before and after;
* on Postgres, the newest checkpoint kept (`keep_last=1`) against LangGraph's
  `AsyncPostgresSaver.aprune(strategy="keep_latest")` on a thread of its own
  of the same size and shape, the two timed one after the other (one run
  each).  LangGraph's SQLite saver has no `prune`.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from functools import partial

import sqlalchemy as sa

from benchmarks.langgraph import _langgraph, _memorm, _Thread
from benchmarks.report import Row
from benchmarks.stores import store
from benchmarks.timing import Samples, timed
from memorm import Database
from memorm.models import CHECKPOINT_BLOBS, CHECKPOINT_WRITES, CHECKPOINTS

NAME = "langgraph_retention"
KEEP = 100


async def _size(db: Database) -> tuple[dict[str, int], int]:
    """The graph-state rows per table, and the bytes of their values."""
    counts, total = {}, 0
    async with db.unit_of_work(read_only=True) as uow:
        for table in (CHECKPOINTS, CHECKPOINT_WRITES, CHECKPOINT_BLOBS):
            query = sa.select(
                sa.func.count(), sa.func.coalesce(sa.func.sum(sa.func.length(table.c.value)), 0)
            )
            rows, size = (await uow.link.session.execute(query.select_from(table))).one()
            counts[table.name.removeprefix("graph_")] = int(rows)
            total += int(size)
    return counts, total


def _shown(counts: dict[str, int], size: int) -> str:
    return ", ".join(f"{rows:,} {name}" for name, rows in counts.items()) + f", {size / 1e6:.1f} MB of values"


async def _purge(db: Database, agent: uuid.UUID, session: uuid.UUID, keep: int) -> int:
    async with db.unit_of_work() as uow:
        return await uow.checkpoints.purge(agent, session, keep_last=keep)


async def _thread(thread: _Thread, steps: int) -> None:
    for _ in range(steps):
        await thread.step_once()


async def run(engines: Sequence[str], *, quick: bool = False) -> list[Row]:
    steps = 1_000 if quick else 10_000
    rows: list[Row] = []
    for engine in engines:
        async with store(engine) as where, _memorm(where) as (saver, db):
            await _thread(_Thread(saver, "long"), steps)
            before = await _size(db)
            async with db.unit_of_work(read_only=True) as uow:
                (session,) = await uow.checkpoints.sessions_with_state(saver.agent_id)

            samples = Samples()
            assert (
                await timed(partial(_purge, db, saver.agent_id, session, KEEP), samples, collect=True)
                == steps - KEEP
            )
            after = await _size(db)
            note = f"before: {_shown(*before)}; after: {_shown(*after)} (1 run)"
            operation = f"purge a thread of {steps:,} checkpoints to its newest {KEEP}"
            rows.append(Row(NAME, engine, operation, samples, None, note=note))
            if engine != "postgres":
                continue
            async with _langgraph(where) as theirs:
                ours, other = _Thread(saver, "latest"), _Thread(theirs, "latest")
                await _thread(ours, steps)
                await _thread(other, steps)
                async with db.unit_of_work(read_only=True) as uow:
                    latest = next(
                        found
                        for found in await uow.checkpoints.sessions_with_state(saver.agent_id)
                        if found != session
                    )
                mine, raw = Samples(), Samples()
                assert (
                    await timed(partial(_purge, db, saver.agent_id, latest, 1), mine, collect=True)
                    == steps - 1
                )
                await timed(lambda: theirs.aprune(["latest"], strategy="keep_latest"), raw, collect=True)
                assert len([item async for item in theirs.alist(other.thread)]) == 1
                note = "raw column: langgraph-checkpoint-postgres's AsyncPostgresSaver.aprune (1 run each)"
                operation = f"keep the newest of {steps:,} checkpoints"
                rows.append(Row(NAME, engine, operation, mine, raw, note=note))
    return rows
