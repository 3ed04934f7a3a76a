"""`Database.health()`: a readiness probe's answer, on both engines, that never raises for the database."""

from __future__ import annotations

import asyncio
import math
import random
import sqlite3
import threading
import time
from contextlib import closing
from pathlib import Path

import anyio
import asyncpg
import pytest
from conftest import Store
from reliability.test_cancellation import KINDS, assert_clean, cancel_after, loop_errors, settle
from sqlalchemy.engine import make_url

from memorm import Database
from memorm.errors import ValidationError
from memorm.health import Health
from memorm.pool_figures import pool_figures
from memorm.schema_state import head_revision, scripts

pytestmark = pytest.mark.anyio


async def _stamp(store: Store, revision: str) -> None:
    """Record `revision` as the schema's, as the tables' owner: a deploy that migrated elsewhere."""
    if store.engine == "sqlite":
        with closing(sqlite3.connect(str(make_url(store.url).database))) as raw:
            raw.execute("UPDATE alembic_version SET version_num = ?", (revision,))
            raw.commit()
        return
    admin = await asyncpg.connect(store.admin_dsn(), server_settings={"search_path": str(store.schema)})
    try:
        await admin.execute("UPDATE alembic_version SET version_num = $1", revision)
    finally:
        await admin.close()


async def test_a_current_database_is_ok_with_its_revision_latency_and_pool(db: Database) -> None:
    health = await db.health()
    assert health.ok
    assert health.reachable
    assert health.schema_current
    assert health.revision == health.head == head_revision()
    assert health.error is None
    assert health.latency is not None
    assert 0 < health.latency < 5
    # One loop's pool, the probe's connection given back and kept idle.
    assert health.pool.loops == 1
    assert (health.pool.in_use, health.pool.waiting) == (0, 0)
    assert health.pool.idle >= 1
    assert health.pool.size == 5
    assert health.pool.limit == 15
    body = health.as_dict()
    assert body["ok"] is True
    assert body["pool"]["in_use"] == 0
    assert body["revision"] == head_revision()


async def test_a_schema_behind_this_memorm_is_reachable_but_not_ok(db: Database, store: Store) -> None:
    await db.check_schema()  # memorm learned the schema was current: health reads it again anyway
    previous = scripts().get_revision(head_revision()).down_revision
    assert isinstance(previous, str)
    await _stamp(store, previous)
    try:
        health = await db.health()
        assert health.reachable
        assert not health.ok
        assert not health.schema_current
        assert health.revision == previous
        assert health.head == head_revision()
        assert health.error is None
    finally:
        await _stamp(store, head_revision())
    assert (await db.health()).ok


async def test_an_unreachable_server_is_reported_not_raised(engine: str, tmp_path: Path) -> None:
    url = (
        f"sqlite+aiosqlite:///{tmp_path}/no/such/folder/memorm.db"
        if engine == "sqlite"
        else "postgresql+asyncpg://root@127.0.0.1:9/test"  # the discard port: nothing listens
    )
    async with Database(url) as db:
        health = await db.health(timeout=10)
    assert not health.reachable
    assert not health.ok
    assert (health.latency, health.revision) == (None, None)
    assert health.error is not None
    assert health.error.startswith("DatabaseError: ")
    assert health.pool.in_use == 0


async def test_a_pool_that_stays_full_fails_the_probe_after_its_timeout(db: Database) -> None:
    small = db.clone(pool_size=1, max_overflow=0)
    try:
        async with small.unit_of_work() as holding:
            await holding.agents.list()
            probing = asyncio.ensure_future(small.health(timeout=0.5))
            await asyncio.sleep(0.1)
            waiting = pool_figures(small.engines)  # the probe queues for its turn, as units of work do
            assert (waiting.in_use, waiting.waiting, waiting.limit) == (1, 1, 1)
            health = await probing
        assert not health.reachable
        assert health.error == "TimeoutError: no answer within 0.5 s"
        assert health.pool.waiting == 0  # the probe left the line
        after = await small.health()
        assert after.ok
        assert after.pool.in_use == 0
    finally:
        await small.dispose()


@pytest.mark.parametrize("seconds", [0, -1, math.nan, math.inf, True, "5", None])
async def test_a_bad_timeout_is_refused_before_any_connection(db: Database, seconds: object) -> None:
    fresh = db.clone()  # a pool of its own, untouched
    try:
        with pytest.raises(ValidationError, match="timeout"):
            await fresh.health(timeout=seconds)  # type: ignore[arg-type]
        assert pool_figures(fresh.engines).loops == 0  # no event loop's engine was even made
    finally:
        await fresh.dispose()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_cancelled_probe_leaves_nothing_checked_out(db: Database, store: Store, kind: str) -> None:
    assert (await db.health()).ok  # the first opens the pool's connection
    warm = sorted([(await db.health()).latency or 0 for _ in range(5)])[2]
    rng = random.Random(f"health-{kind}-{store.engine}")
    cancelled = 0
    with loop_errors() as errors:
        for _ in range(40):
            if await cancel_after(kind, rng.uniform(0, warm), db.health):
                cancelled += 1
            assert db.engine.pool.checkedout() == 0
        await settle()
    assert errors == []
    assert cancelled >= 5  # the deadlines did land mid-probe
    await assert_clean(db, store)
    assert (await db.health()).ok


async def test_probes_from_other_loops_and_threads_see_their_pools(db: Database) -> None:
    assert (await db.health()).pool.loops == 1
    found: list[Health] = []

    def in_thread() -> None:
        found.append(asyncio.run(db.health()))  # a loop of its own: an engine of its own

    for _ in range(2):
        thread = threading.Thread(target=in_thread)
        thread.start()
        await anyio.to_thread.run_sync(thread.join)
    assert [h.ok for h in found] == [True, True]
    assert [h.pool.loops for h in found] == [2, 2]  # this loop's pool and the thread's
    assert (await db.health()).pool.loops == 1  # each thread's loop closed its pool as it ended


async def test_a_tenant_view_probes_as_its_tenant(db: Database) -> None:
    health = await db.for_tenant("acme").health()
    assert health.ok
    assert health.pool.in_use == 0


@pytest.mark.sqlite
def test_a_sqlite_file_that_cannot_be_opened_leaves_no_thread_to_report_to_a_closed_loop(
    tmp_path: Path,
) -> None:
    async def probe() -> Health:
        async with Database(f"sqlite+aiosqlite:///{tmp_path}/no/such/folder/memorm.db") as db:
            return await db.health()

    seen: list[threading.ExceptHookArgs] = []
    previous = threading.excepthook
    threading.excepthook = seen.append
    try:
        for _ in range(20):  # each a loop that closes as soon as the probe failed
            assert not asyncio.run(probe()).reachable
        time.sleep(0.1)
    finally:
        threading.excepthook = previous
    assert [f"{args.exc_type.__name__}: {args.exc_value}" for args in seen] == []
