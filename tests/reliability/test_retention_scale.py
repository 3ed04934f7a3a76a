"""Retention at scale: purges of 50,000 messages beside live traffic, and what ``forget`` leaves behind.

A batched purge commits every batch, so appends to live sessions must keep
succeeding between its batches (SQLite's one write lock is held for a batch at
a time, never for the whole purge).  Every acknowledged append must be stored
exactly once with gap-free ``seq``; every expired row must go, and the counts
must be exact.  The runs are bounded in rows, not in time: durations are
printed (``pytest -s``), never asserted.

After ``forget`` (which scrubs) the person's words must be gone from the
SQLite file and its WAL, and Postgres must hold neither dead row versions of
them nor index entries pointing at those (pgstattuple); without the scrub they
are still there, which shows the probes can fail.  The person is one among
many (a few pages of tables of hundreds), as in a real erasure request.
"""

from __future__ import annotations

import hashlib
import time
import traceback
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
import sqlalchemy as sa
from conftest import POSTGRES_URL, Store, admin_execute, asyncpg_dsn, count_rows
from sqlalchemy.engine import make_url

from memorm import Database
from memorm.retention import Removed, forget, purge_expired, purge_older_than
from memorm.search.fts_ddl import MESSAGES_FTS
from memorm.types import UUIDType, utcnow

pytestmark = [pytest.mark.anyio, pytest.mark.reliability, pytest.mark.long]

EXPIRED = 500  # sessions past expires_at
PER_SESSION = 100  # messages in each, appended 100 per call
BATCH = 25  # sessions per purge batch: 500 / 25 = 20 batches
LIVE_HISTORY = 5  # messages already in each live session
HANG_GUARD_S = 240  # only turns a deadlock into a failure; never a performance bound
TABLES = ("agents", "sessions", "messages", "archival_passages", "embedding_models")


@dataclass
class Recorder:
    """A ``memorm.progress.Reporter`` that remembers every call, in order, in a shared event log."""

    log: list[tuple[str, Any]]
    started: dict[str, int] = field(default_factory=dict)
    advanced: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))

    def start(self, task: str, total: int) -> None:
        self.started[task] = total

    def advance(self, task: str, rows: int) -> None:
        self.advanced[task].append(rows)
        if task == "sessions" and rows:
            self.log.append(("batch", rows))

    def totals(self) -> dict[str, int]:
        return {task: sum(rows) for task, rows in self.advanced.items()}


@dataclass
class Fixture:
    """The rows a purge test starts from."""

    now: datetime  # the purge's clock
    expired: list[uuid.UUID]
    live: list[uuid.UUID]


async def _build(db: Database) -> Fixture:
    """500 expired sessions of 100 messages, and 8 live ones (one expiring a microsecond after ``now``)."""
    now = utcnow() + timedelta(hours=2)
    async with db.unit_of_work() as uow:
        ephemeral = (await uow.agents.create("ephemeral", retention=timedelta(hours=1))).id
        keeper = (await uow.agents.create("keeper")).id
        expired = [(await uow.sessions.create(ephemeral)).id for _ in range(EXPIRED)]
        # Expiring at exactly ``now`` is expired; a microsecond later is not.
        await uow.sessions.touch(expired[0], ttl=timedelta(hours=1), now=now - timedelta(hours=1))
        live = [(await uow.sessions.create(keeper)).id for _ in range(4)]
        live += [(await uow.sessions.create(ephemeral, ttl=timedelta(days=1))).id for _ in range(3)]
        live.append((await uow.sessions.create(ephemeral)).id)
        await uow.sessions.touch(
            live[-1], ttl=timedelta(hours=1), now=now - timedelta(hours=1) + timedelta(microseconds=1)
        )
        for chat in live:
            await uow.messages.append(
                chat, [{"role": "user", "content": f"history {n}"} for n in range(1, LIVE_HISTORY + 1)]
            )
    for start in range(0, EXPIRED, 50):  # 50 sessions (5,000 messages) per unit of work
        async with db.unit_of_work() as uow:
            for index in range(start, start + 50):
                await uow.messages.append(
                    expired[index],
                    [
                        {"role": "user" if n % 2 else "assistant", "content": f"expired {index}.{n} words"}
                        for n in range(PER_SESSION)
                    ],
                )
    return Fixture(now, expired, live)


