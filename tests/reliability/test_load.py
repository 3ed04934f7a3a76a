"""Load: 200 concurrent chat sessions, two appenders sharing one more, archival writers: one ``Database``.

Every write the test saw acknowledged (its unit of work exited without error)
must be in the database exactly once, every session's ``seq`` must run 1..n
without gaps (the shared session's too, its two writers racing for each
number), no pooled connection of any ``Database`` the test opens may leak
(still checked out, or left for the garbage collector to find) and no task
may see any error ("database is locked" least of all).  The run is bounded in operations, not in
time; throughput and latencies are printed (``pytest -s``) and written to
``.bench/reliability-load-<engine>.json`` for docs/reliability.md, never asserted.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import platform
import random
import statistics
import time
import traceback
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest
from conftest import Store, count_rows

from memorm import Database

pytestmark = [pytest.mark.anyio, pytest.mark.reliability, pytest.mark.long]

T = TypeVar("T")

SESSIONS = 200
ROUNDS = 5
AGENTS = 10  # sessions are spread over agents, so searches scan more than one session's rows
PASSAGE_WRITERS = 4
DUET_APPENDS = 20  # by each of the two appenders sharing a session
PASSAGES_PER_WRITER = 25
DIM = 8
WORD = "ledgerword"  # in every message: a session-scoped search must find all of them
# Postgres' server allows 100 connections; SQLite needs few (one writer at a time).  200 tasks
# queue for these; the generous pool_timeout keeps a slow CI box from turning a queue into errors.
POOL: dict[str, dict[str, Any]] = {
    "postgres": {"pool_size": 20, "max_overflow": 10, "pool_timeout": 120},
    "sqlite": {"pool_size": 10, "max_overflow": 10, "pool_timeout": 120},
}
BENCH_DIR = Path(__file__).resolve().parents[2] / ".bench"
HANG_GUARD_S = 240  # only turns a deadlock into a failure; never a performance bound


@dataclass
class Run:
    """What the load saw: acknowledged writes, latencies, and every error."""

    messages: dict[uuid.UUID, list[tuple[int, str]]] = field(default_factory=lambda: defaultdict(list))
    passages: dict[uuid.UUID, str] = field(default_factory=dict)
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)

    async def timed(self, name: str, first: bool, operation: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Await ``operation(*args)``, recording its latency (pool queueing included).

        A task's first operation is kept apart: it waits for the pool to open
        its connections, which steady-state figures should not include.
        """
        started = time.perf_counter()
        result = await operation(*args)
        self.latencies[f"{name}@first" if first else name].append(time.perf_counter() - started)
        return result


# Each operation is one unit of work of its own, as a request handler would open it.


async def _append(db: Database, session_id: uuid.UUID, role: str, content: str) -> int:
    async with db.unit_of_work() as uow:
        [stored] = await uow.messages.append(session_id, {"role": role, "content": content})
    return stored.seq


async def _window(db: Database, session_id: uuid.UUID) -> list[int]:
    async with db.unit_of_work(read_only=True) as uow:
        return [message.seq for message in await uow.messages.window(session_id, limit=3)]


async def _search(db: Database, agent_id: uuid.UUID, session_id: uuid.UUID) -> int:
    async with db.unit_of_work(read_only=True) as uow:
        return (await uow.messages.search(agent_id, WORD, session_id=session_id, limit=3)).total


async def _context(db: Database, session_id: uuid.UUID) -> list[int]:
    async with db.unit_of_work(read_only=True) as uow:
        return [message.seq for message in await uow.messages.context(session_id, max_tokens=400)]


async def _add_passage(db: Database, agent_id: uuid.UUID, text: str, embedding: list[float]) -> uuid.UUID:
    async with db.unit_of_work() as uow:
        return (await uow.passages.add(agent_id, text, embedding)).id


