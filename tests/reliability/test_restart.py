"""A real Postgres restart, stop and kill under load, on a disposable server (pg-scratch).

32 chat sessions share a pool of 8 connections while the server under them
restarts (``pg_ctl restart -m fast``), stops for 5 s and starts again, or
has every backend of the pool terminated (what an idle-connection reaper,
a failover or an operator does).  Then, with the same ``Database`` (no new
one, no dispose):

* every unit of work begun after the server answered again succeeded, and
  50 more in a row, and a turn of every session at once, succeed;
* every acknowledged append (its unit of work exited cleanly) is stored,
  exactly once, and each session's seqs have no gap;
* every failed unit of work raised a ``MemormError`` (never a raw driver or
  OS error) within 2 s of its turn at the pool.  The clock starts when the
  unit of work got its turn (the FIFO gate let it through to the pool), not
  when it joined the line: a unit of work queued behind others during the
  outage is not hanging, it is waiting its turn, and that wait is bounded by
  ``pool_timeout`` (a ``PoolTimeoutError``, which none of these runs may
  raise).  The figures keep both times;
* nothing is logged (WARNING and up), warned (ResourceWarning, "never
  awaited") or left unretrieved ("Task was destroyed").

Each runs as the superuser and as an application role under row-level
security.  Figures: ``.bench/reliability-restart.json``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import anyio
import asyncpg
import pytest

from memorm import Database
from reliability.restart_kit import (
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

pytestmark = [pytest.mark.anyio, pytest.mark.reliability, pytest.mark.long, pytest.mark.postgres]


@dataclass
class Scratch:
    """A fresh database on pg-scratch and a pooled `Database` on it."""

    db: Database
    name: str  # the database
    application: str  # the application_name of db's connections
    role: str  # "superuser", or the application role's name


@pytest.fixture(params=["superuser", "app"])
async def scratch(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Scratch]:
    """A database of its own on pg-scratch, and a `Database` with a pool of 8, as the superuser or
    as an application role (memorm.tenants.create_role) under row-level security."""
    from memorm.tenants import create_role

    await require_server(dsn(SCRATCH_PORT), "pg-scratch")
    pool_waits_timed(monkeypatch)
    application = f"memorm-restart-{uuid.uuid4().hex[:8]}"
    options = {
        "pool_size": POOL_SIZE,
        "max_overflow": 0,
        "pool_timeout": POOL_TIMEOUT,
        "connect_args": {"server_settings": {"application_name": application}},
    }
    role = None
    try:
        async with fresh_database(SCRATCH_PORT, "memorm_restart") as name:
            url = f"postgresql+asyncpg://root@127.0.0.1:{SCRATCH_PORT}/{name}"
            owner = Database(url)
            try:
                await owner.create_all()
                if request.param == "app":
                    role = f"memorm_app_{uuid.uuid4().hex[:10]}"
                    await create_role(owner, role)
                    url = url.replace("root@", f"{role}@")
            finally:
                await owner.dispose()
            db = Database(url, **options)
            try:
                yield Scratch(db, name, application, role or "superuser")
            finally:
                await db.dispose()
                await restore_server(dsn(SCRATCH_PORT), "pg-scratch", "start")  # a failed test left it down?
    finally:
        if role is not None:  # after its database: nothing of it is left to drop
            admin = await asyncpg.connect(dsn(SCRATCH_PORT), timeout=10)
            try:
                await admin.execute(f'DROP ROLE IF EXISTS "{role}"')
            finally:
                await admin.close()


async def _run(scratch: Scratch, caplog: pytest.LogCaptureFixture, fault: str) -> None:
    """The load on `scratch.db` through `fault`, then the checks; the figures recorded."""
    load = await ChatLoad.on(scratch.db)
    with clean_run(caplog):
        await load.run(FAULTS[fault](scratch))
        await load.afterwards()
    admin = await asyncpg.connect(dsn(SCRATCH_PORT, scratch.name), timeout=10)
    try:
        figures = await load.check(admin)
    finally:
        await admin.close()
    role = "superuser" if scratch.role == "superuser" else "application role"
    record_figures(f"pg-scratch {fault} ({role})", {"restarts_survived": 1, **figures})


async def test_a_restart_under_load_fails_units_cleanly_and_loses_no_acknowledged_write(
    scratch: Scratch, caplog: pytest.LogCaptureFixture
) -> None:
    await _run(scratch, caplog, "restart")


async def test_a_stop_of_5_s_under_load_fails_units_cleanly_and_loses_no_acknowledged_write(
    scratch: Scratch, caplog: pytest.LogCaptureFixture
) -> None:
    await _run(scratch, caplog, "stop 5 s")


async def test_every_pooled_backend_killed_under_load_fails_units_cleanly_and_loses_no_acknowledged_write(
    scratch: Scratch, caplog: pytest.LogCaptureFixture
) -> None:
    await _run(scratch, caplog, "kill")


Fault = Callable[[], Awaitable[None]]


def _restart(_scratch: Scratch) -> Fault:
    """pg_ctl restart -m fast: every backend told to exit, the server down for about a second."""

    async def fault() -> None:
        await anyio.to_thread.run_sync(recipe, "pg-scratch", "restart", "fast")

    return fault


def _stop_and_start(_scratch: Scratch) -> Fault:
    """pg_ctl stop -m fast, 5 s with nothing listening, then start."""

    async def fault() -> None:
        await anyio.to_thread.run_sync(recipe, "pg-scratch", "stop")
        await anyio.sleep(5)
        await anyio.to_thread.run_sync(recipe, "pg-scratch", "start")

    return fault


def _kill_the_pool(scratch: Scratch) -> Fault:
    """pg_terminate_backend of every backend of the pool, idle or busy, as a reaper or an operator does."""

    async def fault() -> None:
        admin = await asyncpg.connect(dsn(SCRATCH_PORT, scratch.name), timeout=10)
        try:
            pids = [
                row["pid"]
                for row in await admin.fetch(
                    "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
                    scratch.application,
                )
            ]
            assert 0 < len(pids) <= POOL_SIZE
            gone = "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = ANY($1::int[])"
            with anyio.fail_after(10):  # until the server has let every one of them go
                while not await admin.fetchval(gone, pids):  # noqa: ASYNC110 (polls the server)
                    await anyio.sleep(0.02)
        finally:
            await admin.close()

    return fault


FAULTS: dict[str, Callable[[Scratch], Fault]] = {
    "restart": _restart,
    "stop 5 s": _stop_and_start,
    "kill": _kill_the_pool,
}
