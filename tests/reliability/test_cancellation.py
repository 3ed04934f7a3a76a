"""Cancellation of every kind, at any moment of a unit of work, on both engines.

Servers cancel with ``asyncio.wait_for`` (and ``asyncio.timeout``),
``task.cancel()`` and anyio cancel scopes.  Each is tried hundreds of times at
random moments (before, amid and between statements, during BEGIN and
COMMIT); afterwards the pool holds no connection, the SQLite write lock is
free (another connection can begin a write at once), the database passes its
integrity check, every unit of work is all or nothing, ordinary writes carry
on, and nothing was logged through the event loop's exception handler
(no "Future exception was never retrieved").
"""

from __future__ import annotations

import asyncio
import gc
import random
import sqlite3
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import anyio.to_thread
import pytest
import sqlalchemy as sa
from conftest import ENGINES, Store, count_rows

from memorm import Database
from memorm.errors import DatabaseError

pytestmark = [pytest.mark.anyio, pytest.mark.reliability, pytest.mark.long]

POSTGRES = pytest.mark.parametrize("engine", [ENGINES[1]], indirect=True)
KINDS = ["wait_for", "task.cancel", "anyio", *(["asyncio.timeout"] if sys.version_info >= (3, 11) else [])]
ATTEMPTS = 150


async def cancel_after(kind: str, delay: float, work: Callable[[], Awaitable[Any]]) -> bool:
    """Run ``work`` and cancel it ``delay`` seconds in, the ``kind`` way; whether it was cancelled."""
    if kind == "wait_for":
        try:
            await asyncio.wait_for(work(), delay)
        except asyncio.TimeoutError:
            return True
        return False
    if kind == "asyncio.timeout":
        try:
            async with asyncio.timeout(delay):  # type: ignore[attr-defined]
                await work()
        except TimeoutError:
            return True
        return False
    if kind == "task.cancel":
        task = asyncio.ensure_future(work())
        await asyncio.sleep(delay)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return True
        return False
    with anyio.move_on_after(delay) as scope:
        await work()
    return scope.cancelled_caught


@contextmanager
def loop_errors() -> Iterator[list[dict[str, Any]]]:
    """Record what reaches the event loop's exception handler (unretrieved futures and the like)."""
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    seen: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    try:
        yield seen
    finally:
        loop.set_exception_handler(previous)


async def settle() -> None:
    """Let callbacks run and collect garbage, so an unretrieved future reports now."""
    for _ in range(3):
        await asyncio.sleep(0.05)
        gc.collect()


async def _chat(db: Database) -> uuid.UUID:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create(f"agent-{uuid.uuid4().hex[:8]}")
        return (await uow.sessions.create(agent.id)).id


