"""MemormSaver cancelled mid-flight, and its sync API beside a running loop, on both engines.

LangGraph cancels a run's checkpointer calls when the run is cancelled (a
client disconnects, a timeout fires).  Each of `aput`, `aput_writes`,
`aget_tuple` and `alist` is cancelled here at random moments, every way
servers cancel (the patterns and checks of test_cancellation.py): a
checkpoint is afterwards stored whole, with every channel value it brought, or
not at all; a task's writes likewise; the pool holds no connection, the SQLite
write lock is free, the next call works, and nothing reached the loop's
exception handler.  Then the sync API (`put`, `get_tuple`) is called from
worker threads that run their own `asyncio.run`, while the main loop writes
through the same `Database` and saver.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread
import pytest
import sqlalchemy as sa
from conftest import ENGINES, Store

from memorm import Database
from memorm.compat.langchain import adispose_sync
from memorm.compat.langgraph import CheckpointRetention, MemormSaver
from memorm.retention import purge_checkpoints
from reliability.test_cancellation import KINDS, assert_clean, cancel_after, loop_errors, settle

pytestmark = [pytest.mark.anyio, pytest.mark.reliability, pytest.mark.long]

ATTEMPTS = 60
# Calls per attempt, in turn: one SQLite call (~0.3 ms) is shorter than the event loop's
# timers can aim (epoll waits whole milliseconds), so a deadline would rarely land inside one.
BURST = 4
CHANNELS = ("messages", "summary", "scratch", "plan")
WRITES = 20  # per task


@pytest.fixture
async def db(db: Database) -> AsyncIterator[Database]:
    yield db
    await adispose_sync(db)  # the sync tests' private-loop pool


async def _saver(db: Database) -> MemormSaver:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create(f"graph-{uuid.uuid4().hex[:8]}")
    return MemormSaver(db, agent=agent.id)


def _config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}


def _version(n: int) -> str:
    return f"{n:032}.0"


def _values(n: int, size: int) -> dict[str, str]:
    return {channel: f"{channel}-{n}-" + "x" * size for channel in CHANNELS}


def _checkpoint(n: int, *, size: int = 2_000) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """Checkpoint `n` (id `n`, zero-padded), each channel new in it; its metadata and new versions."""
    versions = {channel: _version(n) for channel in CHANNELS}
    checkpoint = {
        "v": 1,
        "id": f"{n:08}",
        "ts": "2026-01-01T00:00:00+00:00",
        "channel_values": _values(n, size),
        "channel_versions": versions,
        "versions_seen": {},
        "updated_channels": list(CHANNELS),
    }
    return checkpoint, {"source": "loop", "step": n}, versions


async def _put(saver: MemormSaver, thread: str, n: int, *, size: int = 2_000) -> dict[str, Any]:
    checkpoint, metadata, versions = _checkpoint(n, size=size)
    return dict(await saver.aput(_config(thread), checkpoint, metadata, versions))  # type: ignore[arg-type]


async def _rows(db: Database, sql: str) -> list[tuple[Any, ...]]:
    async with db.unit_of_work(read_only=True) as uow:
        return [tuple(row) for row in await uow.session.execute(sa.text(sql))]


async def _assert_checkpoints_whole(db: Database, saver: MemormSaver, thread: str) -> set[int]:
    """Every stored checkpoint of `thread` has all its channel values and no value is left without one."""
    stored = {int(row[0]) for row in await _rows(db, "SELECT checkpoint_id FROM graph_checkpoints")}
    blobs = await _rows(db, "SELECT channel, version FROM graph_blobs")
    assert sorted(blobs) == sorted((channel, _version(n)) for n in stored for channel in CHANNELS)
    for n in sorted(stored)[-3:]:  # and they read back whole
        found = await saver.aget_tuple(
            {"configurable": {**_config(thread)["configurable"], "checkpoint_id": f"{n:08}"}}
        )
        assert found is not None
        assert found.checkpoint["channel_values"] == _values(n, 2_000)
        assert found.metadata["step"] == n
    return stored


class Deadlines:
    """Random deadlines inside the time a call takes, following that time as the machine's load changes.

    Each deadline is drawn from [0, 1.5 times the median of the last calls that finished]: about two
    thirds land mid-flight whether the machine is idle or busy (a span measured once, idle, let
    most calls finish first when CI's load made them slower or faster).
    """

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.finished: list[float] = []
        self.cancelled = 0

    async def warm_up(self, *works: Any) -> None:
        """Run `works` in turn, uncancelled, to learn how long a call takes (the first warms up)."""
        for work in works:
            started = time.perf_counter()
            await work()
            self.finished.append(time.perf_counter() - started)
        del self.finished[0]

    async def run(self, kind: str, work: Any) -> None:
        """Run `work` under a random deadline of the `kind` way of cancelling, within 10 s."""
        recent = sorted(self.finished[-9:])
        delay = self.rng.uniform(0, recent[len(recent) // 2] * 1.5)
        started = time.perf_counter()
        with anyio.fail_after(10):
            if await cancel_after(kind, delay, work):
                self.cancelled += 1
            else:
                self.finished.append(time.perf_counter() - started)


async def cancel_each(
    db: Database,
    store: Store,
    kind: str,
    work: Callable[[int], Awaitable[Any]],
    attempts: int = ATTEMPTS,
    *,
    repeatable: bool = False,
) -> None:
    """Run `work(n)` under random deadlines (`Deadlines`, warmed up by n = 0, 1, 2), `attempts` times.

    The deadlines land mid-flight, and leave nothing behind: no loop error,
    no connection out of the pool, the SQLite write lock free.  A `repeatable`
    work (a read, whatever its `n`) runs up to three times as often when too few
    deadlines landed mid-flight: on a loaded machine a read's time swings more
    than the deadlines follow (CI once saw 4 of 30 land).
    """
    deadlines = Deadlines(random.Random(f"{work.__name__}-{kind}-{store.engine}"))
    await deadlines.warm_up(*(lambda n=n: work(n) for n in range(3)))
    most = attempts * (3 if repeatable else 1)
    with loop_errors() as errors:
        n = 3
        while n < attempts + 3 or (n < most + 3 and deadlines.cancelled <= attempts // 5):
            await deadlines.run(kind, lambda n=n: work(n))
            assert db.engine.pool.checkedout() == 0
            n += 1
        await settle()
    assert errors == []
    assert deadlines.cancelled > attempts // 5  # the deadlines did land mid-flight
    await assert_clean(db, store)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("engine", ENGINES, indirect=True)
async def test_a_cancelled_aput_stores_the_checkpoint_with_all_its_values_or_nothing(
    db: Database, store: Store, kind: str
) -> None:
    saver = await _saver(db)
    finished: set[int] = set()

    async def put(n: int) -> None:  # attempt n: checkpoints n * BURST onwards, in turn
        for m in range(n * BURST, (n + 1) * BURST):
            await _put(saver, "t", m)
            finished.add(m)

    await cancel_each(db, store, kind, put)  # (the first warm-up makes the session)
    stored = await _assert_checkpoints_whole(db, saver, "t")
    assert finished <= stored  # every aput that returned is there
    config = await _put(saver, "t", (ATTEMPTS + 3) * BURST)  # the next call works
    latest = await saver.aget_tuple(_config("t"))
    assert latest is not None
    assert latest.config["configurable"]["checkpoint_id"] == config["configurable"]["checkpoint_id"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("engine", ENGINES, indirect=True)
async def test_a_cancelled_aput_writes_stores_all_of_a_tasks_writes_or_none(
    db: Database, store: Store, kind: str
) -> None:
    saver = await _saver(db)
    config = await _put(saver, "t", 1)
    writes = [(f"w{i}", {"i": i, "text": "y" * 500}) for i in range(WRITES)]
    finished: set[str] = set()

    async def put_writes(n: int) -> None:  # attempt n: BURST tasks' writes, in turn
        for task in (f"task-{n}-{i}" for i in range(BURST)):
            await saver.aput_writes(config, writes, task)  # type: ignore[arg-type]
            finished.add(task)

    await cancel_each(db, store, kind, put_writes)
    counts = dict(await _rows(db, "SELECT task_id, count(*) FROM graph_writes GROUP BY task_id"))
    assert set(counts.values()) == {WRITES}  # whole tasks only
    assert finished <= set(counts)
    found = await saver.aget_tuple(config)  # type: ignore[arg-type]
    assert found is not None
    assert len(found.pending_writes or []) == WRITES * len(counts)
    await saver.aput_writes(config, writes[:1], "after")  # type: ignore[arg-type]
    assert (await _rows(db, "SELECT count(*) FROM graph_writes WHERE task_id = 'after'")) == [(1,)]


async def _thread_counts(db: Database) -> dict[str, int]:
    """Checkpoints per thread (session key), each checked whole: every channel value of each is there."""
    checkpoints = await _rows(
        db,
        "SELECT s.key, c.checkpoint_id FROM graph_checkpoints c JOIN sessions s ON s.id = c.session_id",
    )
    blobs = await _rows(
        db,
        "SELECT s.key, b.channel, b.version FROM graph_blobs b JOIN sessions s ON s.id = b.session_id",
    )
    assert sorted(blobs) == sorted(
        (key, channel, _version(int(checkpoint))) for key, checkpoint in checkpoints for channel in CHANNELS
    )
    counts: dict[str, int] = {}
    for key, _ in checkpoints:
        counts[key] = counts.get(key, 0) + 1
    return counts


PURGED_THREADS = 2  # per attempt, each of PURGED_RUNS checkpoints, purged to PURGED_KEEP
PURGED_RUNS = 6
PURGED_KEEP = 2


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("engine", ENGINES, indirect=True)
async def test_a_cancelled_checkpoint_purge_removes_each_thread_whole_or_not_at_all(
    db: Database, store: Store, kind: str
) -> None:
    # Each attempt purges an agent of its own: two threads, six checkpoints each (one unit of work
    # per thread, so a cut can fall between them).
    agents = []
    for n in range(ATTEMPTS + 3):
        saver = await _saver(db)
        agents.append(saver.agent_id)
        for thread in range(PURGED_THREADS):
            for m in range(1, PURGED_RUNS + 1):
                await _put(saver, f"p{n}-{thread}", m, size=200)
    finished: set[int] = set()

    async def purge(n: int) -> None:
        removed = await purge_checkpoints(db, keep_last=PURGED_KEEP, agent=agents[n])
        assert removed.checkpoints == PURGED_THREADS * (PURGED_RUNS - PURGED_KEEP)
        finished.add(n)

    await cancel_each(db, store, kind, purge)
    counts = await _thread_counts(db)
    assert set(counts.values()) <= {PURGED_RUNS, PURGED_KEEP}  # a thread is purged whole, or not at all
    assert {int(key[1:].split("-")[0]) for key, count in counts.items() if count == PURGED_RUNS}.isdisjoint(
        finished
    )
    assert PURGED_RUNS in counts.values()  # some were cut short before their thread's turn
    await purge_checkpoints(db, keep_last=PURGED_KEEP)  # a rerun finishes the rest
    assert set((await _thread_counts(db)).values()) == {PURGED_KEEP}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("engine", ENGINES, indirect=True)
async def test_a_cancelled_aput_of_a_saver_that_purges_leaves_whole_checkpoints(
    db: Database, store: Store, kind: str
) -> None:
    # Retention after every write: the write and the purge are units of work of their own, and a
    # cut between them leaves the thread one purge behind, never half-purged.
    retention = CheckpointRetention(keep_last=PURGED_KEEP, every=1)
    saver = MemormSaver(db, agent=(await _saver(db)).agent_id, retention=retention)
    finished: set[int] = set()

    async def put(n: int) -> None:
        for m in range(n * BURST, (n + 1) * BURST):
            await _put(saver, "t", m, size=200)
            finished.add(m)

    await cancel_each(db, store, kind, put)
    stored = {int(row[0]) for row in await _rows(db, "SELECT checkpoint_id FROM graph_checkpoints")}
    assert (await _thread_counts(db))["t"] == len(stored)  # each whole
    # A finished write is kept, unless writes after it reached the database (their calls cut short
    # only after their purge committed) and pushed it past the newest PURGED_KEEP.
    assert sorted(stored | finished)[-PURGED_KEEP:] == sorted(stored)[-PURGED_KEEP:]
    last = (ATTEMPTS + 3) * BURST
    await _put(saver, "t", last, size=200)  # the next write purges what is left over
    after = sorted(int(row[0]) for row in await _rows(db, "SELECT checkpoint_id FROM graph_checkpoints"))
    assert after == sorted(stored | {last})[-PURGED_KEEP:]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("engine", ENGINES, indirect=True)
async def test_cancelled_reads_leave_nothing_behind_and_the_next_read_is_whole(
    db: Database, store: Store, kind: str
) -> None:
    """`aget_tuple` of a large checkpoint, `alist` over two pages, cancelled anywhere (decoding too)."""
    saver = await _saver(db)
    for n in range(1, 131):  # two pages of `alist` (100 a page)
        await _put(saver, "t", n, size=2_000 if n < 130 else 30_000)
    newest = _config("t")

    async def read_one(_: int) -> None:
        for _ in range(BURST):
            found = await saver.aget_tuple(newest)  # type: ignore[arg-type]
            assert found is not None

    async def read_all(_: int) -> None:
        assert len([item async for item in saver.alist(newest)]) == 130  # type: ignore[arg-type]

    for read in (read_one, read_all):
        await cancel_each(db, store, kind, read, ATTEMPTS // 2, repeatable=True)
    found = await saver.aget_tuple(newest)  # type: ignore[arg-type]
    assert found is not None
    assert found.checkpoint["channel_values"] == _values(130, 30_000)
    listed = [item.checkpoint["id"] async for item in saver.alist(newest)]  # type: ignore[arg-type]
    assert listed == [f"{n:08}" for n in range(130, 0, -1)]


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
async def test_an_alist_left_unfinished_holds_no_connection(db: Database, store: Store) -> None:
    saver = await _saver(db)
    for n in range(1, 121):
        await _put(saver, "t", n, size=10)
    with loop_errors() as errors:
        listing = saver.alist(_config("t"))  # type: ignore[arg-type]
        first = await listing.__anext__()
        assert first.checkpoint["id"] == f"{120:08}"
        assert db.engine.pool.checkedout() == 0  # suspended between pages: no unit of work open
        await assert_clean(db, store)
        del listing  # dropped, never closed
        await settle()
    assert errors == []
    await _put(saver, "t", 121, size=10)


async def beside_threads(
    threads: int, in_thread: Callable[[int], Awaitable[Any]], on_main_loop: Callable[[int], Awaitable[Any]]
) -> int:
    """Run `in_thread(index)` under `asyncio.run` in each of `threads` worker threads, while the
    main loop runs `on_main_loop(n)` for n = 1, 2, … until they are done; how many main-loop calls.

    Nothing may fail, hang, or reach any loop's exception handler.
    """
    failures: list[BaseException] = []
    thread_errors: list[dict[str, Any]] = []

    def thread(index: int) -> None:
        async def work() -> None:
            # What reaches this loop's exception handler is recorded, as loop_errors does on the main loop.
            asyncio.get_running_loop().set_exception_handler(
                lambda _loop, context: thread_errors.append(context)
            )
            await in_thread(index)
            await settle()

        try:
            asyncio.run(work())
        except BaseException as error:  # reported on the main loop
            failures.append(error)

    calls = 0
    done = False

    async def main_loop() -> None:
        nonlocal calls
        while not done:
            calls += 1
            await on_main_loop(calls)

    def run_threads() -> None:
        started = [threading.Thread(target=thread, args=(i,), daemon=True) for i in range(threads)]
        for each in started:
            each.start()
        for each in started:
            each.join(120)
        assert not any(each.is_alive() for each in started), "a thread hung"

    with loop_errors() as errors:
        async with anyio.create_task_group() as tg:
            tg.start_soon(main_loop)
            await anyio.to_thread.run_sync(run_threads)
            done = True
        await settle()
    assert failures == []
    assert errors == []
    assert thread_errors == []
    return calls


SYNC_THREADS = 3
SYNC_RUNS = 15


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
async def test_sync_put_and_get_tuple_from_threads_running_asyncio_run_beside_the_main_loop(
    db: Database, store: Store
) -> None:
    """Each worker thread runs `asyncio.run`; inside it, sync `put`/`get_tuple` and cancelled `aput`s.

    The sync calls block the thread's loop, so they go through a saver made with `allow_blocking`
    (without it they refuse: `test_compat_langgraph_saver`).
    """
    saver = await _saver(db)
    blocking = MemormSaver(db, agent=saver.agent_id, allow_blocking=True)
    timed_out = [0] * SYNC_THREADS

    async def in_thread(index: int) -> None:
        for n in range(1, SYNC_RUNS + 1):
            checkpoint, metadata, versions = _checkpoint(n)
            stored = blocking.put(_config(f"sync-{index}"), checkpoint, metadata, versions)  # type: ignore[arg-type]
            found = blocking.get_tuple(stored)
            assert found is not None
            assert found.checkpoint["channel_values"] == _values(n, 2_000)
            # This loop's own cancelled writes, amid the main loop's and the sync loop's.
            try:
                await asyncio.wait_for(_put(saver, f"cancelled-{index}", n), 0.0005 * (n % 6))
            except asyncio.TimeoutError:
                timed_out[index] += 1

    async def main_loop_put(n: int) -> None:
        await _put(saver, "main", n)
        found = await saver.aget_tuple(_config("main"))  # type: ignore[arg-type]
        assert found is not None
        assert found.checkpoint["id"] == f"{n:08}"

    main_puts = await beside_threads(SYNC_THREADS, in_thread, main_loop_put)
    assert sum(timed_out) > 0  # the threads' own cancellations did land
    assert main_puts > 0
    assert db.engine.pool.checkedout() == 0
    await assert_clean(db, store)
    for index in range(SYNC_THREADS):
        listed = [item.checkpoint["id"] async for item in saver.alist(_config(f"sync-{index}"))]  # type: ignore[arg-type]
        assert listed == [f"{n:08}" for n in range(SYNC_RUNS, 0, -1)]
    # The cancelled writes of the threads' loops: whole checkpoints or none.
    checkpoints = await _rows(
        db,
        "SELECT c.session_id, c.checkpoint_id FROM graph_checkpoints c "
        "JOIN sessions s ON s.id = c.session_id WHERE s.key LIKE 'cancelled-%'",
    )
    blobs = await _rows(
        db,
        "SELECT b.session_id, b.channel, b.version FROM graph_blobs b "
        "JOIN sessions s ON s.id = b.session_id WHERE s.key LIKE 'cancelled-%'",
    )
    assert sorted(map(str, blobs)) == sorted(
        str((session, channel, _version(int(checkpoint))))
        for session, checkpoint in checkpoints
        for channel in CHANNELS
    )
    # The sync loop's pool, then the main loop's: both let go of everything.
    await adispose_sync(db)
    await assert_clean(db, store)