@dataclass
class Appender:
    """Appends one message at a time to the live sessions, a unit of work each, until told to stop."""

    db: Database
    live: list[uuid.UUID]
    log: list[tuple[str, Any]]
    begin: anyio.Event | None = None  # wait for it before the first append
    done: anyio.Event = field(default_factory=anyio.Event)
    appended: anyio.Event = field(default_factory=anyio.Event)  # set by the first acknowledged append
    acknowledged: dict[uuid.UUID, list[tuple[int, str]]] = field(default_factory=lambda: defaultdict(list))
    errors: list[str] = field(default_factory=list)

    async def run(self) -> None:
        if self.begin is not None:
            await self.begin.wait()
        number = 0
        while not self.done.is_set():
            chat = self.live[number % len(self.live)]
            content = f"live append {number}"
            self.log.append(("start", number))
            try:
                async with self.db.unit_of_work() as uow:
                    [stored] = await uow.messages.append(chat, {"role": "user", "content": content})
                self.acknowledged[chat].append((stored.seq, content))  # committed: acknowledged
                self.log.append(("append", number))
                self.appended.set()
            except Exception:
                self.errors.append(f"append {number}:\n{traceback.format_exc()}")
            number += 1

    @property
    def count(self) -> int:
        return sum(len(entries) for entries in self.acknowledged.values())