async def _chat(db: Database, run: Run, agent_id: uuid.UUID, session_id: uuid.UUID, index: int) -> None:
    """One chat session: per round an append, then a window, a search and a context read."""
    acknowledged = run.messages[session_id]
    for round_ in range(ROUNDS):
        content = f"{WORD} session {index} round {round_} " + "words " * (round_ % 3)
        role = "user" if round_ % 2 == 0 else "assistant"
        where = f"session {index} round {round_}"
        try:
            seq = await run.timed("append", round_ == 0, _append, db, session_id, role, content)
            acknowledged.append((seq, content))  # its unit of work committed: acknowledged
            # Readers see the latest commit, so each must already see this session's last append.
            newest = await run.timed("window", round_ == 0, _window, db, session_id)
            if not newest or newest[-1] != seq:
                run.mismatches.append(f"{where}: window {newest}, appended {seq}")
            total = await run.timed("search", round_ == 0, _search, db, agent_id, session_id)
            if total != len(acknowledged):
                run.mismatches.append(f"{where}: search total {total}, acknowledged {len(acknowledged)}")
            shown = await run.timed("context", round_ == 0, _context, db, session_id)
            if not shown or shown[-1] != seq:
                run.mismatches.append(f"{where}: context {shown}, appended {seq}")
        except Exception:
            run.errors.append(f"{where}:\n{traceback.format_exc()}")


@dataclass
class Duet:
    """Two appenders of one session, released together once both are running."""

    session_id: uuid.UUID
    ready: list[str] = field(default_factory=list)
    both: anyio.Event = field(default_factory=anyio.Event)


async def _duet(db: Database, run: Run, duet: Duet, voice: str) -> None:
    """One of the two appenders: ``DUET_APPENDS`` appends, each its own unit of work."""
    acknowledged = run.messages[duet.session_id]
    duet.ready.append(voice)
    if len(duet.ready) == 2:
        duet.both.set()
    await duet.both.wait()
    for number in range(DUET_APPENDS):
        content = f"{WORD} duet {voice} {number}"
        try:
            seq = await run.timed("append", number == 0, _append, db, duet.session_id, "user", content)
            acknowledged.append((seq, content))
        except Exception:
            run.errors.append(f"duet {voice} append {number}:\n{traceback.format_exc()}")


async def _archivist(db: Database, run: Run, agent_id: uuid.UUID, writer: int) -> None:
    """A background writer adding archival passages, one unit of work each."""
    rng = random.Random(writer)
    for number in range(PASSAGES_PER_WRITER):
        text = f"passage {writer}.{number}"
        embedding = [rng.uniform(-1.0, 1.0) for _ in range(DIM)]
        try:
            run.passages[
                await run.timed("passage_add", number == 0, _add_passage, db, agent_id, text, embedding)
            ] = text
        except Exception:
            run.errors.append(f"archivist {writer} passage {number}:\n{traceback.format_exc()}")


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p99 = ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]
    return round(statistics.median(ordered) * 1000, 2), round(p99 * 1000, 2)


def _summary(engine: str, run: Run, elapsed: float) -> dict[str, Any]:
    operations: dict[str, Any] = {}
    for name in ("append", "window", "search", "context", "passage_add"):
        steady, first = run.latencies[name], run.latencies[f"{name}@first"]
        count = len(steady) + len(first)
        p50, p99 = _percentiles(steady)
        first_p50, first_p99 = _percentiles(first)
        operations[name] = {
            "count": count,
            "ops_per_s": round(count / elapsed, 1),
            "p50_ms": p50,
            "p99_ms": p99,
            "first_round_p50_ms": first_p50,
            "first_round_p99_ms": first_p99,
        }
    total = sum(len(samples) for samples in run.latencies.values())
    return {
        "engine": engine,
        "sessions": SESSIONS,
        "rounds": ROUNDS,
        "agents": AGENTS,
        "passage_writers": PASSAGE_WRITERS,
        "passages_per_writer": PASSAGES_PER_WRITER,
        "pool": POOL[engine],
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "latency_note": "p50/p99 leave out each task's first round (pool warm-up): see first_round_*",
        "elapsed_s": round(elapsed, 2),
        "total_ops": total,
        "total_ops_per_s": round(total / elapsed, 1),
        "operations": operations,
    }


def _report(summary: dict[str, Any]) -> None:
    BENCH_DIR.mkdir(exist_ok=True)
    path = BENCH_DIR / f"reliability-load-{summary['engine']}.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"\n[load {summary['engine']}] {summary['sessions']} sessions x {summary['rounds']} rounds, "
        f"{summary['total_ops']} ops in {summary['elapsed_s']} s = {summary['total_ops_per_s']} ops/s "
        f"(pool {summary['pool']}) -> {path}"
    )
    for name, figures in summary["operations"].items():
        print(
            f"  {name:<12} {figures['count']:>5} ops {figures['ops_per_s']:>8} ops/s "
            f"p50 {figures['p50_ms']:>8} ms  p99 {figures['p99_ms']:>8} ms  "
            f"(first round p50 {figures['first_round_p50_ms']} ms, p99 {figures['first_round_p99_ms']} ms)"
        )


