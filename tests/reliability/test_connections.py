"""Connections as production has them: killed while idle or in use, fewer than the tasks that want them.

The unit of work drops a connection that died (at check-out, or under its
first trip to the server, which it then makes again on a fresh one), never
returns a dead one to the pool, serves waiting tasks in arrival order with a
bounded wait, and hands a connection back without what a caller's own
statements left on it.  The long test at the end kills every backend over
and over under load: nothing raw escapes, nothing is logged, every session
keeps getting turns.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import subprocess
import time
import uuid
import warnings
from collections.abc import AsyncIterator
from typing import Any

import anyio
import asyncpg
import pytest
import sqlalchemy as sa
from conftest import ENGINES, Store, asyncpg_dsn, count_rows

from memorm import Database, Message
from memorm.errors import DatabaseError, MemormError, PoolTimeoutError
from memorm.testing import capture_statements

pytestmark = [pytest.mark.anyio, pytest.mark.reliability]

POSTGRES = pytest.mark.parametrize("engine", [ENGINES[1]], indirect=True)


def _sibling(db: Database, store: Store, application: str, **options: Any) -> Database:
    """Another `Database` on `db`'s URL (its role) and store, with its own pool; on Postgres its
    backends carry the name `application`."""
    if store.engine == "postgres":
        settings = {**store.options["connect_args"]["server_settings"], "application_name": application}
        options["connect_args"] = {"server_settings": settings}
    return Database(db.url, **{**store.options, **options})


@pytest.fixture
async def small(db: Database, store: Store) -> AsyncIterator[tuple[Database, str]]:
    """`(database, application)`: a pool of 2 on the test's schema, its backends named."""
    application = f"memorm-conn-{uuid.uuid4().hex[:8]}"
    database = _sibling(db, store, application, pool_size=2, max_overflow=0, pool_timeout=5)
    try:
        yield database, application
    finally:
        await database.dispose()


async def _chat(db: Database) -> uuid.UUID:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create(f"agent-{uuid.uuid4().hex[:8]}")
        return (await uow.sessions.create(agent.id)).id


async def _turn(db: Database, chat: uuid.UUID, content: str = "hi") -> None:
    async with db.unit_of_work() as uow:
        await uow.messages.append(chat, [Message(role="user", content=content)])
    async with db.unit_of_work(read_only=True) as uow:
        await uow.messages.window(chat, limit=20)


async def _kill(application: str, *, settle: bool = True) -> int:
    """Terminate every backend named `application`; with `settle`, wait until the server let them go."""
    admin = await asyncpg.connect(asyncpg_dsn())
    try:
        sql = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1"
        killed = len(await admin.fetch(sql, application))
        if not settle:  # under load: new ones open as fast as they die
            return killed
        count = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1"
        with anyio.fail_after(10):
            while await admin.fetchval(count, application):  # noqa: ASYNC110 (the server's state: polled)
                await anyio.sleep(0.02)
        return killed
    finally:
        await admin.close()


def _kill_blocking(application: str) -> None:
    """`_kill`, without letting the event loop run: the client cannot have seen the connection close."""
    sql = f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{application}'"
    subprocess.run(["psql", "-X", "-q", asyncpg_dsn(), "-c", sql], check=True, capture_output=True)
    time.sleep(0.3)  # the backend exits and its socket closes; this loop sees nothing of it yet


async def _warm(db: Database, chat: uuid.UUID, connections: int) -> None:
    """Open `connections` pooled connections (units of work held open together), and return them."""
    opened = anyio.Event()
    entered = 0

    async def hold() -> None:
        nonlocal entered
        async with db.unit_of_work(read_only=True) as uow:
            await uow.messages.window(chat, limit=1)
            entered += 1
            if entered == connections:
                opened.set()
            await opened.wait()

    async with anyio.create_task_group() as group:
        for _ in range(connections):
            group.start_soon(hold)


# -- connections that die -------------------------------------------------------


