"""memorm behind PgBouncer in transaction mode (``../shared/recipes/pgbouncer``).

PgBouncer hands each transaction whichever server connection is free, so
``Database(transaction_pooling=True)`` keeps nothing on a server connection
beyond a transaction.  Here:

* 60 chat turns at once through PgBouncer (6432, in front of the main
  server) all succeed with it, and many fail without it (asyncpg's named
  statements meet other clients' server connections);
* PgBouncer restarted under load (``pgbouncer restart``: every client and
  server connection dropped), and the server behind PgBouncer restarted
  under load: afterwards every unit of work succeeds on the same
  ``Database``, no acknowledged write is lost, every failed unit of work
  raised a ``MemormError`` within 2 s of its turn at the pool.  These use a
  PgBouncer of their own (6433) in front of the disposable server
  (pg-scratch, 5440): restarting them disturbs no other test.

The first runs whenever PgBouncer answers on 6432 (it skips otherwise, and
fails under ``MEMORM_REQUIRE_POSTGRES=1``); the restarts are ``long``.
"""

from __future__ import annotations

import collections
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
import asyncpg
import pytest
from conftest import pgbouncer_admits, pgbouncer_user

from memorm import Database
from memorm.errors import MemormError
from reliability.restart_kit import (
    PGBOUNCER_PORT,
    PGBOUNCER_SCRATCH_PORT,
    POOL_SIZE,
    POOL_TIMEOUT,
    SCRATCH_PORT,
    ChatLoad,
    clean_run,
    dsn,
    fresh_database,
    pool_waits_timed,
    recipe,
    record_figures,
    require_server,
    restore_server,
)

pytestmark = [pytest.mark.anyio, pytest.mark.reliability, pytest.mark.postgres]

MAIN_PORT = 5432
TURNS = 60
# The recipe's command for the PgBouncer in front of pg-scratch.
SCRATCH_BOUNCER = {"PGBOUNCER_PORT": str(PGBOUNCER_SCRATCH_PORT), "PGBOUNCER_TARGET_PORT": str(SCRATCH_PORT)}


def _url(port: int, database: str, user: str = "root") -> str:
    return f"postgresql+asyncpg://{user}@127.0.0.1:{port}/{database}"


async def _turns(db: Database, chats: list[uuid.UUID]) -> collections.Counter[str]:
    """One chat turn per chat, all at once: how many failed, by error (a raw one fails the test)."""
    failed = collections.Counter[str]()

    async def turn(chat: uuid.UUID) -> None:
        try:
            async with db.unit_of_work() as uow:
                [message] = await uow.messages.append(chat, {"role": "user", "content": "hi"})
            async with db.unit_of_work(read_only=True) as uow:
                assert [m.id for m in await uow.messages.window(chat, limit=20)] == [message.id]
        except MemormError as error:
            failed[type(error).__name__] += 1

    with anyio.fail_after(60):
        async with anyio.create_task_group() as group:
            for chat in chats:
                group.start_soon(turn, chat)
    return failed


async def test_chat_turns_through_pgbouncer_succeed_with_transaction_pooling_and_fail_without() -> None:
    await require_server(dsn(PGBOUNCER_PORT), "PgBouncer")
    async with fresh_database(MAIN_PORT, "memorm_pgbouncer") as name:
        owner = Database(_url(MAIN_PORT, name))
        try:
            await owner.create_all()
            async with owner.unit_of_work() as uow:
                agent = await uow.agents.create("bounced")
                chats = [(await uow.sessions.create(agent.id)).id for _ in range(2 * TURNS)]
        finally:
            await owner.dispose()
        pooled = Database(_url(PGBOUNCER_PORT, name), transaction_pooling=True)
        try:
            assert await _turns(pooled, chats[:TURNS]) == collections.Counter()
        finally:
            await pooled.dispose()
        # Without it, asyncpg's named statements, prepared on one server connection, are
        # looked for on another ("prepared statement ... does not exist").
        unaware = Database(_url(PGBOUNCER_PORT, name))
        try:
            failed = await _turns(unaware, chats[TURNS:])
        finally:
            await unaware.dispose()
        assert set(failed) == {"DatabaseError"}, failed
        print(f"without transaction_pooling: {sum(failed.values())} of {TURNS} turns failed")


# -- restarts under load, behind PgBouncer ------------------------------------------


@dataclass
class Bounced:
    """A fresh database on pg-scratch, and a pooled `Database` on it through PgBouncer (6433)."""

    db: Database
    name: str
    role: str  # "superuser", or the application role's name


