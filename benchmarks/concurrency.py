"""Concurrency: chat sessions outnumbering the pool's connections (issue #27).

N sessions share a pool of 16 connections, N = 1x, 4x and 16x the pool
(16, 64, 256).  Each session is a task doing turns until a deadline: a turn
appends one user message in a unit of work, then reads ``window(limit=20)``
in a read-only one.  Every session starts with 20 messages, so every window
reads 20.

The baseline does the same statements on memorm's schema with the raw
driver (:mod:`benchmarks.raw.chat`) over a pool of the same size, each turn
taking a connection for the append and another for the window:

* Postgres: an asyncpg pool of 16 (waiters served first come, first served;
  no reset round trip on release, as memorm's pool sends none).  The append
  is one transaction: the session's counter moved by ``UPDATE … RETURNING``,
  then the ``INSERT``; the window one ``SELECT`` of the newest 20, in order.
* SQLite: 16 aiosqlite connections set up as memorm's (WAL, the same
  pragmas), handed out first come, first served by a small queue written
  here (aiosqlite has no pool), and appends serialised in the process by an
  ``asyncio.Lock`` taken before the connection, as memorm's writer lock is.
  The baseline is this hand-made pool, not a stock one.

Both sides run in the same process, never at once: each N is four slices
of half the duration per side, memorm and raw alternating ABBA (BAAB for
the next N), so drift in the machine's load reaches both alike.  Rows per
engine and N: wall time per turn (the inverse of throughput; its rows/s
column is turns/s), p50, p99 and max turn latency (a turn's latency
includes its waits for connections), Jain's fairness index over the
sessions' turn counts and the share of sessions under half the mean turns
(each the worse of the two slices of a side: a session starved in one slice
and not in the other would otherwise look fair).

The duration is ``MEMORM_BENCH_CONCURRENCY_SECONDS`` per side per N
(default 10; 2 with ``--quick``).
"""

from __future__ import annotations

import asyncio
import gc
import math
import os
import statistics
import time
import uuid
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

from benchmarks.chat_data import make_messages
from benchmarks.chat_memorm import memorm_append, memorm_window
from benchmarks.raw.chat import RawPostgres, RawSQLite
from benchmarks.report import Row
from benchmarks.stores import Store, store
from benchmarks.timing import Samples
from memorm import Database

NAME = "concurrency"
POOL = 16
SCALES = (1, 4, 16)  # sessions per connection
WINDOW = 20
HISTORY = 20  # messages each session starts with
SECONDS = os.environ.get("MEMORM_BENCH_CONCURRENCY_SECONDS")

# The goals.
JAIN_MIN = 0.95
THROUGHPUT_MIN = 0.8  # memorm's turns/s at least this times raw's
LATENCY_TARGET = 1.5  # memorm's p99 and max turn latency at most this times raw's
FAIR_GOAL = f"fair turns: Jain >= {JAIN_MIN:g}, no session under half the mean, every N"
THROUGHPUT_GOAL = f"throughput >= {THROUGHPUT_MIN:g}x raw at every N"
LATENCY_GOAL = f"p99 and max turn latency <= {LATENCY_TARGET:g}x raw at every N"

Append = Callable[[uuid.UUID, dict[str, Any]], Awaitable[Any]]
Window = Callable[[uuid.UUID, int], Awaitable[Sequence[Any]]]


class Side(NamedTuple):
    """One side's turn: its append and its window, each taking a pooled connection."""

    append: Append
    window: Window


@dataclass
class Slice:
    """One side's run of N sessions until a deadline."""

    turns: list[int]  # per session
    latencies: list[float]
    seconds: float  # from the start until every session's last turn ended
    errors: Counter[str] = field(default_factory=Counter)


# -- the raw pools --------------------------------------------------------------------------------


class _FairPool:
    """Items handed out first come, first served.

    An `asyncio.Queue` is not: a task that puts a connection back and asks
    again at once takes it straight back, ahead of the waiter just woken.
    Here a released item goes to the oldest waiter directly.
    """

    def __init__(self, items: Sequence[Any]) -> None:
        self.idle = deque(items)
        self.waiters: deque[asyncio.Future[Any]] = deque()

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[Any]:
        if self.idle:
            item = self.idle.popleft()
        else:
            waiter = asyncio.get_running_loop().create_future()
            self.waiters.append(waiter)
            item = await waiter
        try:
            yield item
        finally:
            if self.waiters:
                self.waiters.popleft().set_result(item)
            else:
                self.idle.append(item)