@POSTGRES
@pytest.mark.direct  # behind a pooler the pooler, not the client, sees its server connections die
async def test_pooled_connections_killed_while_idle_cost_no_unit_of_work(
    small: tuple[Database, str],
) -> None:
    db, application = small
    chat = await _chat(db)
    await _warm(db, chat, 2)
    assert await _kill(application) == 2  # what a restart, a failover or an idle reaper does
    await anyio.sleep(0.05)
    with capture_statements(db, "BEGIN") as begun:
        for turn in range(12):
            await _turn(db, chat, f"after {turn}")  # every one succeeds: no dead connection is handed out
    # Seen closed as they were taken, they were dropped before any trip: no BEGIN failed and was resent.
    assert len(begun) == (12 if db.bypasses_rls else 24)  # under row-level security reads begin too
    assert await count_rows(db, "messages", session_id=chat) == 12


@POSTGRES
@pytest.mark.single_node
@pytest.mark.direct
@pytest.mark.parametrize("read_only", [False, True], ids=["writer", "reader"])
async def test_a_connection_that_dies_under_the_first_trip_is_replaced_and_the_trip_made_again(
    small: tuple[Database, str], read_only: bool
) -> None:
    """Killed so recently that the client has not seen it: the `BEGIN` (a writer's, or under
    row-level security a reader's too) or a read-only unit's first read meets the dead connection."""
    db, application = small
    chat = await _chat(db)
    await _warm(db, chat, 1)
    _kill_blocking(application)
    async with db.unit_of_work(read_only=read_only) as uow:
        if read_only:
            assert len(await uow.messages.window(chat, limit=5)) == 0
        else:
            await uow.messages.append(chat, [Message(role="user", content="once")])
    assert await count_rows(db, "messages", session_id=chat) == (0 if read_only else 1)


@POSTGRES
@pytest.mark.direct
async def test_a_connection_lost_amid_a_unit_of_work_fails_it_at_once_and_nothing_of_it_stays(
    small: tuple[Database, str],
) -> None:
    db, application = small
    chat = await _chat(db)

    async def cut_off() -> None:
        async with db.unit_of_work() as uow:
            await uow.messages.append(chat, [Message(role="user", content="lost")])
            await _kill(application)
            with anyio.fail_after(2):
                await uow.messages.append(chat, [Message(role="user", content="lost too")])

    with pytest.raises(DatabaseError, match="connection to the database was lost"):
        await cut_off()
    assert await count_rows(db, "messages", session_id=chat) == 0
    await _turn(db, chat)  # the pool carries on with a new connection
    assert await count_rows(db, "messages", session_id=chat) == 1


# -- more tasks than connections ---------------------------------------------------


async def test_units_of_work_get_the_pool_in_arrival_order(db: Database, store: Store) -> None:
    """A task that returns its connection and asks again at once goes behind those waiting."""
    one = _sibling(db, store, f"memorm-order-{uuid.uuid4().hex[:8]}", pool_size=1, max_overflow=0)
    chat = await _chat(one)
    admitted: list[str] = []
    release, holding = anyio.Event(), anyio.Event()

    async def unit(name: str) -> None:
        async with one.unit_of_work(read_only=True) as uow:
            admitted.append(name)
            await uow.messages.window(chat, limit=1)
            if name == "holder":
                holding.set()
                await release.wait()

    async def holder() -> None:
        await unit("holder")
        await unit("holder again")  # at once: a pool without a queue of its own lets it barge in

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(holder)
            await holding.wait()
            for index in range(6):
                group.start_soon(unit, f"waiter {index}")
                await anyio.sleep(0.02)  # each is in line before the next arrives
            release.set()
        assert admitted == ["holder", *(f"waiter {index}" for index in range(6)), "holder again"]
    finally:
        await one.dispose()


async def test_a_wait_longer_than_pool_timeout_raises_pool_timeout_error_and_the_line_moves_on(
    db: Database, store: Store
) -> None:
    one = _sibling(
        db, store, f"memorm-wait-{uuid.uuid4().hex[:8]}", pool_size=1, max_overflow=0, pool_timeout=0.3
    )
    chat = await _chat(one)
    release = anyio.Event()
    entered = anyio.Event()

    async def holder() -> None:
        async with one.unit_of_work() as uow:
            entered.set()
            await release.wait()
            await uow.messages.append(chat, [Message(role="user", content="held")])

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(holder)
            await entered.wait()
            # A waiter cancelled meanwhile leaves the line and takes no place with it.
            with anyio.move_on_after(0.05):
                async with one.unit_of_work():
                    pass
            started = time.monotonic()
            with pytest.raises(PoolTimeoutError, match="pool_timeout") as caught:
                async with one.unit_of_work():
                    pass
            waited = time.monotonic() - started
            assert isinstance(caught.value, DatabaseError)  # a server sheds load on it (503)
            assert 0.25 <= waited < 2
            release.set()
        for _ in range(3):  # no place was lost: one connection serves on, one unit after another
            with anyio.fail_after(2):
                await _turn(one, chat)
        assert await count_rows(one, "messages", session_id=chat) == 4
    finally:
        await one.dispose()


