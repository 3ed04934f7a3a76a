"""Core: the chat path, memorm against the raw driver doing the same work (the issue's goals).

For each engine, memorm and the raw baseline of :mod:`benchmarks.raw.chat`
do the same essential writes and reads, interleaved, and each row compares
their medians:

1. bulk append of 10,000 messages (varied text, a ``meta`` dict each) to one
   session in one unit of work, memorm from dicts and from ``Message``
   objects built inside the timing (the raw side makes its ids and
   serialises its JSON inside the timing too);
2. single-message appends, each in its own unit of work (p50), from dicts
   and from a ``Message`` built inside the timing;
3. the newest 50 messages of sessions holding 1,000 and 100,000 messages,
   decoded into Python objects (memorm: ``Message``; raw: dicts with parsed
   uuids, datetimes and JSON), and whether memorm's latency stays flat;
4. ``context(max_tokens=8000)`` on the 100,000-message session (about 50
   messages fit, so it reads what ``window(limit=50)`` reads) against the
   raw driver's one-statement equivalent.

Before timing anything, :func:`check_equivalence` proves both sides write
and read the same rows.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, NamedTuple

from benchmarks.chat_data import SYSTEM, as_models, make_messages
from benchmarks.chat_memorm import fill_session, memorm_append, memorm_context, memorm_window, new_session
from benchmarks.raw.chat import COLUMNS, WRITTEN, RawPostgres, RawSQLite, open_raw
from benchmarks.report import Row
from benchmarks.stores import Store, store
from benchmarks.timing import Job, Samples, interleaved
from memorm import Database, Message
from memorm.models import MESSAGES

NAME = "core"

# The goals: memorm's median at most this times the raw driver's.
BULK_TARGET = 1.1
SINGLE_TARGET = 1.5
WINDOW_TARGET = 1.5
CONTEXT_TARGET = 1.5
FLAT_LIMIT = 1.5  # memorm window latency at 100k may be at most this times its latency at 1k
CONTEXT_TOKENS = 8_000
BULK_GOAL = f"bulk append 10k with meta <= {BULK_TARGET:g}x (executemany / COPY)"
SINGLE_GOAL = f"chat append, 1 message per unit of work, p50 <= {SINGLE_TARGET:g}x"
WINDOW_GOAL = f"window of 50 (1k-100k history) <= {WINDOW_TARGET:g}x"
CONTEXT_GOAL = f"context(max_tokens={CONTEXT_TOKENS}) <= {CONTEXT_TARGET:g}x"


class Sides(NamedTuple):
    """What `both_sides` opens."""

    where: Store
    db: Database
    raw: RawSQLite | RawPostgres
    agent_id: uuid.UUID


# -- checks ---------------------------------------------------------------------------------------


def _comparable(message: Message | Mapping[str, Any]) -> tuple[Any, ...]:
    values = message.__dict__ if isinstance(message, Message) else message
    return tuple(str(values[c]) if c in ("id", "session_id", "agent_id") else values[c] for c in COLUMNS)


def _same(memorm: Sequence[Message], raw: Sequence[Mapping[str, Any]], what: str) -> None:
    ours, theirs = [_comparable(m) for m in memorm], [_comparable(m) for m in raw]
    if ours != theirs:
        raise AssertionError(f"memorm and raw read {what} differently:\n{ours}\n{theirs}")


_PER_WRITE = frozenset({"id", "created_at", "updated_at", "session_id"})  # differ between any two writes


async def check_equivalence(db: Database, raw: RawSQLite | RawPostgres, agent_id: uuid.UUID) -> None:
    """Guard the comparison: memorm and the raw baseline must write and read the same rows.

    The same messages are appended by each (a batch, then a single message); every
    column but ids and timestamps must match, on SQLite so must each stored
    value's type and length (the encodings), and every session must read back
    identically through memorm and through the raw decoder, as a window and as
    contexts of every budget.  When memorm's schema or defaults change, this
    fails until the raw baseline follows.
    """
    columns = tuple(column.name for column in MESSAGES.columns)
    if columns != WRITTEN:
        raise AssertionError(f"messages now has columns {columns}: update benchmarks.raw.chat")
    batch = [
        SYSTEM,
        {"role": "user", "content": "ü hi", "name": "ana", "token_count": 3, "meta": {"n": 1, "t": 0.5}},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "function": {"name": "f"}}]},
        *make_messages(4),
    ]
    single = {"role": "tool", "content": "42", "tool_call_id": "c1", "meta": {"tags": ["a", "é"]}}
    by_memorm, by_raw = await new_session(db, agent_id), await new_session(db, agent_id)
    await memorm_append(db, by_memorm, batch)
    await memorm_append(db, by_memorm, single)
    await raw.append_bulk(by_raw, batch)
    await raw.append_one(by_raw, single)
    written: dict[str, list[tuple[Any, ...]]] = {}
    for writer, session_id in (("memorm", by_memorm), ("raw", by_raw)):
        through_raw = await raw.window(session_id, 50)
        _same(await memorm_window(db, session_id, 50), through_raw, f"{writer}'s rows")
        for budget in range(1, 1_000, 7):
            got = await raw.context(session_id, budget)
            _same(await memorm_context(db, session_id, budget), got, f"{writer}'s context({budget})")
        written[writer] = [
            tuple(
                value
                for column, value in zip(COLUMNS, _comparable(row), strict=True)
                if column not in _PER_WRITE
            )
            for row in through_raw
        ]
    if written["memorm"] != written["raw"]:
        raise AssertionError(f"the raw baseline writes other values than memorm:\n{written}")
    if isinstance(raw, RawSQLite):
        shapes = [await raw.shapes(session_id) for session_id in (by_memorm, by_raw)]
        if shapes[0] != shapes[1]:
            raise AssertionError(f"the raw baseline encodes values unlike memorm:\n{shapes[0]}\n{shapes[1]}")


# -- the benchmark --------------------------------------------------------------------------------


async def bench_bulk(
    db: Database, raw: RawSQLite | RawPostgres, agent_id: uuid.UUID, engine: str, *, reps: int, size: int
) -> list[Row]:
    messages = make_messages(size)
    dicts, models, driver = Samples(), Samples(), Samples()
    # Warm-up: statement caches, prepared statements, the COPY introspection query.
    for _ in range(2):
        await memorm_append(db, await new_session(db, agent_id), messages[:200])
        await memorm_append(db, await new_session(db, agent_id), as_models(messages[:200]))
        await raw.append_bulk(await new_session(db, agent_id), messages[:200])
    for rep in range(reps):
        sessions = [await new_session(db, agent_id) for _ in range(3)]
        jobs: list[Job] = [
            (dicts, lambda s=sessions[0]: memorm_append(db, s, messages)),
            # The objects are built inside the timing: their ids and defaults are part of the work.
            (models, lambda s=sessions[1]: memorm_append(db, s, as_models(messages))),
            (driver, lambda s=sessions[2]: raw.append_bulk(s, messages)),
        ]
        await interleaved(jobs, 1, offset=rep, collect=True)  # fresh sessions each repetition
    method = "executemany" if engine == "sqlite" else "COPY (copy_records_to_table)"
    label = f"bulk append {size:,} with meta (one uow)"
    return [
        Row(
            NAME,
            engine,
            f"{label}, dicts",
            dicts,
            driver,
            rows=size,
            target=BULK_TARGET,
            goal=BULK_GOAL,
            note=f"raw: {method}",
        ),
        Row(
            NAME,
            engine,
            f"{label}, Message objs",
            models,
            driver,
            rows=size,
            target=BULK_TARGET,
            goal=BULK_GOAL,
            note="the Message objects are built inside the timing",
        ),
    ]


async def bench_singles(
    db: Database, raw: RawSQLite | RawPostgres, agent_id: uuid.UUID, engine: str, *, count: int
) -> list[Row]:
    messages = make_messages(count)
    dicts, models, theirs = [await new_session(db, agent_id) for _ in range(3)]
    for message in make_messages(20, count):  # warm-up
        await memorm_append(db, dicts, message)
        await memorm_append(db, models, Message(**message))
        await raw.append_one(theirs, message)
    by_dict, by_model, driver = Samples(), Samples(), Samples()
    for index, message in enumerate(messages):
        jobs: list[Job] = [
            (by_dict, lambda m=message: memorm_append(db, dicts, m)),
            (by_model, lambda m=message: memorm_append(db, models, Message(**m))),
            (driver, lambda m=message: raw.append_one(theirs, m)),
        ]
        await interleaved(jobs, 1, offset=index)
    label = f"chat append, 1 message per uow (p50 of {count:,})"
    total = f"total memorm {sum(by_model.seconds):.2f} s, raw {sum(driver.seconds):.2f} s"
    return [
        Row(
            NAME,
            engine,
            f"{label}, dict",
            by_dict,
            driver,
            rows=1,
            target=SINGLE_TARGET,
            goal=SINGLE_GOAL,
        ),
        Row(
            NAME,
            engine,
            f"{label}, Message",
            by_model,
            driver,
            rows=1,
            target=SINGLE_TARGET,
            goal=SINGLE_GOAL,
            note=f"the Message is built inside the timing; {total}",
        ),
    ]


async def histories(db: Database, agent_id: uuid.UUID, sizes: Sequence[int]) -> dict[int, uuid.UUID]:
    """A session of each size, filled through memorm: the system message, then the chat."""
    sessions = {}
    for size in sizes:
        sessions[size] = await new_session(db, agent_id)
        await fill_session(db, sessions[size], size)
    return sessions


async def bench_window(
    db: Database,
    raw: RawSQLite | RawPostgres,
    sessions: Mapping[int, uuid.UUID],
    engine: str,
    *,
    reads: int,
    limit: int = 50,
) -> list[Row]:
    for size, session_id in sessions.items():
        got_memorm = await memorm_window(db, session_id, limit)
        _same(got_memorm, await raw.window(session_id, limit), f"the window of {size:,}")
        if [m.seq for m in got_memorm] != list(range(size - limit + 1, size + 1)):
            raise AssertionError("the window is not the newest messages")
        for _ in range(20):  # warm-up
            await memorm_window(db, session_id, limit)
            await raw.window(session_id, limit)
    samples = {(size, side): Samples() for size in sessions for side in ("memorm", "raw")}
    jobs: list[Job] = []
    for size, session_id in sessions.items():
        jobs.append((samples[size, "memorm"], lambda s=session_id: memorm_window(db, s, limit)))
        jobs.append((samples[size, "raw"], lambda s=session_id: raw.window(s, limit)))
    # Every size and side in turn (the flatness check compares sizes, so drift must hit all alike).
    await interleaved(jobs, reads)
    rows = [
        Row(
            NAME,
            engine,
            f"window {limit} of {size:,} (read-only uow)",
            samples[size, "memorm"],
            samples[size, "raw"],
            rows=limit,
            target=WINDOW_TARGET,
            goal=WINDOW_GOAL,
            note=""
            if index
            else "raw: one autocommit SELECT, rows decoded to dicts; memorm: a read-only unit of work "
            "(autocommit: no BEGIN/COMMIT) loading Message objects",
        )
        for index, size in enumerate(sessions)
    ]
    if len(sessions) > 1:
        small, large = min(sessions), max(sessions)
        growth = samples[large, "memorm"].median / samples[small, "memorm"].median
        rows.append(
            Row(
                NAME,
                engine,
                f"window latency flat {small:,} -> {large:,}",
                status="PASS" if growth <= FLAT_LIMIT else "MISS",
                goal=WINDOW_GOAL,
                note=f"memorm median at {large:,} is {growth:.2f}x its median at {small:,} "
                f"(flat means <= {FLAT_LIMIT:g}x)",
            )
        )
    return rows


async def bench_context(
    db: Database, raw: RawSQLite | RawPostgres, session_id: uuid.UUID, size: int, engine: str, *, reads: int
) -> list[Row]:
    """``context(max_tokens=8000)`` against the raw one-statement equivalent (and raw ``window(50)``)."""
    fitted = await memorm_context(db, session_id, CONTEXT_TOKENS)
    _same(fitted, await raw.context(session_id, CONTEXT_TOKENS), f"the context of {size:,}")
    if fitted[0].role != "system" or fitted[-1].seq != size:
        raise AssertionError("the context is not the system message and the newest messages")
    for _ in range(20):  # warm-up
        await memorm_context(db, session_id, CONTEXT_TOKENS)
        await raw.context(session_id, CONTEXT_TOKENS)
        await raw.window(session_id, 50)
    ours, theirs, window = Samples(), Samples(), Samples()
    jobs: list[Job] = [
        (ours, lambda: memorm_context(db, session_id, CONTEXT_TOKENS)),
        (theirs, lambda: raw.context(session_id, CONTEXT_TOKENS)),
        (window, lambda: raw.window(session_id, 50)),
    ]
    await interleaved(jobs, reads)
    return [
        Row(
            NAME,
            engine,
            f"context(max_tokens={CONTEXT_TOKENS}) of {size:,} (read-only uow)",
            ours,
            theirs,
            rows=len(fitted),
            target=CONTEXT_TARGET,
            goal=CONTEXT_GOAL,
            note=f"{len(fitted)} messages fit; raw: one statement (the system message and a running "
            f"token sum over the newest rows), rows decoded to dicts; raw window(50) takes "
            f"{window.median * 1e3:.2f} ms: memorm's context is {ours.median / window.median:.2f}x that",
        )
    ]


@asynccontextmanager
async def both_sides(engine: str) -> AsyncIterator[Sides]:
    """A fresh store with memorm's schema, a memorm `Database` and a raw connection on it, and an agent."""
    async with store(engine) as where:
        db = where.database()
        raw = await open_raw(where)
        try:
            await db.create_all()
            async with db.unit_of_work() as uow:
                agent_id = (await uow.agents.create("bench")).id
            yield Sides(where, db, raw, agent_id)
        finally:
            await raw.close()
            await db.dispose()


async def run_engine(engine: str, *, quick: bool = False) -> list[Row]:
    async with both_sides(engine) as (_, db, raw, agent_id):
        await check_equivalence(db, raw, agent_id)
        rows = await bench_bulk(db, raw, agent_id, engine, reps=2 if quick else 9, size=10_000)
        rows += await bench_singles(db, raw, agent_id, engine, count=100 if quick else 1_000)
        sizes = (1_000, 10_000 if quick else 100_000)
        sessions = await histories(db, agent_id, sizes)
        reads = 20 if quick else 200
        rows += await bench_window(db, raw, sessions, engine, reads=reads)
        rows += await bench_context(db, raw, sessions[sizes[-1]], sizes[-1], engine, reads=reads)
        return rows


async def run(engines: Sequence[str], *, quick: bool = False) -> list[Row]:
    """Every core benchmark on each engine in ``engines``."""
    rows: list[Row] = []
    for engine in engines:
        rows += await run_engine(engine, quick=quick)
    return rows