@asynccontextmanager
async def raw_side(where: Store) -> AsyncIterator[Side]:
    """The raw driver's turn over a pool of `POOL` connections on `where` (see the module's doc)."""
    agents: dict[uuid.UUID, uuid.UUID] = {}  # the sessions' agents, shared as memorm shares its own
    if where.engine == "postgres":
        pool = await where.raw_postgres_pool(POOL)

        def on(connection: Any) -> RawPostgres:
            raw = RawPostgres(connection)
            raw.agents = agents
            return raw

        async def append(session: uuid.UUID, message: dict[str, Any]) -> None:
            async with pool.acquire() as connection:
                await on(connection).append_one(session, message)

        async def window(session: uuid.UUID, limit: int) -> list[dict[str, Any]]:
            async with pool.acquire() as connection:
                return await on(connection).window(session, limit)

        try:
            yield Side(append, window)
        finally:
            await pool.close()
        return
    connections = [RawSQLite(await where.raw_sqlite()) for _ in range(POOL)]
    for raw in connections:
        raw.agents = agents
    gate, writer = _FairPool(connections), asyncio.Lock()

    async def append_sqlite(session: uuid.UUID, message: dict[str, Any]) -> None:
        async with writer, gate.acquire() as raw:
            await raw.append_one(session, message)

    async def window_sqlite(session: uuid.UUID, limit: int) -> list[dict[str, Any]]:
        async with gate.acquire() as raw:
            return await raw.window(session, limit)

    try:
        yield Side(append_sqlite, window_sqlite)
    finally:
        for raw in connections:
            await raw.close()


# -- driving sessions -----------------------------------------------------------------------------


_TEXTS = [message for message in make_messages(128) if message["role"] == "user"]


async def drive(side: Side, sessions: Sequence[uuid.UUID], seconds: float) -> Slice:
    """Every session a task doing turns until `seconds` have passed; the turns each finished."""
    clock = time.perf_counter
    turns = [0] * len(sessions)
    latencies: list[float] = []
    errors: Counter[str] = Counter()

    async def chat(index: int, session: uuid.UUID) -> None:
        count = index
        while clock() < deadline:
            message = _TEXTS[count % len(_TEXTS)]
            count += 1
            started = clock()
            try:
                await side.append(session, message)
                await side.window(session, WINDOW)
            except Exception as error:  # counted and reported: one failed turn must not end the run
                errors[type(error).__name__] += 1
                continue
            latencies.append(clock() - started)
            turns[index] += 1

    gc.collect()
    started = clock()
    deadline = started + seconds
    await asyncio.gather(*(chat(index, session) for index, session in enumerate(sessions)))
    return Slice(turns, latencies, clock() - started, errors)


async def measure(
    sides: dict[str, Side], sessions: dict[str, list[uuid.UUID]], n: int, seconds: float, *, flip: bool
) -> dict[str, list[Slice]]:
    """Both sides with `n` sessions, ABBA (BAAB when `flip`), `seconds` per side in all."""
    order = ["memorm", "raw"][:: -1 if flip else 1]
    slices: dict[str, list[Slice]] = {"memorm": [], "raw": []}
    for name in [*order, *reversed(order)]:
        slices[name].append(await drive(sides[name], sessions[name][:n], seconds / 2))
    return slices


# -- statistics and rows --------------------------------------------------------------------------


def jain(counts: Sequence[int]) -> float:
    """Jain's fairness index: 1 when every session had as many turns, 1/n when one had them all."""
    squares = sum(count * count for count in counts)
    return sum(counts) ** 2 / (len(counts) * squares) if squares else 0.0


def under_half(counts: Sequence[int]) -> float:
    """The share of sessions with fewer than half the mean turns."""
    half = statistics.fmean(counts) / 2
    return sum(count < half for count in counts) / len(counts)


def percentile(ordered: Sequence[float], share: float) -> float:
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


@dataclass
class Summary:
    """One side's slices at one N, combined."""

    turns: int
    seconds: float
    latencies: list[float]  # sorted
    jain: float  # the worse slice's
    under_half: float  # the worse slice's
    spread: str  # per-session turns of the worse slice: min / median / max
    errors: Counter[str]

    @classmethod
    def of(cls, slices: Sequence[Slice]) -> Summary:
        worst = min(slices, key=lambda one: jain(one.turns))
        return cls(
            turns=sum(sum(one.turns) for one in slices),
            seconds=sum(one.seconds for one in slices),
            latencies=sorted(latency for one in slices for latency in one.latencies),
            jain=jain(worst.turns),
            under_half=max(under_half(one.turns) for one in slices),
            spread=f"{min(worst.turns)} / {statistics.median(worst.turns):g} / {max(worst.turns)}",
            errors=sum((one.errors for one in slices), Counter()),
        )

    @property
    def per_turn(self) -> Samples:
        return Samples([self.seconds / self.turns if self.turns else math.inf])

    def at(self, share: float) -> Samples:
        return Samples([percentile(self.latencies, share) if self.latencies else math.inf])


