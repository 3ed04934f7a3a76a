"""What the restart and PgBouncer tests share: the disposable servers, a chat load under a fault, its tally.

Not a test module: imported as ``reliability.restart_kit``.  The servers
come from the recipes beside the checkout (``../shared/recipes``):
``pg-scratch``, a Postgres server on its own port (5440) that tests may
restart and stop, and ``pgbouncer``, PgBouncer in transaction mode (6432 in
front of the main server, 6433 in front of pg-scratch).  ``.ci/run`` starts
them; a test that finds one missing skips, or fails under
``MEMORM_REQUIRE_POSTGRES=1``.

The load is 32 chat sessions on a pool of 8: each turn appends a message
with an id of its own in one unit of work, then reads the window in a
read-only one.  Every unit of work is timed, every acknowledged append
(its unit of work exited cleanly) remembered, and every failure kept with
its exception type.  The figures of each run go to
``.bench/reliability-restart.json``.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import json
import logging
import os
import subprocess
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
from conftest import RECIPES, REQUIRE_POSTGRES

from memorm import Database
from memorm.concurrency import Gate
from memorm.errors import MemormError, PoolTimeoutError
from memorm.uow import UnitOfWork

__all__ = [
    "FAILS_WITHIN",
    "PGBOUNCER_SCRATCH_PORT",
    "SCRATCH_PORT",
    "ChatLoad",
    "clean_run",
    "dsn",
    "fresh_database",
    "pool_waits_timed",
    "recipe",
    "record_figures",
    "require_server",
    "restore_server",
]

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / ".bench"
SCRATCH_PORT = int(os.environ.get("PG_SCRATCH_PORT", "5440"))
PGBOUNCER_PORT = 6432  # in front of the main server (5432)
PGBOUNCER_SCRATCH_PORT = 6433  # in front of pg-scratch: the one tests restart
SESSIONS = 32
POOL_SIZE = 8
POOL_TIMEOUT = 10.0
# A failed unit of work raises within this many seconds of its turn at the pool.
FAILS_WITHIN = 2.0
# Wait after a failure before the session's next turn, as a client backs off.
BACKOFF = 0.2


def dsn(port: int, database: str = "postgres", user: str = "root") -> str:
    """A libpq-style URL of a server on this machine (trust auth)."""
    return f"postgresql://{user}@127.0.0.1:{port}/{database}"


def recipe(name: str, *args: str, **env: str) -> str:
    """Run one of ``../shared/recipes`` (blocking); its output."""
    path = RECIPES / name
    if not path.is_file():
        raise FileNotFoundError(f"the {name} recipe is not at {path}")
    done = subprocess.run(
        [str(path), *args], capture_output=True, text=True, env={**os.environ, **env}, timeout=180
    )
    if done.returncode:
        raise RuntimeError(f"{name} {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


async def answers(url: str) -> bool:
    """Whether a server (or PgBouncer) accepts a connection at `url`."""
    try:
        connection = await asyncpg.connect(url, timeout=5)
    except (OSError, asyncpg.PostgresError, asyncio.TimeoutError):
        return False
    await connection.close()
    return True


async def require_server(url: str, what: str) -> None:
    """Skip (fail under ``MEMORM_REQUIRE_POSTGRES=1``) unless the server, or PgBouncer, at `url` answers."""
    if not await answers(url):
        reason = f"{what} does not answer at {url} (.ci/run starts it: ../shared/recipes)"
        if REQUIRE_POSTGRES:
            pytest.fail(f"MEMORM_REQUIRE_POSTGRES=1 but {reason}")
        pytest.skip(reason)


async def restore_server(url: str, *start: str, **env: str) -> None:
    """Start the server at `url` with the recipe command `start` if it does not answer.

    A test that stopped it and failed before starting it again must not
    leave it down for the next one.
    """
    if not await answers(url):
        await anyio.to_thread.run_sync(lambda: recipe(*start, **env))


@asynccontextmanager
async def fresh_database(port: int, prefix: str) -> AsyncIterator[str]:
    """A new database on the server at `port`, with pgvector and btree_gin: its name; dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(dsn(port), timeout=10)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    try:
        connection = await asyncpg.connect(dsn(port, name), timeout=10)
        try:
            await connection.execute("CREATE EXTENSION vector; CREATE EXTENSION btree_gin")
        finally:
            await connection.close()
        yield name
    finally:
        admin = await asyncpg.connect(dsn(port), timeout=10)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


