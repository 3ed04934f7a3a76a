"""One ``Database`` from any event loop and any thread.

FastAPI's ``def`` endpoints and the Agents SDK's ``Runner.run_sync`` run
``asyncio.run`` in worker threads; a server's own loop keeps running beside
them.  Every loop gets its own pool, SQLite writers of every loop queue on one
lock, and a loop's pool closes when the loop shuts down.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import uuid
import warnings
from collections.abc import Callable

import anyio
import anyio.to_thread
import pytest
from conftest import ENGINES, Store
from probes import aiosqlite_threads, postgres_backends, tagged_database

from memorm import Database
from memorm.errors import ValidationError

pytestmark = [pytest.mark.anyio, pytest.mark.reliability]

THREADS = 4
RUNS = 5  # asyncio.run calls per thread, each a new event loop
APPENDS = 10  # per run


async def _run_threads(target: Callable[[int], None], count: int, limit: float = 60) -> None:
    """Run ``target(i)`` in ``count`` threads; fail, not hang, if one outlives ``limit`` s."""
    errors: list[BaseException] = []

    def guarded(index: int) -> None:
        try:
            target(index)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=guarded, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()

    def join() -> bool:
        for thread in threads:
            thread.join(limit)
        return not any(thread.is_alive() for thread in threads)

    assert await anyio.to_thread.run_sync(join), "a thread hung"
    assert errors == [], errors


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
async def test_threads_running_asyncio_run_share_one_database_with_the_main_loop(
    store: Store, engine: str
) -> None:
    application, db = await tagged_database(store)
    try:
        async with db.unit_of_work() as uow:
            agent = await uow.agents.create("shared")
            shared = (await uow.sessions.create(agent.id, title="everyone")).id
            own = [(await uow.sessions.create(agent.id, title=f"thread {i}")).id for i in range(THREADS)]
        threads_before = aiosqlite_threads()

        async def worker(index: int, run: int) -> None:
            for n in range(APPENDS):
                async with db.unit_of_work() as uow:
                    await uow.messages.append(shared, {"role": "user", "content": f"t{index} r{run} n{n}"})
                    await uow.messages.append(own[index], {"role": "user", "content": f"r{run} n{n}"})
                async with db.unit_of_work(read_only=True) as uow:
                    assert (await uow.messages.window(own[index], limit=1))[0].content == f"r{run} n{n}"

        def thread(index: int) -> None:
            for run in range(RUNS):
                asyncio.run(worker(index, run))  # a new event loop each time

        main_appends = 0
        done = False

        async def main_loop_appends() -> None:
            nonlocal main_appends
            while not done:
                async with db.unit_of_work() as uow:
                    await uow.messages.append(
                        shared, {"role": "assistant", "content": f"main {main_appends}"}
                    )
                main_appends += 1
                await anyio.sleep(0.001)

        async with anyio.create_task_group() as tg:
            tg.start_soon(main_loop_appends)
            await _run_threads(thread, THREADS)
            done = True

        async with db.unit_of_work(read_only=True) as uow:
            everyone = await uow.messages.window(shared, limit=1000)
            per_thread = [await uow.messages.window(chat, limit=1000) for chat in own]
        assert main_appends > 0
        assert len(everyone) == THREADS * RUNS * APPENDS + main_appends
        assert [m.seq for m in everyone] == list(range(1, len(everyone) + 1))
        for index, messages in enumerate(per_thread):
            assert [m.content for m in messages] == [
                f"r{r} n{n}" for r in range(RUNS) for n in range(APPENDS)
            ]
            written = [m.content for m in everyone if m.content.startswith(f"t{index} ")]
            assert written == [f"t{index} r{r} n{n}" for r in range(RUNS) for n in range(APPENDS)]

        # Each thread's loop closed its pool as it shut down: only the main loop's remain.
        assert db.engine.pool.checkedout() == 0
        if engine == "sqlite":
            assert aiosqlite_threads() <= threads_before + db.engine.pool.checkedin()
        else:
            assert await postgres_backends(application) == db.engine.pool.checkedin()
    finally:
        await db.dispose()
    if engine == "postgres":
        assert await postgres_backends(application) == 0


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
async def test_a_writer_on_another_loop_waits_for_the_main_loop_and_is_woken(db: Database) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("a")
        chat = (await uow.sessions.create(agent.id)).id
    wrote = threading.Event()

    async def append() -> None:
        async with db.unit_of_work() as uow:
            await uow.messages.append(chat, {"role": "user", "content": "from the thread"})
        wrote.set()

    async with db.unit_of_work() as uow:
        await uow.messages.append(chat, {"role": "user", "content": "from the main loop"})
        thread = threading.Thread(target=asyncio.run, args=(append(),), daemon=True)
        thread.start()
        # The thread's write waits: for the in-process write lock (SQLite) or the session row (Postgres).
        assert not await anyio.to_thread.run_sync(wrote.wait, 0.3)
    assert await anyio.to_thread.run_sync(wrote.wait, 10), "the other loop's writer was never woken"
    await anyio.to_thread.run_sync(thread.join, 10)
    async with db.unit_of_work(read_only=True) as uow:
        contents = [m.content for m in await uow.messages.window(chat)]
    assert contents == ["from the main loop", "from the thread"]


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
async def test_a_database_made_outside_any_loop_serves_successive_loops(store: Store) -> None:
    db = store.database()

    async def setup() -> uuid.UUID:
        await db.create_all()
        async with db.unit_of_work() as uow:
            agent = await uow.agents.create("sync")
            return (await uow.sessions.create(agent.id)).id

    async def append(text: str) -> int:
        async with db.unit_of_work() as uow:
            [message] = await uow.messages.append(chat, {"role": "user", "content": text})
        return message.seq

    def sync_program() -> list[int]:
        # A plain sync program: every call a new loop, each loop's pool gone when it ends.
        return [asyncio.run(append(f"sync {n}")) for n in range(3)]

    chat = await anyio.to_thread.run_sync(lambda: asyncio.run(setup()))
    try:
        assert await anyio.to_thread.run_sync(sync_program) == [1, 2, 3]
        assert await append("async") == 4  # and the test's own loop uses it too
    finally:
        await db.dispose()


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
async def test_dispose_closes_the_pool_of_a_loop_running_in_another_thread(store: Store, engine: str) -> None:
    application, db = await tagged_database(store)
    other = asyncio.new_event_loop()
    runner = threading.Thread(target=other.run_forever, daemon=True)
    runner.start()
    try:

        async def read() -> int:
            async with db.unit_of_work(read_only=True) as uow:
                return (await uow.agents.list()).total

        assert asyncio.run_coroutine_threadsafe(read(), other).result(10) == 0
        threads_before = aiosqlite_threads()
        await db.dispose()
        if engine == "postgres":
            assert await postgres_backends(application) == 0
        else:
            for _ in range(100):  # the other loop's aiosqlite thread ends once its connection closes
                if aiosqlite_threads() < threads_before:
                    break
                await anyio.sleep(0.01)
            assert aiosqlite_threads() < threads_before
        # Still usable from that loop afterwards: it opens a new pool.
        assert asyncio.run_coroutine_threadsafe(read(), other).result(10) == 0
    finally:
        await db.dispose()
        other.call_soon_threadsafe(other.stop)
        runner.join(10)
        other.close()


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
async def test_dispose_closes_the_pool_of_a_closed_loop_without_leaving_a_socket_to_the_collector(
    store: Store, engine: str
) -> None:
    """A loop closed without `shutdown_asyncgens` (the Agents SDK's tests do so) leaves its pool to us."""
    application, db = await tagged_database(store)

    def dead_loop() -> None:
        loop = asyncio.new_event_loop()

        async def read() -> int:
            async with db.unit_of_work(read_only=True) as uow:
                return (await uow.agents.list()).total

        assert loop.run_until_complete(read()) == 0
        loop.close()

    try:
        await anyio.to_thread.run_sync(dead_loop)
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            await db.dispose()
            gc.collect()  # an unclosed socket warns as it is collected
        assert [str(w.message) for w in warned] == []
        if engine == "postgres":
            assert await postgres_backends(application) == 0
    finally:
        await db.dispose()


async def test_an_in_memory_sqlite_database_refuses_a_second_loop() -> None:
    db = Database("sqlite+aiosqlite:///:memory:")
    try:
        assert db.engine is db.engine  # this loop adopts the engine

        async def other_loop() -> None:
            async with db.unit_of_work(read_only=True):
                pass

        with pytest.raises(ValidationError, match="in-memory SQLite"):
            await anyio.to_thread.run_sync(lambda: asyncio.run(other_loop()))
    finally:
        await db.dispose()