def rows_for(engine: str, n: int, ours: Summary, theirs: Summary) -> list[Row]:
    """The rows of one N: throughput, latencies, fairness."""
    label = f"{n} sessions"
    throughput = theirs.per_turn.median / ours.per_turn.median
    failed = {"memorm": ours.errors, "raw": theirs.errors}
    errors = "; ".join(f"{side} failed turns: {dict(count)}" for side, count in failed.items() if count)
    fair = ours.jain >= JAIN_MIN and ours.under_half == 0
    return [
        Row(
            NAME,
            engine,
            f"{label}: wall time per turn",
            ours.per_turn,
            theirs.per_turn,
            rows=1,
            target=1 / THROUGHPUT_MIN,
            goal=THROUGHPUT_GOAL,
            note=f"{ours.turns:,} turns by memorm in {ours.seconds:.1f} s, {theirs.turns:,} by raw in "
            f"{theirs.seconds:.1f} s: memorm's throughput is {throughput:.3f}x raw's; "
            f"machine load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (shared machines drift)"
            + (f"; {errors}" if errors else ""),
        ),
        Row(NAME, engine, f"{label}: p50 turn latency", ours.at(0.5), theirs.at(0.5)),
        Row(
            NAME,
            engine,
            f"{label}: p99 turn latency",
            ours.at(0.99),
            theirs.at(0.99),
            target=LATENCY_TARGET,
            goal=LATENCY_GOAL,
        ),
        Row(
            NAME,
            engine,
            f"{label}: max turn latency",
            ours.at(1.0),
            theirs.at(1.0),
            target=LATENCY_TARGET,
            goal=LATENCY_GOAL,
        ),
        Row(
            NAME,
            engine,
            f"{label}: Jain {ours.jain:.2f} (raw {theirs.jain:.2f}), "
            f"under half the mean {ours.under_half:.0%} (raw {theirs.under_half:.0%})",
            status="PASS" if fair else "MISS",
            goal=FAIR_GOAL,
            note=f"each the worse of a side's two slices; per-session turns there (min / median / max): "
            f"memorm {ours.spread}, raw {theirs.spread}",
        ),
    ]


# -- the benchmark --------------------------------------------------------------------------------


async def _sessions(db: Database, agent_id: uuid.UUID, count: int) -> list[uuid.UUID]:
    """`count` sessions of `HISTORY` messages each."""
    history = make_messages(HISTORY)
    async with db.unit_of_work() as uow:
        chats = [(await uow.sessions.create(agent_id)).id for _ in range(count)]
        for chat in chats:
            await uow.messages.append(chat, history)
    return chats


def _ids(rows: Sequence[Any]) -> list[uuid.UUID]:
    return [row["id"] if isinstance(row, dict) else row.id for row in rows]


async def run_engine(engine: str, *, seconds: float) -> list[Row]:
    async with store(engine) as where:
        db = where.database(pool_size=POOL, max_overflow=0)
        try:
            await db.create_all()
            async with db.unit_of_work() as uow:
                agent_id = (await uow.agents.create("bench")).id
            most = POOL * max(SCALES)
            sessions = {
                "memorm": await _sessions(db, agent_id, most),
                "raw": await _sessions(db, agent_id, most),
            }
            async with raw_side(where) as raw:
                sides = {"memorm": Side(partial(memorm_append, db), partial(memorm_window, db)), "raw": raw}
                for name, side in sides.items():  # warm-up: both pools full, statements prepared
                    await drive(side, sessions[name], max(0.5, seconds / 10))
                for name in sides:  # both sides read the same rows, whoever wrote them
                    chat = sessions[name][0]
                    ids = [_ids(await side.window(chat, WINDOW)) for side in sides.values()]
                    if ids[0] != ids[1] or len(ids[0]) != WINDOW:
                        raise AssertionError(f"memorm and raw read {name}'s session differently")
                rows: list[Row] = []
                for index, scale in enumerate(SCALES):
                    n = POOL * scale
                    slices = await measure(sides, sessions, n, seconds, flip=bool(index % 2))
                    rows += rows_for(engine, n, Summary.of(slices["memorm"]), Summary.of(slices["raw"]))
                return rows
        finally:
            await db.dispose()


async def run(engines: Sequence[str], *, quick: bool = False) -> list[Row]:
    """The concurrency rows on each engine in ``engines``."""
    seconds = float(SECONDS) if SECONDS else 2.0 if quick else 10.0
    rows: list[Row] = []
    for engine in engines:
        rows += await run_engine(engine, seconds=seconds)
    return rows
