"""One Database from many loops: an append on the server's warm loop vs ``asyncio.run`` per call.

Two rows per engine, both against the raw driver doing the same append:

* warm: one appending unit of work on the benchmark's own loop, whose pool
  is warm; raw: the same append on an open aiosqlite/asyncpg connection.
* ``asyncio.run`` in a worker thread: each call is a new event loop in a
  thread (what sync code calling memorm per request does).  memorm opens its
  connections afresh on that loop and closes them when it ends; raw: the
  thread's ``asyncio.run`` connects, appends and closes, as it must too.

The memorm medians are the numbers docs/concepts.md ("Any event loop, any
thread") quotes.  The two sides alternate call by call, so drift in the
machine's load reaches both alike.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio

from benchmarks.chat_data import make_messages
from benchmarks.chat_memorm import memorm_append, new_session
from benchmarks.core import both_sides
from benchmarks.raw.chat import RawPostgres, RawSQLite, open_raw
from benchmarks.report import Row
from benchmarks.stores import Store
from benchmarks.timing import Samples, timed

NAME = "loops"


async def _in_new_loop(call: Callable[[], Awaitable[Any]]) -> None:
    """``call()`` under ``asyncio.run`` in a worker thread: a fresh event loop per call."""
    await anyio.to_thread.run_sync(lambda: asyncio.run(call()))  # type: ignore[arg-type]


async def _raw_once(where: Store, session_id: uuid.UUID, message: dict[str, Any]) -> None:
    raw: RawSQLite | RawPostgres = await open_raw(where)
    try:
        await raw.append_one(session_id, message)
    finally:
        await raw.close()


async def run_engine(engine: str, *, calls: int) -> list[Row]:
    async with both_sides(engine) as (where, db, raw, agent_id):
        ours, theirs = await new_session(db, agent_id), await new_session(db, agent_id)
        messages = make_messages(calls * 2 + 10)
        for message in messages[:5]:  # warm-up: pools, statement caches, the thread pool
            await memorm_append(db, ours, message)
            await raw.append_one(theirs, message)
            await _in_new_loop(lambda m=message: memorm_append(db, ours, m))
            await _in_new_loop(lambda m=message: _raw_once(where, theirs, m))
        warm, warm_raw, fresh, fresh_raw = Samples(), Samples(), Samples(), Samples()
        for index in range(calls):
            one, two = messages[10 + 2 * index], messages[11 + 2 * index]
            await timed(lambda m=one: memorm_append(db, ours, m), warm)
            await timed(lambda m=one: raw.append_one(theirs, m), warm_raw)
            await timed(lambda m=two: _in_new_loop(lambda: memorm_append(db, ours, m)), fresh)
            await timed(lambda m=two: _in_new_loop(lambda: _raw_once(where, theirs, m)), fresh_raw)
    return [
        Row(
            NAME,
            engine,
            "append on the loop of a warm pool",
            warm,
            warm_raw,
            rows=1,
            note="no target here: core's single appends hold the goal for this path",
        ),
        Row(
            NAME,
            engine,
            "append under asyncio.run in a worker thread",
            fresh,
            fresh_raw,
            rows=1,
            note="no target: a new loop per call; memorm and raw both connect, append and close",
        ),
    ]


async def run(engines: Sequence[str], *, quick: bool = False) -> list[Row]:
    """Both rows on each engine in ``engines``."""
    rows: list[Row] = []
    for engine in engines:
        rows += await run_engine(engine, calls=30 if quick else 200)
    return rows
