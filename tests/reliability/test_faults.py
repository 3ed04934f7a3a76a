"""Faults injected under memorm: killed backends, timeouts, lock waits, SIGKILL, cancellation.

Each test breaks something below memorm on purpose and pins what memorm
promises about it: the unit of work that met the fault fails with a
``MemormError`` (never hangs), commits nothing, and the ``Database`` carries
on without a restart.
"""

from __future__ import annotations

import signal
import sqlite3
import sys
import time
import uuid

import anyio
import asyncpg
import pytest
import sqlalchemy as sa
from conftest import ENGINES, Store, asyncpg_dsn, count_rows

from memorm import Database
from memorm.errors import DatabaseError, MemormError
from memorm.translate import guarded

pytestmark = [pytest.mark.anyio, pytest.mark.reliability, pytest.mark.long]

SQLITE = pytest.mark.parametrize("engine", [ENGINES[0]], indirect=True)
POSTGRES = pytest.mark.parametrize("engine", [ENGINES[1]], indirect=True)
APP = "memorm-fault-test"
POOL_SIZE = 3


class Boom(Exception):
    """The user's own error, raised inside a unit of work."""


def _database(store: Store, **settings: str) -> Database:
    """Another ``Database`` on the Postgres store, tagged ``APP`` and with extra server settings."""
    server_settings = {
        **store.options["connect_args"]["server_settings"],
        "application_name": APP,
        **settings,
    }
    return store.database(
        pool_size=POOL_SIZE, max_overflow=0, connect_args={"server_settings": server_settings}
    )


async def _admin(store: Store) -> asyncpg.Connection:
    """A raw asyncpg connection outside memorm, on the test's schema."""
    return await asyncpg.connect(asyncpg_dsn(), server_settings={"search_path": f"{store.schema},public"})


async def _chat(db: Database) -> uuid.UUID:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create(f"agent-{uuid.uuid4().hex[:8]}")
        return (await uow.sessions.create(agent.id)).id


async def _backends(admin: asyncpg.Connection, *, state: str | None = None) -> int:
    sql = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1"
    if state is None:
        return int(await admin.fetchval(sql, APP))
    return int(await admin.fetchval(sql + " AND state = $2", APP, state))


# -- 1. Postgres: the backends serving the pool are terminated -------------------


@POSTGRES
async def test_terminated_backends_fail_units_in_flight_and_the_pool_recovers(
    db: Database, store: Store
) -> None:
    chat, other = await _chat(db), await _chat(db)  # two chats: an append locks its session's row
    faulty = _database(store)
    admin = await _admin(store)
    try:
        # Fill the pool: POOL_SIZE connections, each opened and returned.
        async def warm() -> None:
            async with faulty.unit_of_work(read_only=True) as uow:
                await uow.session.execute(sa.text("SELECT pg_sleep(0.05)"))

        async with anyio.create_task_group() as tg:
            for _ in range(POOL_SIZE):
                tg.start_soon(warm)
        assert faulty.engine.pool.checkedin() == POOL_SIZE

        errors: list[BaseException] = []
        idle_wrote = anyio.Event()
        killed = anyio.Event()

        async def mid_statement() -> None:
            # Wrote a message, then is killed while a statement runs.
            try:
                async with faulty.unit_of_work() as uow:
                    await uow.messages.append(chat, {"role": "user", "content": "lost mid-statement"})
                    async with guarded(uow.link):
                        await uow.session.execute(sa.text("SELECT pg_sleep(30)"))
            except BaseException as error:
                errors.append(error)

        async def idle_in_transaction() -> None:
            # Wrote a message, is killed while idle in its transaction, then writes again.
            try:
                async with faulty.unit_of_work() as uow:
                    await uow.messages.append(other, {"role": "user", "content": "lost while idle"})
                    idle_wrote.set()
                    await killed.wait()
                    await uow.messages.append(other, {"role": "user", "content": "after the kill"})
            except BaseException as error:
                errors.append(error)

        started = time.monotonic()
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(mid_statement)
                tg.start_soon(idle_in_transaction)
                await idle_wrote.wait()
                while await _backends(admin, state="active") < 1:  # noqa: ASYNC110 (polls the server)
                    await anyio.sleep(0.01)
                terminated = await admin.fetch(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database()"
                    " AND pid <> pg_backend_pid() AND application_name = $1",
                    APP,
                )
                killed.set()
        elapsed = time.monotonic() - started

        # Two busy connections and the one idle in the pool.
        assert len(terminated) == POOL_SIZE
        assert all(row[0] for row in terminated)
        assert len(errors) == 2, errors
        assert all(isinstance(error, MemormError) for error in errors), errors
        assert elapsed < 5
        assert await count_rows(db, "messages") == 0
        async with db.unit_of_work(read_only=True) as uow:
            assert (await uow.sessions.get(chat)).next_seq == 1
            assert (await uow.sessions.get(other)).next_seq == 1

        # The same Database carries on.  No pre-ping: a unit of work may still
        # draw a dead connection, but at most one per pooled connection.
        failures, successes = 0, 0
        with anyio.fail_after(10):
            while successes < 5:
                try:
                    async with faulty.unit_of_work() as uow:
                        await uow.messages.append(chat, {"role": "user", "content": f"after {successes}"})
                    successes += 1
                except MemormError:
                    failures += 1
                    assert failures <= POOL_SIZE
        assert faulty.engine.pool.checkedout() == 0
        assert await count_rows(db, "messages") == successes
        print(
            f"kill: {len(terminated)} backends terminated, 2 units failed in {elapsed:.2f}s, "
            f"{failures} failed units after"
        )
    finally:
        await admin.close()
        await faulty.dispose()