async def _check_live_sessions(db: Database, fixture: Fixture, appender: Appender) -> None:
    """Every live session holds its history then every acknowledged append, seq 1..n without gaps."""
    assert appender.errors == [], f"{len(appender.errors)} appends failed, first:\n{appender.errors[0]}"
    async with db.unit_of_work(read_only=True) as uow:
        for index, chat in enumerate(fixture.live):
            stored: list[Any] = []
            while len(page := await uow.messages.window(chat, after_seq=len(stored), limit=1000)) == 1000:
                stored += page
            stored += page
            history = [(n, f"history {n}") for n in range(1, LIVE_HISTORY + 1)]
            expected = history + appender.acknowledged[chat]
            assert [(m.seq, m.content) for m in stored] == expected, f"live session {index}"
            assert [m.seq for m in stored] == list(range(1, len(expected) + 1)), f"live session {index}"
            assert (await uow.sessions.get(chat)).next_seq == len(expected) + 1
        assert await uow.sessions.purge_expired(now=fixture.now, dry_run=True) == Removed()
    assert await count_rows(db, "sessions") == len(fixture.live)
    assert await count_rows(db, "messages") == len(fixture.live) * LIVE_HISTORY + appender.count
    for chat in fixture.expired[:: EXPIRED // 10]:
        assert await count_rows(db, "messages", session_id=chat) == 0


async def test_batched_purge_of_50000_messages_lets_concurrent_appends_through(
    db: Database, engine: str
) -> None:
    started = time.perf_counter()
    fixture = await _build(db)
    built = time.perf_counter() - started

    log: list[tuple[str, Any]] = []
    reporter = Recorder(log)
    appender = Appender(db, fixture.live, log)  # one Database shared by both tasks, as in a server
    result: list[Removed] = []

    async def purge() -> None:
        try:
            result.append(await purge_expired(db, now=fixture.now, batch=BATCH, reporter=reporter))
            log.append(("purged", None))
        finally:
            appender.done.set()

    started = time.perf_counter()
    with anyio.fail_after(HANG_GUARD_S):
        async with anyio.create_task_group() as group:
            group.start_soon(appender.run)
            group.start_soon(purge)
    purged = time.perf_counter() - started

    assert result == [Removed(sessions=EXPIRED, messages=EXPIRED * PER_SESSION)]
    assert reporter.started == {"sessions": EXPIRED, "messages": EXPIRED * PER_SESSION}
    assert reporter.totals() == {"sessions": EXPIRED, "messages": EXPIRED * PER_SESSION}
    batches = [rows for rows in reporter.advanced["sessions"] if rows]
    assert batches == [BATCH] * (EXPIRED // BATCH), "one commit per batch of 25 sessions"
    # Appends finished between the purge's first and last batches: it never held the writers off.
    positions = [index for index, (kind, _) in enumerate(log) if kind == "batch"]
    between = sum(1 for kind, _ in log[positions[0] : positions[-1]] if kind == "append")
    assert between >= 1, f"no append completed while the purge ran: {log[:50]}"
    await _check_live_sessions(db, fixture, appender)
    print(
        f"\n[retention {engine}] built {EXPIRED * PER_SESSION} messages in {built:.1f} s; batched purge "
        f"in {purged:.1f} s ({len(batches)} batches) beside {appender.count} appends, "
        f"{between} of them between the first and last batch"
    )


async def test_purge_in_one_unit_of_work_lets_appends_to_other_sessions_finish(
    db: Database, store: Store, engine: str
) -> None:
    fixture = await _build(db)
    log: list[tuple[str, Any]] = []
    # Another Database: on SQLite the appends wait on the file's write lock (the busy
    # timeout), as another process's would.
    other = store.database()
    appender = Appender(other, fixture.live, log, begin=anyio.Event())
    await count_rows(other, "sessions")  # its pool has a connection ready
    result: list[Removed] = []

    async def purge() -> None:
        try:
            async with db.unit_of_work() as uow:
                # The transaction begins here (on SQLite: BEGIN IMMEDIATE, the file's write lock).
                expected = await uow.sessions.purge_expired(now=fixture.now, dry_run=True)
                log.append(("open", None))
                assert appender.begin is not None
                appender.begin.set()
                result.append(await uow.sessions.purge_expired(now=fixture.now, batch=100))
                log.append(("purged", None))
                if engine == "postgres":
                    # Deleted but not committed, the purged sessions still locked: an append to
                    # another session must get through now (else the guard fails the test).
                    with anyio.fail_after(HANG_GUARD_S / 4):
                        await appender.appended.wait()
                log.append(("committing", None))
            assert result == [expected]
        finally:
            appender.begin.set()
            appender.done.set()

    started = time.perf_counter()
    try:
        with anyio.fail_after(HANG_GUARD_S):
            async with anyio.create_task_group() as group:
                group.start_soon(appender.run)
                group.start_soon(purge)
    finally:
        await other.dispose()
    purged = time.perf_counter() - started

    assert result == [Removed(sessions=EXPIRED, messages=EXPIRED * PER_SESSION)]
    kinds = [kind for kind, _ in log]
    running = kinds[kinds.index("open") : kinds.index("purged")]  # the purge's statements
    inside = kinds[kinds.index("open") : kinds.index("committing")]  # its whole transaction
    assert running.count("start") >= 1, "no append began while the purge ran"
    if engine == "sqlite":  # one write lock per file: the appends wait for the purge's commit...
        assert inside.count("append") == 0
    else:  # ...while Postgres locks only the purged sessions' rows
        assert inside.count("append") >= 1
    await _check_live_sessions(db, fixture, appender)  # and every one of them succeeded
    print(
        f"\n[retention {engine}] one-transaction purge of {EXPIRED * PER_SESSION} messages in {purged:.1f} s "
        f"beside {appender.count} appends ({running.count('start')} begun while it ran, "
        f"{inside.count('append')} completed inside its transaction)"
    )


# -- purge_older_than -----------------------------------------------------------------


async def _state(db: Database, agent_id: uuid.UUID | None = None) -> dict[str, tuple[int, str]]:
    """Row count and checksum of every row of each table (of one agent, if given)."""
    found: dict[str, tuple[int, str]] = {}
    async with db.engine.connect() as connection:
        for table in TABLES:
            sql = f"SELECT * FROM {table}"
            statement = sa.text(sql + " ORDER BY id")
            if agent_id is not None:
                column = "id" if table == "agents" else "agent_id"
                statement = sa.text(f"{sql} WHERE {column} = :agent ORDER BY id").bindparams(
                    sa.bindparam("agent", agent_id, type_=UUIDType())
                )
            rows = (await connection.execute(statement)).all()
            found[table] = (len(rows), hashlib.sha256(repr(rows).encode()).hexdigest())
    return found


OLD_MESSAGES = 3 * 40  # per agent
OLD_PASSAGES = 30


async def _history(db: Database, name: str, cutoff: datetime) -> uuid.UUID:
    """An agent with 3 sessions of 40 old and 10 new messages, and 30 old and 5 new passages.

    The third session's last old message calls a tool answered after ``cutoff``:
    that answer would be left first in its session, so it goes too.
    """
    old, new = cutoff - timedelta(days=30), cutoff + timedelta(seconds=1)
    async with db.unit_of_work() as uow:
        agent = (await uow.agents.create(name)).id
        for number in range(3):
            chat = (await uow.sessions.create(agent, title=f"{name} chat {number}")).id
            rows: list[dict[str, Any]] = [
                {"role": "user", "content": f"old {n}", "created_at": old + timedelta(minutes=n)}
                for n in range(40)
            ]
            if number == 2:
                rows[-1] = {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": "c1", "function": {"name": "w"}}],
                    "created_at": old + timedelta(minutes=39),
                }
                rows.append(
                    {"role": "tool", "content": "sunny", "tool_call_id": "c1", "name": "w", "created_at": new}
                )
                rows += [{"role": "user", "content": f"new {n}", "created_at": new} for n in range(9)]
            else:
                rows += [{"role": "user", "content": f"new {n}", "created_at": new} for n in range(10)]
            await uow.messages.append(chat, rows)
        await uow.passages.add_many(
            agent,
            [
                {"text": f"old fact {n}", "embedding": [1.0, float(n)], "created_at": old}
                for n in range(OLD_PASSAGES)
            ]
            + [{"text": f"new fact {n}", "embedding": [0.0, float(n)], "created_at": new} for n in range(5)],
        )
    return agent


async def test_purge_older_than_one_agent_in_small_batches_matches_its_dry_run(db: Database) -> None:
    cutoff = utcnow() - timedelta(days=1)
    target = await _history(db, "historian", cutoff)
    bystander = await _history(db, "bystander", cutoff)
    before, bystander_before = await _state(db), await _state(db, bystander)

    dry = await purge_older_than(db, cutoff, agent="historian", batch=7, dry_run=True, reporter=Recorder([]))
    assert dry == Removed(messages=OLD_MESSAGES + 1, passages=OLD_PASSAGES)  # + the orphaned tool answer
    assert await _state(db) == before, "a dry run changed the database"

    reporter = Recorder([])
    removed = await purge_older_than(db, cutoff, agent="historian", batch=7, reporter=reporter)
    assert removed == dry
    assert reporter.started == {"messages": dry.messages, "passages": dry.passages}
    assert reporter.totals() == {"messages": dry.messages, "passages": dry.passages}
    assert len([rows for rows in reporter.advanced["messages"] if rows]) >= OLD_MESSAGES // 7
    assert all(rows <= 7 for rows in reporter.advanced["passages"])

    assert await _state(db, bystander) == bystander_before, "another agent's rows changed"
    async with db.unit_of_work(read_only=True) as uow:
        chats = (await uow.sessions.list(target)).items
        assert len(chats) == 3, "sessions stay, even emptied of old history"
        for chat in chats:
            stored = await uow.messages.window(chat.id, after_seq=0, limit=1000)
            assert [m.content for m in stored][:1] == ["new 0"]
            assert all(m.created_at >= cutoff for m in stored)
        assert {p.text for p in (await uow.passages.list(target, limit=100)).items} == {
            f"new fact {n}" for n in range(5)
        }
    assert await count_rows(db, "messages", agent_id=target) == 3 * 10 - 1
    assert await purge_older_than(db, cutoff, agent="historian", batch=7) == Removed()


# -- forget: no trace ---------------------------------------------------------------

SECRET = "xyzzyquokka"  # no other word starts with x, so FTS5 never prefix-compresses it away
KEPT = "wombatkept"
WHO = {"user_id": "u42"}
# One person among many: u42's rows fill a few pages of tables of hundreds, as a real erasure request would.
KEPT_MESSAGES = 12_000
KEPT_PASSAGES = 2_000
PADDING = "padding " * 20


async def _people(db: Database) -> Removed:
    """u7's data (with KEPT), then u42's (with SECRET) in the same shared agent; returns what u42 has.

    u7's bulk is scrubbed before u42's rows arrive (an established database,
    checkpointed and vacuumed), so u42's rows are the only recent writes.
    """
    async with db.unit_of_work() as uow:
        shared = (await uow.agents.create("support")).id
        kept = (await uow.sessions.create(shared, title=f"{KEPT} plans", meta={"user_id": "u7"})).id
        await uow.passages.add_many(
            shared,
            [
                {"text": f"{KEPT} fact {n}", "embedding": [0.0, float(n)], "meta": {"user_id": "u7"}}
                for n in range(KEPT_PASSAGES)
            ],
        )
    for start in range(0, KEPT_MESSAGES, 2000):
        async with db.unit_of_work() as uow:
            await uow.messages.append(
                kept,
                [{"role": "user", "content": f"{KEPT} {n} {PADDING}"} for n in range(start, start + 2000)],
            )
    await db.scrub()
    async with db.unit_of_work() as uow:
        own = (await uow.agents.create(f"{SECRET} bot", meta=WHO, core_memory={"human": SECRET})).id
        theirs = (await uow.sessions.create(shared, title=f"{SECRET} plans", meta=WHO)).id
        private = (await uow.sessions.create(own, title=f"{SECRET} private")).id
        for chat in (theirs, private):
            await uow.messages.append(
                chat, [{"role": "user", "content": f"{SECRET} {n} {PADDING}"} for n in range(30)]
            )
        # u42 speaking in u7's session: only that message goes.
        await uow.messages.append(kept, {"role": "user", "content": f"{SECRET} aside", "meta": WHO})
        await uow.passages.add_many(
            shared,
            [{"text": f"{SECRET} fact {n}", "embedding": [1.0, float(n)], "meta": WHO} for n in range(20)],
        )
        await uow.passages.add_many(
            own, [{"text": f"{SECRET} own {n}", "embedding": [1.0, 2.0]} for n in range(10)]
        )
    return Removed(agents=1, sessions=2, messages=2 * 30 + 1, passages=20 + 10)


@pytest.fixture
async def own_database(engine: str, store: Store) -> AsyncIterator[Database]:
    """Like ``db``, but on Postgres in a database of its own (with a schema, as ``db``).

    VACUUM keeps dead rows that any open transaction *in the same database*
    might still see; other tests running meanwhile in the shared database must
    not keep this test's dead rows alive.  Autovacuum is off for memorm's
    tables, so only the test's own scrub removes anything.
    """
    if engine == "sqlite":
        async with store.database() as database:
            await database.create_all()
            yield database
        return
    name = f"memorm_scrub_{uuid.uuid4().hex[:12]}"
    await admin_execute(f'CREATE DATABASE "{name}"')
    url = make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    try:
        admin = await asyncpg.connect(asyncpg_dsn(url))
        try:
            await admin.execute("CREATE EXTENSION IF NOT EXISTS vector SCHEMA public")
            await admin.execute("CREATE EXTENSION IF NOT EXISTS btree_gin SCHEMA public")
            await admin.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple SCHEMA public")
            await admin.execute("CREATE SCHEMA scrubbed")
        finally:
            await admin.close()
        database = Database(url, connect_args={"server_settings": {"search_path": "scrubbed,public"}})
        try:
            await database.create_all()
            async with database.engine.begin() as connection:  # dead rows stay until the test's VACUUM
                for table in TABLES:
                    await connection.exec_driver_sql(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
            yield database
        finally:
            await database.dispose()
    finally:
        await admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _files(db: Database) -> bytes:
    """The SQLite database file and its write-ahead log, as bytes."""
    path = Path(db.url.database or "")
    return b"".join(p.read_bytes() for p in (path, path.with_name(path.name + "-wal")) if p.exists())


async def _leftovers(db: Database) -> dict[str, tuple[int, int]]:
    """Per table (Postgres): dead row versions, and primary-key index entries beyond the live rows.

    The heap count alone can miss deleted rows: any scan prunes a full page's
    dead rows to bare line pointers, which pgstattuple does not count; their
    index entries stay until VACUUM cleans the indexes, so count those too.
    """
    found: dict[str, tuple[int, int]] = {}
    async with db.engine.connect() as connection:
        for table in TABLES:
            sql = (
                f"SELECT (SELECT dead_tuple_count FROM pgstattuple('{table}'::regclass)),"
                " (SELECT tuple_count + dead_tuple_count FROM pgstattuple(i.indexrelid::regclass))"
                f" - (SELECT count(*) FROM {table})"
                f" FROM pg_index i WHERE i.indrelid = '{table}'::regclass AND i.indisprimary"
            )
            dead, stale = (await connection.exec_driver_sql(sql)).one()
            found[table] = (int(dead), int(stale))
    return found


async def _check_forgotten(db: Database) -> None:
    async with db.unit_of_work(read_only=True) as uow:
        shared = await uow.agents.get_by_name("support")
        assert shared is not None
        assert (await uow.messages.search(shared.id, SECRET)).total == 0
        assert (await uow.messages.search(shared.id, KEPT)).total == KEPT_MESSAGES
        assert (await uow.passages.search_text(shared.id, SECRET)).total == 0
        assert (await uow.passages.search_text(shared.id, KEPT)).total == KEPT_PASSAGES
        assert await uow.agents.forget(WHO, dry_run=True) == Removed()


NONE_LEFT = dict.fromkeys(TABLES, (0, 0))


async def test_forget_leaves_no_trace_of_the_person(own_database: Database, engine: str) -> None:
    db = own_database
    expected = await _people(db)
    if engine == "sqlite":
        assert SECRET.encode() in _files(db)  # the probe finds the word while it is stored

    assert await forget(db, WHO, dry_run=True) == expected
    assert await forget(db, WHO) == expected  # the runner: delete, then scrub
    await _check_forgotten(db)
    if engine == "sqlite":
        files = _files(db)
        assert SECRET.encode() not in files, "the forgotten word is still in the database file or its WAL"
        assert KEPT.encode() in files  # kept data is found: the probe can succeed
    else:
        assert await _leftovers(db) == NONE_LEFT, "(dead rows, stale index entries) per table after scrub"


async def test_forget_without_scrub_leaves_traces_until_scrubbed(own_database: Database, engine: str) -> None:
    db = own_database
    expected = await _people(db)
    assert await forget(db, WHO, scrub=False) == expected
    await _check_forgotten(db)  # unreachable by queries at once
    if engine == "sqlite":
        assert SECRET.encode() in _files(db), "the WAL holds the old pages until a checkpoint"
    else:
        left = await _leftovers(db)
        assert left["messages"][1] == expected.messages  # every deleted message still indexed
        assert left["archival_passages"][1] == expected.passages
    await db.scrub()
    if engine == "sqlite":
        files = _files(db)
        assert SECRET.encode() not in files
        assert KEPT.encode() in files
    else:
        assert await _leftovers(db) == NONE_LEFT, "(dead rows, stale index entries) per table after scrub"


async def _index_bytes(db: Database, index: str) -> bytes:
    """The index's file as it is on disk (Postgres), after a checkpoint writes its pages out."""
    async with db.engine.connect() as connection:
        await connection.exec_driver_sql("CHECKPOINT")
        sql = f"SELECT pg_read_binary_file(pg_relation_filepath('{index}'))"
        data: bytes = (await connection.exec_driver_sql(sql)).scalar_one()
    return data


@pytest.mark.postgres
@pytest.mark.parametrize("engine", ["postgres"], indirect=True)
async def test_scrub_with_reindex_removes_the_words_from_the_full_text_index(
    own_database: Database, engine: str
) -> None:
    db = own_database
    expected = await _people(db)
    assert await forget(db, WHO) == expected
    # VACUUM empties the GIN posting lists, but the words stay as keys.
    assert SECRET.encode() in await _index_bytes(db, MESSAGES_FTS.gin_index)
    await db.scrub(reindex=True)
    rebuilt = await _index_bytes(db, MESSAGES_FTS.gin_index)
    assert SECRET.encode() not in rebuilt
    assert KEPT.encode() in rebuilt  # the probe finds what is still indexed
    await _check_forgotten(db)


async def test_a_purge_cancelled_at_any_moment_deletes_whole_sessions_and_a_rerun_finishes(
    db: Database,
) -> None:
    # Cancel the batched purge after ever longer delays: whatever it had
    # committed stays gone, the batch in flight rolls back whole, and no
    # session is ever left with part of its messages.
    now = utcnow()
    async with db.unit_of_work() as uow:
        agent = (await uow.agents.create("short-lived")).id
        sessions = [(await uow.sessions.create(agent, ttl=60)).id for _ in range(60)]
        for chat in sessions:
            await uow.messages.append(chat, [{"role": "user", "content": f"m {n}"} for n in range(20)])
    later = now + timedelta(minutes=5)
    reported = Recorder([])  # a batch is reported once committed, so the reports add up to 60
    cancelled = 0
    delay = 0.001
    while True:
        with anyio.move_on_after(delay) as scope:
            await purge_expired(db, now=later, batch=4, reporter=reported)
        async with db.unit_of_work(read_only=True) as uow:
            left = (await uow.sessions.list(agent, limit=100)).items
            sizes = {await uow.messages.count(chat.id) for chat in left}
        assert sizes <= {20}, f"a session lost part of its messages: {sizes}"
        assert await count_rows(db, "messages") == 20 * len(left)
        if not scope.cancelled_caught:
            break
        cancelled += 1
        delay *= 1.6
    assert cancelled >= 3  # the purge really was cut short, more than once
    assert reported.totals() == {"sessions": 60, "messages": 1200}
    assert left == []
    assert await count_rows(db, "sessions") == 0
