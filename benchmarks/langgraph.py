"""LangGraph's checkpointer on memorm against LangGraph's own savers.

Issue #17's goal: `MemormSaver` no slower than `langgraph-checkpoint-sqlite`
(`AsyncSqliteSaver`, on its own aiosqlite connection, in WAL mode with
`synchronous=NORMAL` as memorm's: SQLite's default journal would time fsync) and
`langgraph-checkpoint-postgres` (`AsyncPostgresSaver`, on a psycopg pool set
up as LangGraph's docs say: autocommit, dict rows, no prepared statements),
each in a store of its own on the same engine, the two sides alternating
call by call.

* a graph step: `aput` of a checkpoint whose `messages` channel changed
  (the conversation so far, ~40 messages of ~150 tokens, as a chat graph
  holds it) and whose `step` counter changed, then `aput_writes` of the
  next task's two writes: what LangGraph does between two nodes;
* `aget_tuple` of a thread's latest checkpoint (with its channel values and
  pending writes), the thread holding 30 checkpoints: what every
  `graph.invoke` on a thread reads first;
* `alist` of a thread's newest 10 checkpoints (history views; no goal).

Checkpoints are built inside the timing on both sides (ids, versions).
The raw column is LangGraph's saver; the target is 1.0 (no slower).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver, Checkpoint, empty_checkpoint
from langgraph.checkpoint.base.id import uuid6

from benchmarks.chat_data import make_messages
from benchmarks.report import Row
from benchmarks.stores import Store, asyncpg_dsn, like_memorm, store
from benchmarks.timing import alternate
from memorm import Database
from memorm.compat.langgraph import MemormSaver

NAME = "langgraph"
TARGET = 1.0  # issue #17: no slower than LangGraph's own libraries
HISTORY = 40  # messages in the graph's `messages` channel
THREAD_CHECKPOINTS = 30


class _Thread:
    """One thread's run of steps on one saver, building each checkpoint as LangGraph does."""

    def __init__(self, saver: BaseCheckpointSaver[Any], thread_id: str) -> None:
        self.saver = saver
        self.config: dict[str, Any] = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        self.checkpoint: Checkpoint = empty_checkpoint()
        self.messages = make_messages(HISTORY)
        self.step = 0

    async def step_once(self) -> None:
        """`aput` of the next checkpoint (two channels changed), then `aput_writes` of a task's two writes."""
        self.step += 1
        previous = self.checkpoint
        versions = dict(previous["channel_versions"])
        for channel in ("messages", "step"):
            versions[channel] = self.saver.get_next_version(versions.get(channel), None)
        self.messages = [*self.messages[1:], {"role": "assistant", "content": f"step {self.step}"}]
        checkpoint: Checkpoint = {
            **previous,
            "id": str(uuid6(clock_seq=self.step)),
            "channel_values": {"messages": list(self.messages), "step": self.step},
            "channel_versions": versions,
            "versions_seen": {"agent": {"messages": versions["messages"]}},
        }
        metadata: Any = {"source": "loop", "step": self.step, "parents": {}}
        changed = {channel: versions[channel] for channel in ("messages", "step")}
        self.config = await self.saver.aput(self.config, checkpoint, metadata, changed)
        self.checkpoint = checkpoint
        task = str(uuid.uuid4())
        await self.saver.aput_writes(
            self.config, [("messages", self.messages[-1]), ("step", self.step + 1)], task
        )

    @property
    def thread(self) -> dict[str, Any]:
        """The thread's config without a checkpoint id: its latest."""
        return {"configurable": {"thread_id": self.config["configurable"]["thread_id"]}}

    async def latest(self) -> None:
        found = await self.saver.aget_tuple(self.thread)
        assert found is not None
        assert found.checkpoint["channel_values"]["step"] == self.step

    async def newest(self) -> None:
        listed = [item async for item in self.saver.alist(self.thread, limit=10)]
        assert len(listed) == 10


@asynccontextmanager
async def _memorm(where: Store) -> AsyncIterator[tuple[BaseCheckpointSaver[Any], Database]]:
    db = where.database()
    await db.create_all()
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("graph")
    try:
        yield MemormSaver(db, agent=agent.id), db
    finally:
        await db.dispose()


@asynccontextmanager
async def _langgraph(where: Store) -> AsyncIterator[BaseCheckpointSaver[Any]]:
    """LangGraph's saver for the engine, in tables of its own beside memorm's."""
    if where.engine == "sqlite":
        import aiosqlite
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        assert where.path is not None
        path = Path(where.path).with_name("langgraph.db")
        async with aiosqlite.connect(path) as connection:
            await like_memorm(connection)
            saver = AsyncSqliteSaver(connection)
            await saver.setup()
            yield saver
        return
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    assert where.schema is not None
    dsn = asyncpg_dsn() + f"?options=-csearch_path%3D{where.schema},public"
    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    async with AsyncConnectionPool(dsn, kwargs=kwargs, min_size=1, max_size=4, open=False) as pool:
        saver = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
        await saver.setup()
        yield saver


async def run(engines: Sequence[str], *, quick: bool = False) -> list[Row]:
    reps = 30 if quick else 300
    rows: list[Row] = []
    for engine in engines:
        async with store(engine) as where, _memorm(where) as (saver, _db), _langgraph(where) as theirs:
            label = "langgraph-checkpoint-sqlite" if engine == "sqlite" else "langgraph-checkpoint-postgres"
            note = f"raw column: {label}'s async saver"
            ours_thread, their_thread = _Thread(saver, "steps"), _Thread(theirs, "steps")
            for _ in range(5):  # warm-up: connections, prepared statements
                await ours_thread.step_once()
                await their_thread.step_once()
            mine, other = await alternate((ours_thread.step_once, their_thread.step_once), reps)
            rows.append(
                Row(NAME, engine, "graph step: aput + aput_writes", mine, other, target=TARGET, note=note)
            )
            reader, their_reader = _Thread(saver, "reads"), _Thread(theirs, "reads")
            for _ in range(THREAD_CHECKPOINTS):
                await reader.step_once()
                await their_reader.step_once()
            mine, other = await alternate((reader.latest, their_reader.latest), reps)
            name = f"aget_tuple, latest of {THREAD_CHECKPOINTS}"
            rows.append(Row(NAME, engine, name, mine, other, target=TARGET, note=note))
            mine, other = await alternate((reader.newest, their_reader.newest), reps)
            note += " (no goal: listing is not on a graph's hot path)"
            rows.append(Row(NAME, engine, "alist, newest 10", mine, other, note=note))
    return rows