# -- 2. Postgres: statement timeout and lock timeout -----------------------------


@POSTGRES
async def test_statement_timeout_fails_a_slow_statement_promptly(db: Database, store: Store) -> None:
    chat = await _chat(db)
    admin = await _admin(store)
    # A trigger slows down memorm's own insert, so the repository call itself times out.
    await admin.execute(
        "CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN PERFORM pg_sleep(1); RETURN NEW; END $$;"
        "CREATE TRIGGER slow BEFORE INSERT ON messages FOR EACH ROW EXECUTE FUNCTION slow()"
    )
    await admin.close()
    faulty = _database(store, statement_timeout="200")
    try:
        started = time.monotonic()
        with anyio.fail_after(5), pytest.raises(DatabaseError, match="statement timeout"):
            async with faulty.unit_of_work() as uow:
                await uow.messages.append(chat, {"role": "user", "content": "too slow"})
        assert time.monotonic() - started < 0.9

        # A slow statement of the caller's own, run under guarded().
        async def own_statement() -> None:
            async with faulty.unit_of_work() as uow, guarded(uow.link):
                await uow.session.execute(sa.text("SELECT pg_sleep(1)"))

        started = time.monotonic()
        with anyio.fail_after(5), pytest.raises(DatabaseError, match="statement timeout"):
            await own_statement()
        assert time.monotonic() - started < 0.9

        assert faulty.engine.pool.checkedout() == 0
        assert await count_rows(db, "messages") == 0
        async with db.unit_of_work(read_only=True) as uow:
            assert (await uow.sessions.get(chat)).next_seq == 1
        # The connection that timed out is still good.
        async with faulty.unit_of_work(read_only=True) as uow:
            assert (await uow.sessions.get(chat)).next_seq == 1
    finally:
        await faulty.dispose()


@POSTGRES
async def test_lock_timeout_fails_an_update_of_a_locked_agent_promptly(db: Database, store: Store) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("locked", system="before")
    admin = await _admin(store)
    faulty = _database(store, lock_timeout="200")
    try:
        transaction = admin.transaction()
        await transaction.start()
        await admin.execute("SELECT 1 FROM agents WHERE id = $1 FOR UPDATE", agent.id)
        started = time.monotonic()
        with anyio.fail_after(5), pytest.raises(DatabaseError, match="lock timeout") as raised:
            async with faulty.unit_of_work() as uow:
                await uow.agents.update(agent.id, system="after")
        assert time.monotonic() - started < 1.5
        assert isinstance(raised.value.__cause__, sa.exc.DBAPIError)
        await transaction.rollback()

        assert faulty.engine.pool.checkedout() == 0
        async with faulty.unit_of_work() as uow:
            kept = await uow.agents.get(agent.id)
            assert (kept.system, kept.version) == ("before", 1)
    finally:
        await admin.close()
        await faulty.dispose()


# -- 3. SQLite: a writer process is SIGKILLed ------------------------------------