class _GarbageCollectedConnections(logging.Handler):
    """Collects SQLAlchemy's reports of pooled connections found by the garbage collector.

    A connection that is never returned and no longer referenced is cleaned
    up by the garbage collector, which decrements ``checkedout()``: only this
    report tells such a leak apart.
    """

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.found: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "garbage collector" in record.getMessage():
            self.found.append(record.getMessage())


def _assert_no_leak(db: Database, collected: _GarbageCollectedConnections, name: str) -> None:
    gc.collect()  # whatever an unreferenced leak left behind is reported now, not at some later test
    assert collected.found == [], f"{name}: a pooled connection was left to the garbage collector"
    assert db.engine.pool.checkedout() == 0, f"{name}: a pooled connection is still checked out"


async def test_concurrent_sessions_lose_no_acknowledged_write(
    db: Database, store: Store, engine: str
) -> None:
    async with db.unit_of_work() as uow:
        agents = [(await uow.agents.create(f"load-agent-{number}")).id for number in range(AGENTS)]
        chats = [
            (agents[index % AGENTS], (await uow.sessions.create(agents[index % AGENTS])).id)
            for index in range(SESSIONS)
        ]
        archive = agents[0]
        await uow.passages.define_model(archive, "default", DIM)
        duet = Duet((await uow.sessions.create(agents[1])).id)

    collected = _GarbageCollectedConnections()
    logging.getLogger("sqlalchemy.pool").addHandler(collected)
    run = Run()
    loaded = store.database(**POOL[engine])  # one Database shared by every task, as in a server
    try:
        started = time.perf_counter()
        with anyio.fail_after(HANG_GUARD_S):
            async with anyio.create_task_group() as group:
                for index, (agent_id, session_id) in enumerate(chats):
                    group.start_soon(_chat, loaded, run, agent_id, session_id, index)
                for voice in ("left", "right"):
                    group.start_soon(_duet, loaded, run, duet, voice)
                for writer in range(PASSAGE_WRITERS):
                    group.start_soon(_archivist, loaded, run, archive, writer)
        elapsed = time.perf_counter() - started
        _assert_no_leak(loaded, collected, "the Database under load")
    finally:
        await loaded.dispose()
        logging.getLogger("sqlalchemy.pool").removeHandler(collected)

    _report(_summary(engine, run, elapsed))
    assert run.errors == [], f"{len(run.errors)} errors, first:\n{run.errors[0]}"
    assert run.mismatches == [], f"{len(run.mismatches)} stale reads, first: {run.mismatches[0]}"

    # Every acknowledged message exactly once, in order, and nothing unacknowledged.
    sessions = [*(session_id for _, session_id in chats), duet.session_id]
    async with db.unit_of_work(read_only=True) as uow:
        for index, session_id in enumerate(sessions):
            stored = await uow.messages.window(session_id, after_seq=0, limit=2 * DUET_APPENDS + 10)
            expected = sorted(run.messages[session_id])
            assert [(message.seq, message.content) for message in stored] == expected, f"session {index}"
            assert [seq for seq, _ in expected] == list(range(1, len(expected) + 1)), f"session {index} seq"
            assert (await uow.sessions.get(session_id)).next_seq == len(expected) + 1
        passages = await uow.passages.list(archive, limit=PASSAGE_WRITERS * PASSAGES_PER_WRITER)
        assert {passage.id: passage.text for passage in passages} == run.passages
        assert await uow.passages.count(archive) == len(run.passages)
    # Each of the duet's appenders saw its own appends take ever later numbers.
    for voice in ("left", "right"):
        mine = [seq for seq, content in run.messages[duet.session_id] if f" {voice} " in content]
        assert len(mine) == DUET_APPENDS, voice
        assert mine == sorted(mine), voice
    acknowledged = sum(len(entries) for entries in run.messages.values())
    assert acknowledged == SESSIONS * ROUNDS + 2 * DUET_APPENDS
    assert await count_rows(db, "messages") == acknowledged
    assert (
        await count_rows(db, "archival_passages")
        == len(run.passages)
        == PASSAGE_WRITERS * PASSAGES_PER_WRITER
    )
    _assert_no_leak(db, collected, "the fixture's Database")