async def assert_clean(db: Database, store: Store) -> None:
    """No pooled connection checked out, the write lock free, the file intact."""
    assert db.engine.pool.checkedout() == 0
    if store.engine != "sqlite":
        return
    assert db.writer_lock is not None
    assert not db.writer_lock.locked()
    path = store.url.removeprefix("sqlite+aiosqlite:///")

    def write_and_check() -> list[Any]:
        # Another connection begins a write at once: no pooled connection kept a transaction open.
        with sqlite3.connect(path, timeout=0.5, isolation_level=None) as raw:
            raw.execute("BEGIN IMMEDIATE")
            raw.execute("ROLLBACK")
            return raw.execute("PRAGMA integrity_check").fetchall()

    assert await anyio.to_thread.run_sync(write_and_check) == [("ok",)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("engine", ENGINES, indirect=True)
async def test_cancellation_amid_appends_rolls_back_every_time(db: Database, store: Store, kind: str) -> None:
    chat = await _chat(db)
    rng = random.Random(f"{kind}-{store.engine}")
    cancelled = 0

    async def appends_forever() -> None:
        async with db.unit_of_work() as uow:
            while True:
                await uow.messages.append(chat, {"role": "user", "content": "lost"})

    with loop_errors() as errors:
        for _ in range(ATTEMPTS):
            # From "before the first statement" to several appends in.
            with anyio.fail_after(10):
                cancelled += await cancel_after(kind, rng.uniform(0, 0.012), appends_forever)
            assert db.engine.pool.checkedout() == 0
        await settle()
    assert errors == []
    assert cancelled == ATTEMPTS
    await assert_clean(db, store)
    assert await count_rows(db, "messages") == 0
    async with db.unit_of_work() as uow:
        [message] = await uow.messages.append(chat, {"role": "user", "content": "kept"})
        assert (await uow.sessions.get(chat)).next_seq == 2
    assert message.seq == 1


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("engine", ENGINES, indirect=True)
async def test_a_unit_of_work_cancelled_anywhere_is_all_or_nothing(
    db: Database, store: Store, kind: str
) -> None:
    """Cancellations landing in BEGIN, between statements and in COMMIT: each unit of work whole or absent."""
    chat = await _chat(db)
    rng = random.Random(f"whole-{kind}-{store.engine}")
    finished: list[int] = []

    async def two_appends_and_a_read(n: int) -> None:
        async with db.unit_of_work() as uow:
            await uow.messages.append(chat, {"role": "user", "content": f"q{n}"})
            await uow.messages.window(chat, limit=2)
            await uow.messages.append(chat, {"role": "assistant", "content": f"a{n}"})
        finished.append(n)

    # Time one unit of work, so the deadlines spread over all of it, COMMIT included.
    started = time.perf_counter()
    await two_appends_and_a_read(-1)
    span = time.perf_counter() - started
    with loop_errors() as errors:
        for n in range(ATTEMPTS):
            with anyio.fail_after(10):
                await cancel_after(kind, rng.uniform(0, span * 1.5), lambda n=n: two_appends_and_a_read(n))
        await settle()
    assert errors == []
    await assert_clean(db, store)
    async with db.unit_of_work(read_only=True) as uow:
        stored = await uow.messages.window(chat, limit=1000)
        counter = (await uow.sessions.get(chat)).next_seq
    contents = [m.content for m in stored]
    # Whole pairs only, in order, with gap-free numbers: a cancelled COMMIT either landed or did not.
    assert [m.seq for m in stored] == list(range(1, len(stored) + 1))
    assert counter == len(stored) + 1
    assert contents[0::2] == [f"q{n}" for n in [-1, *_pairs(contents)]]
    assert contents[1::2] == [f"a{n}" for n in [-1, *_pairs(contents)]]
    # Every unit of work that returned normally is stored.
    assert set(finished) <= {-1, *_pairs(contents)}
    async with db.unit_of_work() as uow:
        [message] = await uow.messages.append(chat, {"role": "user", "content": "after"})
    assert message.seq == len(stored) + 1


def _pairs(contents: list[str]) -> list[int]:
    return [int(c[1:]) for c in contents[2::2]]


@POSTGRES
@pytest.mark.parametrize("kind", KINDS)
async def test_a_long_postgres_statement_is_cancelled_on_the_server(
    db: Database, store: Store, kind: str
) -> None:
    chat = await _chat(db)
    # This test's own statement: another suite on the same server may sleep too.
    sleep = f"SELECT pg_sleep(30) /* {uuid.uuid4().hex} */"

    async def sleeps() -> None:
        async with db.unit_of_work() as uow:
            await uow.messages.append(chat, {"role": "user", "content": "lost"})
            await uow.session.execute(sa.text(sleep))

    with loop_errors() as errors:
        for _ in range(5):
            started = time.monotonic()
            with anyio.fail_after(5):
                assert await cancel_after(kind, 0.2, sleeps)
            assert time.monotonic() - started < 2
        await settle()
    assert errors == []
    await assert_clean(db, store)
    async with db.unit_of_work(read_only=True) as uow:
        sleeping = await uow.session.scalar(
            sa.text("SELECT count(*) FROM pg_stat_activity WHERE query = :sleep"), {"sleep": sleep}
        )
    assert sleeping == 0  # the server stopped them: nothing holds a backend
    assert await count_rows(db, "messages") == 0


@pytest.mark.parametrize("engine", [ENGINES[0]], indirect=True)
@pytest.mark.parametrize("kind", KINDS)
async def test_a_long_sqlite_statement_is_interrupted(db: Database, store: Store, kind: str) -> None:
    chat = await _chat(db)
    slow = sa.text(
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 200000000) "
        "SELECT count(*) FROM c"
    )

    async def counts() -> None:
        async with db.unit_of_work() as uow:
            await uow.messages.append(chat, {"role": "user", "content": "lost"})
            await uow.session.execute(slow)  # tens of seconds if left to run

    with loop_errors() as errors:
        started = time.monotonic()
        with anyio.fail_after(10):
            assert await cancel_after(kind, 0.2, counts)
        assert time.monotonic() - started < 5
        await settle()
    assert errors == []
    await assert_clean(db, store)
    assert await count_rows(db, "messages") == 0


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.timeout is new in 3.11")
@pytest.mark.parametrize("engine", ENGINES, indirect=True)
async def test_a_swallowed_cancellation_amid_a_statement_fails_the_unit_of_work(db: Database) -> None:
    """A caller that catches the timeout and carries on must not commit a half-known write."""
    chat = await _chat(db)
    interrupted = 0
    for attempt in range(40):
        with pytest.raises(DatabaseError, match="interrupted by cancellation"):  # noqa: PT012
            async with db.unit_of_work() as uow:
                await uow.messages.append(chat, {"role": "user", "content": "first"})
                try:
                    async with asyncio.timeout(0.0003 * attempt):  # type: ignore[attr-defined]
                        while True:
                            await uow.messages.append(chat, {"role": "user", "content": "more"})
                except TimeoutError:
                    interrupted += 1  # the caller carries on as if nothing happened
        assert db.engine.pool.checkedout() == 0
    assert interrupted == 40
    assert await count_rows(db, "messages") == 0
    async with db.unit_of_work() as uow:
        [message] = await uow.messages.append(chat, {"role": "user", "content": "kept"})
    assert message.seq == 1