@pytest.fixture(params=["superuser", "app"])
async def bounced(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bounced]:
    """As the superuser, or as an application role under row-level security (listed in
    PgBouncer's auth file for the test)."""
    from memorm.tenants import create_role

    await require_server(dsn(SCRATCH_PORT), "pg-scratch")
    await require_server(dsn(PGBOUNCER_SCRATCH_PORT), "PgBouncer in front of pg-scratch")
    pool_waits_timed(monkeypatch)
    role = None
    try:
        async with fresh_database(SCRATCH_PORT, "memorm_bounced") as name:
            owner = Database(_url(SCRATCH_PORT, name))
            try:
                await owner.create_all()
                if request.param == "app":
                    role = f"memorm_app_{uuid.uuid4().hex[:10]}"
                    await create_role(owner, role)
            finally:
                await owner.dispose()
            url = _url(PGBOUNCER_SCRATCH_PORT, name, role or "root")
            if role is not None:
                pgbouncer_user(role, listed=True, port=PGBOUNCER_SCRATCH_PORT)
                await pgbouncer_admits(url)
            db = Database(
                url, transaction_pooling=True, pool_size=POOL_SIZE, max_overflow=0, pool_timeout=POOL_TIMEOUT
            )
            try:
                yield Bounced(db, name, role or "superuser")
            finally:
                await db.dispose()
                await restore_server(dsn(SCRATCH_PORT), "pg-scratch", "start")
                await restore_server(dsn(PGBOUNCER_SCRATCH_PORT), "pgbouncer", "start", **SCRATCH_BOUNCER)
    finally:
        if role is not None:  # after its database: nothing of it is left to drop
            pgbouncer_user(role, listed=False, port=PGBOUNCER_SCRATCH_PORT)
            admin = await asyncpg.connect(dsn(SCRATCH_PORT), timeout=10)
            try:
                await admin.execute(f'DROP ROLE IF EXISTS "{role}"')
            finally:
                await admin.close()


async def _serves(bounced: Bounced) -> float:
    """Wait until PgBouncer serves a query on the test's database again; the seconds it took.

    After the server behind it restarts, PgBouncer refuses every login for
    ``server_login_retry`` (15 s by default) once one failed while the server
    was down: it answers each unit of work at once with an error
    ("server login has been failing, try again later"), which memorm raises
    as a ``DatabaseError``.  The path to the database is back only then.
    """
    user = "root" if bounced.role == "superuser" else bounced.role
    started = time.monotonic()
    with anyio.fail_after(60):
        while True:
            try:
                connection = await asyncpg.connect(
                    dsn(PGBOUNCER_SCRATCH_PORT, bounced.name, user), statement_cache_size=0, timeout=5
                )
                try:
                    await connection.fetchval("SELECT 1")
                    return time.monotonic() - started
                finally:
                    await connection.close()
            except (asyncpg.PostgresError, OSError, asyncpg.InterfaceError):
                await anyio.sleep(0.1)


async def _run(bounced: Bounced, caplog: pytest.LogCaptureFixture, fault: str) -> None:
    load = await ChatLoad.on(bounced.db)
    waited = 0.0

    async def restart_pgbouncer() -> None:
        await anyio.to_thread.run_sync(lambda: recipe("pgbouncer", "restart", **SCRATCH_BOUNCER))
        if bounced.role != "superuser":  # the recipe wrote its auth file anew
            pgbouncer_user(bounced.role, listed=True, port=PGBOUNCER_SCRATCH_PORT)
            await _serves(bounced)

    async def restart_server() -> None:
        nonlocal waited
        await anyio.to_thread.run_sync(recipe, "pg-scratch", "restart", "fast")
        waited = await _serves(bounced)

    with clean_run(caplog):
        await load.run(restart_pgbouncer if fault == "pgbouncer restart" else restart_server)
        await load.afterwards()
    admin = await asyncpg.connect(dsn(SCRATCH_PORT, bounced.name), timeout=10)
    try:
        figures = await load.check(admin, held_by_pooler=fault == "pg-scratch restart")
    finally:
        await admin.close()
    role = "superuser" if bounced.role == "superuser" else "application role"
    figures["pgbouncer_refused_logins_for_s"] = round(waited, 2)
    record_figures(f"{fault} behind PgBouncer ({role})", {"restarts_survived": 1, **figures})


@pytest.mark.long
async def test_a_pgbouncer_restart_under_load_fails_units_cleanly_and_loses_no_acknowledged_write(
    bounced: Bounced, caplog: pytest.LogCaptureFixture
) -> None:
    await _run(bounced, caplog, "pgbouncer restart")


@pytest.mark.long
async def test_a_server_restart_behind_pgbouncer_under_load_fails_units_cleanly_and_loses_no_acked_write(
    bounced: Bounced, caplog: pytest.LogCaptureFixture
) -> None:
    await _run(bounced, caplog, "pg-scratch restart")