async def test_sessions_outnumbering_connections_each_get_their_turns(db: Database, store: Store) -> None:
    """32 sessions on 2 connections: Jain's fairness index over their turns, and nobody starved."""
    two = _sibling(db, store, f"memorm-fair-{uuid.uuid4().hex[:8]}", pool_size=2, max_overflow=0)
    sessions = 32
    turns = collections.Counter[int]()
    try:
        async with two.unit_of_work() as uow:
            agent = await uow.agents.create("fair")
            chats = [(await uow.sessions.create(agent.id)).id for _ in range(sessions)]

        async def session(index: int) -> None:
            while sum(turns.values()) < sessions * 8:
                await _turn(two, chats[index])
                turns[index] += 1

        async with anyio.create_task_group() as group:
            for index in range(sessions):
                group.start_soon(session, index)
        counts = [turns[index] for index in range(sessions)]
        mean = sum(counts) / sessions
        jain = sum(counts) ** 2 / (sessions * sum(count * count for count in counts))
        assert jain >= 0.95, counts
        assert min(counts) >= mean / 2, counts
    finally:
        await two.dispose()


# -- connections go back clean --------------------------------------------------------


async def test_what_a_callers_own_statements_leave_on_a_connection_never_reaches_the_next_unit(
    db: Database, store: Store
) -> None:
    """Temporary tables and settings made through `uow.session` are gone before the connection
    serves the next unit of work, another tenant's (one pooled connection: the same one)."""
    one = _sibling(db, store, f"memorm-clean-{uuid.uuid4().hex[:8]}", pool_size=1, max_overflow=0)
    postgres = store.engine == "postgres"
    try:
        if postgres:
            async with one.unit_of_work("acme", read_only=True) as uow:
                path_before = await uow.session.scalar(sa.text("SHOW search_path"))
        async with one.unit_of_work("acme") as uow:
            await uow.session.execute(sa.text("CREATE TEMP TABLE scratch (secret text)"))
            await uow.session.execute(sa.text("INSERT INTO scratch VALUES ('acme''s')"))
            if postgres:
                await uow.session.execute(sa.text("SET search_path = pg_temp"))
                await uow.session.execute(sa.text("SET statement_timeout = 1"))
            else:
                await uow.session.execute(sa.text("PRAGMA foreign_keys = OFF"))
        async with one.unit_of_work("globex", read_only=True) as uow:
            if postgres:
                left = await uow.session.scalar(sa.text("SELECT to_regclass('pg_temp.scratch') IS NOT NULL"))
                path = await uow.session.scalar(sa.text("SHOW search_path"))
                timeout = await uow.session.scalar(sa.text("SHOW statement_timeout"))
                assert (left, timeout) == (False, "0")
                assert path == path_before
                # memorm's own settings came back with the reset (none behind a transaction pooler)
                scan = await uow.session.scalar(
                    sa.text("SELECT current_setting('hnsw.iterative_scan', true)")
                )
                assert scan in ((None, "off") if one.transaction_pooling else ("strict_order",))
            else:
                left = await uow.session.scalar(sa.text("SELECT count(*) FROM temp.sqlite_master"))
                assert left == 0
                assert await uow.session.scalar(sa.text("PRAGMA foreign_keys")) == 1
    finally:
        await one.dispose()


async def test_the_chat_path_sends_no_reset(db: Database) -> None:
    """Only a unit of work whose caller ran statements of their own pays for the reset."""
    chat = await _chat(db)
    with capture_statements(db) as sent:
        await _turn(db, chat)
        async with db.unit_of_work(read_only=True) as uow:
            await uow.messages.context(chat, max_tokens=100)
    assert sent
    assert not [sql for sql, _ in sent if "RESET" in sql or "DISCARD" in sql]
    with capture_statements(db) as sent:
        async with db.unit_of_work(read_only=True) as uow:
            await uow.session.execute(sa.text("SELECT 1"))
    reset = [sql for sql, _ in sent if "DISCARD TEMP" in sql]
    assert len(reset) == (1 if db.dialect == "postgresql" else 0)  # SQLite's is closed instead