# -- the load -------------------------------------------------------------------

# Seconds the running task's current unit of work waited for its turn at the pool.
WAITED: ContextVar[float] = ContextVar("memorm_test_waited_for_the_pool", default=0.0)


def pool_waits_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Time each unit of work's wait for its turn at the pool (the FIFO gate), into `WAITED`.

    The wait runs in the unit of work's own task (`UnitOfWork.__aenter__`),
    so the context variable set here is the task's.
    """
    original = Gate.enter

    async def enter(self: Gate, expired: Callable[[], BaseException]) -> None:
        started = time.monotonic()
        try:
            await original(self, expired)
        finally:
            WAITED.set(WAITED.get() + time.monotonic() - started)

    monkeypatch.setattr(Gate, "enter", enter)


@dataclass
class Failure:
    """One unit of work that raised."""

    kind: str  # "append" or "window"
    error: BaseException
    started: float  # time.monotonic()
    elapsed: float  # seconds from `async with` to the raise
    waited: float  # of which in line for the pool

    @property
    def own(self) -> float:
        """Seconds from its turn at the pool to the raise: what FAILS_WITHIN bounds."""
        return self.elapsed - self.waited


@dataclass
class ChatLoad:
    """`SESSIONS` chat sessions turning on `db` while a fault strikes, and what they saw."""

    db: Database
    chats: list[uuid.UUID]
    tenant: str | None = None
    succeeded: int = 0
    acknowledged: dict[uuid.UUID, uuid.UUID] = field(default_factory=dict)  # message id -> chat
    attempted: set[uuid.UUID] = field(default_factory=set)
    failures: list[Failure] = field(default_factory=list)
    raw: list[Failure] = field(default_factory=list)  # raised something other than a MemormError
    unseen: list[uuid.UUID] = field(default_factory=list)  # acknowledged, missing from the next window
    turns: collections.Counter[uuid.UUID] = field(default_factory=collections.Counter)
    fault_started: float = 0.0
    recovered: float = 0.0  # when the fault's action returned: the server answers again

    @classmethod
    async def on(cls, db: Database, tenant: str | None = None) -> ChatLoad:
        """A load of `SESSIONS` new chats (one agent) on `db`."""
        async with db.unit_of_work(tenant) as uow:
            agent = await uow.agents.create(f"load-{uuid.uuid4().hex[:8]}")
            chats = [(await uow.sessions.create(agent.id)).id for _ in range(SESSIONS)]
        return cls(db, chats, tenant)

    async def unit(
        self, kind: str, work: Callable[[UnitOfWork], Awaitable[Any]], *, read_only: bool = False
    ) -> tuple[bool, Any]:
        """`(True, work(uow))` in a unit of work of its own, or `(False, None)` once its failure is kept."""
        WAITED.set(0.0)
        started = time.monotonic()
        try:
            async with self.db.unit_of_work(self.tenant, read_only=read_only) as uow:
                result = await work(uow)
        except Exception as error:
            failure = Failure(kind, error, started, time.monotonic() - started, WAITED.get())
            (self.failures if isinstance(error, MemormError) else self.raw).append(failure)
            await anyio.sleep(BACKOFF)
            return False, None
        self.succeeded += 1
        return True, result

    async def turn(self, chat: uuid.UUID) -> bool:
        """One chat turn: append a message, read the window; whether both units of work succeeded."""
        message_id = uuid.uuid4()
        self.attempted.add(message_id)
        message = {"id": message_id, "role": "user", "content": f"turn {self.turns[chat]}"}
        appended, _ = await self.unit("append", lambda uow: uow.messages.append(chat, message))
        if appended:
            self.acknowledged[message_id] = chat
        read, window = await self.unit(
            "window", lambda uow: uow.messages.window(chat, limit=20), read_only=True
        )
        if appended and read and message_id not in {m.id for m in window}:
            self.unseen.append(message_id)
        self.turns[chat] += 1
        return appended and read

    async def run(
        self, fault: Callable[[], Awaitable[Any]], *, before: float = 1.0, after: float = 1.5
    ) -> None:
        """Every session turns; `before` s in, `fault()` runs; `after` s after it returned, they stop."""
        stop = anyio.Event()

        async def session(chat: uuid.UUID) -> None:
            while not stop.is_set():
                await self.turn(chat)

        with anyio.fail_after(before + after + 60):  # a unit of work that hangs fails the test
            async with anyio.create_task_group() as group:
                for chat in self.chats:
                    group.start_soon(session, chat)
                await anyio.sleep(before)
                self.fault_started = time.monotonic()
                await fault()
                self.recovered = time.monotonic()
                await anyio.sleep(after)
                stop.set()

    async def afterwards(self, in_a_row: int = 50) -> None:
        """`in_a_row` units of work one after another, then every session's turn at once: all must succeed."""
        failures, raw = len(self.failures), len(self.raw)
        with anyio.fail_after(60):
            for number in range(in_a_row // 2):
                succeeded = await self.turn(self.chats[number % len(self.chats)])
                assert succeeded, self.describe(self.raw[raw:] + self.failures[failures:])
            async with anyio.create_task_group() as group:
                for chat in self.chats:
                    group.start_soon(self.turn, chat)
        new = self.raw[raw:] + self.failures[failures:]
        assert new == [], f"{len(new)} failed afterwards:\n{self.describe(new)}"

    async def stored(self, admin: asyncpg.Connection) -> dict[uuid.UUID, int]:
        """How many times each attempted message id is stored (read by `admin`, past row-level security)."""
        rows = await admin.fetch(
            "SELECT id, count(*) AS n FROM messages WHERE id = ANY($1::uuid[]) GROUP BY id",
            list(self.attempted),
        )
        return {row["id"]: row["n"] for row in rows}

    def describe(self, failures: list[Failure] | None = None, limit: int = 5) -> str:
        """Failures (by default all), the first few and the commonest, for an assertion's message."""
        chosen = self.raw + self.failures if failures is None else failures
        counts = collections.Counter(f"{f.kind} {type(f.error).__name__}: {f.error}" for f in chosen)
        shown = [
            f"{f.kind} {type(f.error).__name__}: {f.error} ({f.elapsed:.2f}s, {f.waited:.2f}s waiting,"
            f" started {f.started - self.recovered:+.2f}s from recovery)"
            for f in chosen[:limit]
        ]
        return "\n".join([*shown, *(f"{n} x {text}" for text, n in counts.most_common(limit))])

    async def check(self, admin: asyncpg.Connection, *, held_by_pooler: bool = False) -> dict[str, Any]:
        """Assert what the load must show after its fault; the figures.

        `held_by_pooler`: a pooler in front may hold a query sent as the
        server went down until it logs in again (PgBouncer queues it through
        ``server_login_retry``), so every pooled connection can be busy
        longer than ``pool_timeout``; units of work waiting meanwhile then
        fail with ``PoolTimeoutError``, in ``pool_timeout`` and no later, and
        a unit whose statement was held fails by FAILS_WITHIN after recovery.
        """
        assert self.raw == [], f"raw exceptions escaped:\n{self.describe()}"
        slow = [f for f in self.failures if f.own > FAILS_WITHIN]
        if held_by_pooler:
            # A unit whose statement the pooler held through the outage fails when the pooler
            # gives up on it: late, but no later than FAILS_WITHIN after the server is back.
            slow = [f for f in slow if f.started + f.elapsed > self.recovered + FAILS_WITHIN]
        assert slow == [], f"{len(slow)} failures took longer than {FAILS_WITHIN}s:\n{self.describe(slow)}"
        timeouts = [f for f in self.failures if isinstance(f.error, PoolTimeoutError)]
        if held_by_pooler:
            late_timeouts = [f for f in timeouts if f.elapsed > POOL_TIMEOUT + FAILS_WITHIN]
            assert late_timeouts == [], self.describe(late_timeouts)
        else:
            assert timeouts == [], self.describe(timeouts)
        late = [f for f in self.failures if f.started >= self.recovered]
        assert late == [], (
            f"{len(late)} units of work begun after the server was back failed:\n" + self.describe(late)
        )
        assert self.unseen == [], "an acknowledged append was missing from the window read after it"
        stored = await self.stored(admin)
        lost = [mid for mid in self.acknowledged if stored.get(mid) != 1]
        assert lost == [], f"{len(lost)} acknowledged appends are not stored exactly once"
        assert all(count == 1 for count in stored.values())
        gaps = await admin.fetch(
            "SELECT session_id FROM messages WHERE session_id = ANY($1::uuid[]) GROUP BY session_id"
            " HAVING min(seq) <> 1 OR max(seq) <> count(*)",
            self.chats,
        )
        assert gaps == [], "a session's seqs have gaps"
        assert self.db.engine.pool.checkedout() == 0
        assert all(self.turns[chat] > 0 for chat in self.chats)
        return {
            "units_succeeded": self.succeeded,
            "units_failed": len(self.failures),
            "failed_by_type": dict(collections.Counter(type(f.error).__name__ for f in self.failures)),
            "failed_saying": dict(
                collections.Counter(str(f.error)[:120] for f in self.failures).most_common(6)
            ),
            "acknowledged_writes": len(self.acknowledged),
            "acknowledged_writes_lost": len(lost),
            "failed_appends_stored_anyway": sum(1 for mid in stored if mid not in self.acknowledged),
            "slowest_failure_s": round(max((f.own for f in self.failures), default=0.0), 3),
            "slowest_failure_saying": max(self.failures, key=lambda f: f.own).error.args[0][:160]
            if self.failures
            else None,
            "slowest_failure_with_pool_wait_s": round(
                max((f.elapsed for f in self.failures), default=0.0), 3
            ),
            "fault_s": round(self.recovered - self.fault_started, 2),
            "failed_after_recovery": len(late),
        }


# -- a clean run: nothing logged, warned or left unretrieved ----------------------


@contextmanager
def clean_run(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Assert that the block logs nothing (WARNING and up), warns nothing, and leaves no unretrieved error.

    "Task was destroyed but it is pending" and unretrieved futures reach the
    loop's exception handler or asyncio's logger; "coroutine was never
    awaited" and ResourceWarning are warnings, issued by the garbage
    collector: collected here before the checks.
    """
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    seen: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    caplog.set_level(logging.WARNING)
    try:
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            yield
            for _ in range(3):
                gc.collect()
    finally:
        loop.set_exception_handler(previous)
    # Not a test module, so no assertion rewriting: each assertion says what it found.
    warned_of = [f"{w.category.__name__}: {w.message}" for w in warned]
    assert warned_of == [], f"warnings: {warned_of}"
    logged = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert logged == [], f"logged: {logged}"
    unretrieved = [context.get("message") for context in seen]
    assert unretrieved == [], f"the loop's exception handler got: {seen}"


def record_figures(name: str, figures: dict[str, Any]) -> None:
    """Print one run's figures and keep them in ``.bench/reliability-restart.json`` (by test name)."""
    print(f"{name}: {json.dumps(figures)}")
    BENCH.mkdir(exist_ok=True)
    path = BENCH / "reliability-restart.json"
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        kept = {}
    kept[name] = figures
    path.write_text(json.dumps(kept, indent=2, sort_keys=True) + "\n")
