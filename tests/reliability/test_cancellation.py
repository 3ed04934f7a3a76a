"""Cancellation of every kind, at any moment of a unit of work, on both engines.

Servers cancel with ``asyncio.wait_for`` (and ``asyncio.timeout``),
``task.cancel()`` and anyio cancel scopes.  Each is tried hundreds of times at
random moments (before, amid and between statements, during BEGIN and
COMMIT); afterwards the pool holds no connection, the SQLite write lock is
free (another connection can begin a write at once), the database passes its
integrity check, every unit of work is all or nothing, ordinary writes carry
on, and nothing was logged through the event loop's exception handler
(no "Future exception was never retrieved").

Migrations, imports and copies into new SQLite files, new connections, and
SQLite writes outside memorm's own statements are cancelled too (below): each
raises the cancellation itself and leaves nothing locked, logged, warned or
pending.  Their quick versions run by default; every test marked `long` tries
hundreds of times.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import random
import sqlite3
import sys
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import asyncpg
import pytest
import sqlalchemy as sa
from conftest import ENGINES, Store, asyncpg_dsn, count_rows

from memorm import Database
from memorm.errors import DatabaseError
from memorm.migrate import head_revision
from memorm.transfer import copy_database, export_jsonl, import_jsonl
from memorm.transfer.copy import verify_copy

pytestmark = [pytest.mark.anyio, pytest.mark.reliability]
LONG = pytest.mark.long

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


@LONG
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


@LONG
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


@LONG
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


@LONG
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


@LONG
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


# -- Migrations, transfers and plain connections ------------------------------
# Cancelled, each raises the cancellation itself (never another error in its
# place) and leaves nothing behind: no lock on the SQLite file (the same
# process writes at once), no connection unclosed (ResourceWarning), no task
# left pending ("Task was destroyed but it is pending!"), nothing logged.
# The quick versions run by default; the `long` ones try every kind many times.


@asynccontextmanager
async def nothing_left(caplog: pytest.LogCaptureFixture) -> AsyncIterator[None]:
    """Assert that the block logs nothing (WARNING and up), warns nothing and leaves no unretrieved error.

    Unclosed connections warn, and pending tasks report, as the garbage
    collector finds them: collected (`settle`) before the checks.
    """
    caplog.set_level(logging.WARNING)
    gc.collect()  # what earlier tests left for the collector is not this block's
    with loop_errors() as errors, warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        yield
        await settle()
    assert [f"{w.category.__name__}: {w.message}" for w in warned] == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert [context.get("message") for context in errors] == []


@asynccontextmanager
async def empty_database(store: Store, tmp_path: Path, name: str) -> AsyncIterator[tuple[Database, Store]]:
    """A `Database` on an empty store (a new SQLite file, or the test's Postgres schema emptied)."""
    if store.engine == "sqlite":
        where = replace(store, url=f"sqlite+aiosqlite:///{tmp_path / f'{name}.db'}")
    else:
        where = store
        admin = await asyncpg.connect(asyncpg_dsn())
        try:
            await admin.execute(
                f'DROP SCHEMA IF EXISTS "{store.schema}" CASCADE; CREATE SCHEMA "{store.schema}"'
            )
        finally:
            await admin.close()
    database = where.database()
    try:
        yield database, where
    finally:
        await database.dispose()


async def timed(work: Callable[[], Awaitable[Any]]) -> float:
    """How long `work` takes, in seconds."""
    started = time.perf_counter()
    await work()
    return time.perf_counter() - started


async def cancel_upgrades(store: Store, tmp_path: Path, kinds: list[str], attempts: int) -> None:
    """`db.upgrade()` of an empty store cancelled at random moments, then run again to the end."""
    spans = []
    for n in range(2):  # the first upgrade of a process also loads the migration scripts
        async with empty_database(store, tmp_path, f"timed-{n}") as (database, _):
            spans.append(await timed(database.upgrade))
    span = min(spans)
    rng = random.Random(f"upgrade-{store.engine}-{kinds}")
    cancelled = 0
    for n in range(attempts):
        async with empty_database(store, tmp_path, f"upgrade-{n}") as (database, where):
            with anyio.fail_after(60):
                cancelled += await cancel_after(
                    kinds[n % len(kinds)], rng.uniform(0, span * 0.8), database.upgrade
                )
            await assert_clean(database, where)
            await database.upgrade()
            assert await database.current_revision() == head_revision()
            async with database.unit_of_work() as uow:
                await uow.agents.create("after")
    assert cancelled > attempts // 2


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
async def test_a_cancelled_upgrade_raises_the_cancellation_and_leaves_the_database_usable(
    store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with nothing_left(caplog):
        await cancel_upgrades(store, tmp_path, KINDS, len(KINDS))


@LONG
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("engine", ENGINES, indirect=True)
async def test_upgrades_cancelled_again_and_again_leave_nothing_behind(
    store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    async with nothing_left(caplog):
        await cancel_upgrades(store, tmp_path, [kind], 25)


def transfer(
    n: int, source: Database, destination: Database, dump: Path, tenant: str | None = None
) -> Callable[[], Awaitable[Any]]:
    """The `n`th transfer into `destination`: an import of `dump` (even `n`), or a copy of `source`
    (of `tenant`'s rows only, if named)."""
    if n % 2 == 0:
        return partial(import_jsonl, destination, dump)
    return partial(copy_database, source, destination, tenant=tenant)


async def cancel_transfers(
    db: Database, tmp_path: Path, kinds: list[str], attempts: int, *, whole: bool
) -> None:
    """Imports and copies of `db` into new SQLite files cancelled at random moments, then run again.

    The moments spread over the destination's migration (which comes first), or with
    `whole` over the whole transfer.
    """
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("source")
        chat = await uow.sessions.create(agent.id)
        await uow.messages.append(chat.id, [{"role": "user", "content": f"m{n}"} for n in range(200)])
    # A role under row-level security (MEMORM_TEST_POSTGRES_ROLE=app) reads its tenant's rows only.
    tenant = None if db.dialect == "sqlite" or db.bypasses_rls else db.tenant
    dump = tmp_path / "dump.jsonl"
    await export_jsonl(db, dump, tenant=tenant)
    destinations = Store("sqlite", "")
    # The faster of two runs: a run slowed by a busy machine would spread the moments past
    # the end of most transfers, and too few would be cancelled for the test to mean anything.
    span = math.inf
    for n in range(2):
        async with empty_database(destinations, tmp_path, f"timed-{n}") as (destination, _):
            span = min(
                span,
                await timed(transfer(n, db, destination, dump, tenant) if whole else destination.upgrade),
            )
    rng = random.Random(f"transfer-{db.dialect}-{kinds}-{whole}")
    cancelled = 0
    for n in range(attempts):
        async with empty_database(destinations, tmp_path, f"transfer-{n}") as (destination, where):
            work = transfer(n, db, destination, dump, tenant)
            with anyio.fail_after(60):
                cancelled += await cancel_after(kinds[n % len(kinds)], rng.uniform(0, span * 0.8), work)
            await assert_clean(destination, where)
            await work()
            report = await verify_copy(db, destination, tenant=tenant)
            assert report.problems == []
    assert cancelled > attempts // 2


@pytest.mark.parametrize("engine", [ENGINES[0]], indirect=True)
async def test_an_import_or_copy_cancelled_as_it_migrates_a_new_sqlite_file_can_run_again(
    db: Database, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with nothing_left(caplog):
        await cancel_transfers(db, tmp_path, KINDS, len(KINDS), whole=False)


@LONG
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("engine", ENGINES, indirect=True)
async def test_imports_and_copies_into_new_sqlite_files_cancelled_anywhere_can_run_again(
    db: Database, tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    async with nothing_left(caplog):
        await cancel_transfers(db, tmp_path, [kind], 12, whole=True)


async def cancel_connects(db: Database, store: Store, attempts: int) -> None:
    """Fresh connections (a schema check's) cancelled as they are made, every kind in turn."""
    await db.dispose()
    span = await timed(db.current_revision)  # a new connection, and one statement
    rng = random.Random(f"connect-{store.engine}")
    for n in range(attempts):
        await db.dispose()
        with anyio.fail_after(10):
            await cancel_after(KINDS[n % len(KINDS)], rng.uniform(0, span), db.current_revision)
        await assert_clean(db, store)
    assert await db.current_revision() == head_revision()


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
async def test_a_connect_cut_short_by_cancellation_is_closed(
    db: Database, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    async with nothing_left(caplog):
        await cancel_connects(db, store, 60)


@LONG
@pytest.mark.parametrize("engine", ENGINES, indirect=True)
async def test_connects_cut_short_again_and_again_are_closed(
    db: Database, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    async with nothing_left(caplog):
        await cancel_connects(db, store, 1_000)


async def cancel_sqlite_writes(db: Database, store: Store, attempts: int) -> None:
    """Writes cancelled mid-way, every kind in turn: in units of work that run statements of their
    own, and on plain connections (as tools use them); the file is writable after each."""
    chat = await _chat(db)
    rng = random.Random("sqlite-writes")

    async def unit_of_work() -> None:
        async with db.unit_of_work() as uow:
            await uow.messages.append(chat, {"role": "user", "content": "lost"})
            await uow.session.execute(sa.text("SELECT count(*) FROM messages"))

    async def plain_connection() -> None:
        async with db.engine.connect() as connection:  # BEGIN IMMEDIATE: it may write
            await connection.exec_driver_sql("SELECT count(*) FROM messages")

    for n in range(attempts):
        work = unit_of_work if n % 2 == 0 else plain_connection
        with anyio.fail_after(10):
            await cancel_after(KINDS[n // 2 % len(KINDS)], rng.uniform(0, 0.004), work)
        await assert_clean(db, store)
        if n % 50 == 49:
            await db.dispose()  # new connections too, whose set-up a cancellation can cut short
    async with db.unit_of_work() as uow:
        [message] = await uow.messages.append(chat, {"role": "user", "content": "kept"})
    assert message.seq <= attempts // 2 + 1  # the next free number: cancelled appends took none or their own


@pytest.mark.parametrize("engine", [ENGINES[0]], indirect=True)
async def test_sqlite_writes_cancelled_mid_way_leave_the_file_writable_and_nothing_pending(
    db: Database, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    async with nothing_left(caplog):
        await cancel_sqlite_writes(db, store, 300)


@LONG
@pytest.mark.parametrize("engine", [ENGINES[0]], indirect=True)
async def test_sqlite_writes_cancelled_again_and_again_leave_the_file_writable(
    db: Database, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    async with nothing_left(caplog):
        await cancel_sqlite_writes(db, store, 3_000)