# -- a transaction pooler in between ---------------------------------------------------


@POSTGRES
async def test_behind_a_transaction_pooler_nothing_outlives_its_statement_on_a_session(
    db: Database, store: Store
) -> None:
    """`transaction_pooling=True`: no prepared statement kept by name, no setting set on the
    session, and a vector search sends its own settings inside its transaction."""
    pooled = _sibling(
        db, store, f"memorm-pooler-{uuid.uuid4().hex[:8]}", pool_size=1, transaction_pooling=True
    )
    try:
        chat = await _chat(pooled)
        async with pooled.unit_of_work() as uow:
            agent = (await uow.sessions.get(chat)).agent_id
            await uow.passages.add_many(
                agent, [{"text": f"fact {n}", "embedding": [float(n), 1.0]} for n in range(5)]
            )
        with capture_statements(pooled, "hnsw") as settings:
            for _ in range(3):
                await _turn(pooled, chat)
                async with pooled.unit_of_work(read_only=True) as uow:
                    assert len(await uow.passages.search(agent, [1.0, 1.0], k=3)) == 3
        assert len(settings) == 3  # one message of SET LOCALs per search
        assert all("SET LOCAL hnsw.iterative_scan" in sql for sql, _ in settings)
        async with pooled.unit_of_work(read_only=True) as uow:  # the same (only) connection
            named = await uow.session.scalar(sa.text("SELECT count(*) FROM pg_prepared_statements"))
            scan = await uow.session.scalar(sa.text("SHOW hnsw.iterative_scan"))
        assert named == 0
        assert scan == "off"  # pgvector's default: memorm set nothing on the session
    finally:
        await pooled.dispose()


# -- the long run: backends killed over and over under load ----------------------------


@POSTGRES
@pytest.mark.long
async def test_backends_killed_again_and_again_under_load_raise_only_memorm_errors_and_log_nothing(
    db: Database, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """32 sessions on 8 connections, every backend killed ten times: each failed unit of work raised
    a `MemormError`, nothing raw, nothing logged or warned; every session kept getting turns; and
    afterwards every unit of work succeeds on the same `Database`."""
    application = f"memorm-kill-{uuid.uuid4().hex[:8]}"
    loaded = _sibling(db, store, application, pool_size=8, max_overflow=0)
    sessions = 32
    turns = collections.Counter[int]()
    failures = collections.Counter[str]()
    raw: list[BaseException] = []
    stop = False
    caplog.set_level(logging.WARNING)
    try:
        async with loaded.unit_of_work() as uow:
            agent = await uow.agents.create("load")
            chats = [(await uow.sessions.create(agent.id)).id for _ in range(sessions)]

        async def session(index: int) -> None:
            while not stop:
                try:
                    await _turn(loaded, chats[index])
                    turns[index] += 1
                except MemormError as error:
                    failures[type(error).__name__] += 1
                except Exception as error:
                    raw.append(error)

        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            async with anyio.create_task_group() as group:
                for index in range(sessions):
                    group.start_soon(session, index)
                for _ in range(10):
                    await anyio.sleep(0.4)
                    await _kill(application, settle=False)
                await anyio.sleep(0.4)
                stop = True
            for _ in range(20):
                await _turn(loaded, chats[0])
            await loaded.dispose()
            gc.collect()
        assert raw == []
        assert set(failures) <= {"DatabaseError"}
        assert [str(w.message) for w in warned] == []
        assert [record.getMessage() for record in caplog.records] == []
        assert all(turns[index] > 0 for index in range(sessions)), turns
    finally:
        await loaded.dispose()


def test_the_kill_helpers_name_what_they_kill() -> None:
    """`_kill_blocking` puts the name in a literal: a name with a quote would break it."""
    assert "'" not in "memorm-conn-" + uuid.uuid4().hex[:8]
    assert asyncio.iscoroutinefunction(_kill)