WRITER = """
import asyncio, sys
from memorm import Database

async def main(url, chat):
    async with Database(url) as db:
        while True:
            async with db.unit_of_work() as uow:
                [message] = await uow.messages.append(chat, {"role": "user", "content": "x" * 200})
            print(message.seq, flush=True)  # acknowledged: its unit of work has committed

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""

ACKNOWLEDGED = 300


@SQLITE
async def test_sigkilled_writer_loses_no_acknowledged_write(db: Database, store: Store) -> None:
    chat = await _chat(db)
    output = b""
    started = time.monotonic()
    process = await anyio.open_process([sys.executable, "-c", WRITER, store.url, str(chat)])
    try:
        assert process.stdout is not None
        with anyio.fail_after(60):
            while output.count(b"\n") < ACKNOWLEDGED:
                try:
                    output += await process.stdout.receive()
                except anyio.EndOfStream:
                    assert process.stderr is not None
                    pytest.fail(f"the writer died: {(await process.stderr.receive()).decode()}")
        process.send_signal(signal.SIGKILL)
        with anyio.fail_after(10):
            await process.wait()
            # Whatever was printed before the kill was acknowledged too.
            try:
                while True:
                    output += await process.stdout.receive()
            except anyio.EndOfStream:
                pass
    finally:
        if process.returncode is None:
            process.kill()
        await process.aclose()
    assert process.returncode == -signal.SIGKILL
    acknowledged = [int(line) for line in output.decode().splitlines() if line.strip()]
    assert acknowledged == list(range(1, len(acknowledged) + 1))
    await db.dispose()

    path = store.url.removeprefix("sqlite+aiosqlite:///")
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    reopened = store.database()
    try:
        async with reopened.unit_of_work(read_only=True) as uow:
            stored = list(
                (await uow.session.execute(sa.text("SELECT seq FROM messages ORDER BY seq"))).scalars()
            )
        assert set(acknowledged) <= set(stored)
        assert stored == list(range(1, len(stored) + 1))  # at most the one unacknowledged commit more
        assert len(stored) - len(acknowledged) <= 1
        async with reopened.unit_of_work() as uow:
            [message] = await uow.messages.append(chat, {"role": "user", "content": "after"})
        assert message.seq == len(stored) + 1
    finally:
        await reopened.dispose()
    print(
        f"sigkill: {len(acknowledged)} acknowledged, {len(stored)} stored, {time.monotonic() - started:.2f}s"
    )


APPEND_ONLY = """
import asyncio, sys
from memorm import Database

async def main(url, chat):
    async with Database(url) as db:
        async with db.unit_of_work() as uow:
            [message] = await uow.messages.append(chat, {"role": "user", "content": "first"})
            print(message.seq)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@SQLITE
async def test_append_is_usable_as_a_processs_first_orm_call(db: Database, store: Store) -> None:
    chat = await _chat(db)
    result = await anyio.run_process([sys.executable, "-c", APPEND_ONLY, store.url, str(chat)], check=False)
    assert result.returncode == 0, result.stderr.decode()[-500:]
    assert result.stdout.decode().split() == ["1"]


# -- 4. Both engines: cancellation and user errors inside a unit of work ---------


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
async def test_task_cancelled_between_writes_rolls_back_and_returns_its_connection(db: Database) -> None:
    chat = await _chat(db)
    wrote = anyio.Event()
    finished = False

    async def writer() -> None:
        nonlocal finished
        async with db.unit_of_work() as uow:
            await uow.messages.append(chat, {"role": "user", "content": "lost"})
            wrote.set()
            await anyio.sleep_forever()
        finished = True

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(writer)
            await wrote.wait()
            assert db.engine.pool.checkedout() == 1
            tg.cancel_scope.cancel()
    assert not finished
    assert db.engine.pool.checkedout() == 0
    assert await count_rows(db, "messages") == 0
    async with db.unit_of_work() as uow:
        [message] = await uow.messages.append(chat, {"role": "user", "content": "kept"})
    assert message.seq == 1


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
async def test_task_cancelled_amid_statements_rolls_back_every_time(db: Database) -> None:
    chat = await _chat(db)
    cancelled = 0
    # Deadlines that land inside a statement as well as between them.
    for attempt in range(20):
        with anyio.fail_after(10), anyio.move_on_after(0.002 + attempt * 0.001) as scope:
            async with db.unit_of_work() as uow:
                while True:
                    await uow.messages.append(chat, {"role": "user", "content": "lost"})
        cancelled += scope.cancelled_caught
        assert db.engine.pool.checkedout() == 0
    assert cancelled == 20
    assert await count_rows(db, "messages") == 0
    async with db.unit_of_work() as uow:
        [message] = await uow.messages.append(chat, {"role": "user", "content": "kept"})
        assert (await uow.sessions.get(chat)).next_seq == 2
    assert message.seq == 1


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
async def test_user_error_between_two_repository_calls_leaves_neither_write(db: Database) -> None:
    chat = await _chat(db)
    async with db.unit_of_work(read_only=True) as uow:
        agent_id = (await uow.sessions.get(chat)).agent_id

    async def fails_after_one_write() -> None:
        async with db.unit_of_work() as uow:
            await uow.messages.append(chat, {"role": "user", "content": "first"})
            raise Boom

    async def fails_between_two_writes() -> None:
        async with db.unit_of_work() as uow:
            await uow.agents.update(agent_id, system="changed")
            raise Boom
            await uow.messages.append(chat, {"role": "user", "content": "second"})  # never reached

    with pytest.raises(Boom):
        await fails_after_one_write()
    with pytest.raises(Boom):
        await fails_between_two_writes()
    assert db.engine.pool.checkedout() == 0
    assert await count_rows(db, "messages") == 0
    async with db.unit_of_work(read_only=True) as uow:
        agent = await uow.agents.get(agent_id)
        assert (agent.system, agent.version) == ("", 1)
        assert (await uow.sessions.get(chat)).next_seq == 1
