"""The unit of work: one transaction that commits on clean exit and rolls back otherwise."""

from __future__ import annotations

import sqlite3
import uuid

import anyio
import pytest
import sqlalchemy as sa
from conftest import Store, count_rows
from sqlalchemy.engine import make_url

from memorm import Database, SchemaError
from memorm.errors import DatabaseError, MemormError
from memorm.tenancy import DEFAULT_TENANT
from memorm.uow import UnitOfWork

pytestmark = pytest.mark.anyio


class Boom(Exception):
    """The user's own error, raised inside a unit of work."""


async def _table_counts(db: Database) -> list[int]:
    return [await count_rows(db, t) for t in ("agents", "sessions", "messages", "archival_passages")]


async def test_clean_exit_commits_every_repositorys_writes(db: Database) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("sam")
        chat = await uow.sessions.create(agent.id)
        await uow.messages.append(chat.id, {"role": "user", "content": "hi"})
        await uow.passages.add(agent.id, "fact", [1.0, 0.0])
    assert await _table_counts(db) == [1, 1, 1, 1]


async def test_exception_in_the_body_rolls_back_every_repository_call(db: Database) -> None:
    async with db.unit_of_work() as uow:
        existing = await uow.agents.create("existing")
        existing_chat = await uow.sessions.create(existing.id)

    async def failing_unit() -> None:
        async with db.unit_of_work() as uow:
            agent = await uow.agents.create("sam")
            chat = await uow.sessions.create(agent.id)
            await uow.messages.append(existing_chat.id, {"role": "user", "content": "lost"})
            await uow.agents.update(existing.id, system="lost")
            await uow.passages.add(agent.id, "lost", [1.0])
            raise Boom  # user code fails between repository calls
            await uow.messages.append(chat.id, {"role": "user"})  # never reached

    with pytest.raises(Boom):
        await failing_unit()
    assert await _table_counts(db) == [1, 1, 0, 0]
    async with db.unit_of_work() as uow:
        assert await uow.agents.get_by_name("sam") is None
        kept = await uow.agents.get(existing.id)
        assert (kept.system, kept.version) == ("", 1)
        assert (await uow.sessions.get(existing_chat.id)).next_seq == 1


async def test_explicit_commit_keeps_its_part_when_the_body_later_raises(db: Database) -> None:
    async def failing_unit() -> None:
        async with db.unit_of_work() as uow:
            kept = await uow.agents.create("kept")
            await uow.commit()
            await uow.agents.create("lost")
            await uow.sessions.create(kept.id)
            raise Boom

    with pytest.raises(Boom):
        await failing_unit()
    async with db.unit_of_work() as uow:
        page = await uow.agents.list()
    assert [a.name for a in page.items] == ["kept"]
    assert await count_rows(db, "sessions") == 0


async def test_explicit_rollback_discards_writes_since_the_last_commit(db: Database) -> None:
    async with db.unit_of_work() as uow:
        first_id = (await uow.agents.create("first")).id
        await uow.commit()
        await uow.agents.create("discarded")
        # The rollback expires the objects this update refreshed, so keep the plain id.
        await uow.agents.update(first_id, system="discarded")
        await uow.rollback()
        await uow.agents.create("after")  # the unit of work stays usable
    async with db.unit_of_work() as uow:
        names = sorted(a.name for a in (await uow.agents.list()).items)
        assert (await uow.agents.get(first_id)).system == ""
    assert names == ["after", "first"]


async def test_cancelled_unit_of_work_rolls_back_and_returns_its_connection(db: Database) -> None:
    written = anyio.Event()

    async def worker() -> None:
        async with db.unit_of_work() as uow:
            agent = await uow.agents.create("cancelled")
            await uow.sessions.create(agent.id)
            written.set()
            await anyio.sleep_forever()

    async with anyio.create_task_group() as tg:
        tg.start_soon(worker)
        await written.wait()
        assert db.engine.pool.checkedout() == 1
        tg.cancel_scope.cancel()

    assert db.engine.pool.checkedout() == 0
    assert await _table_counts(db) == [0, 0, 0, 0]
    async with db.unit_of_work() as uow:  # the database is still writable
        await uow.agents.create("cancelled")
    assert await count_rows(db, "agents") == 1


async def _assert_nothing_holds_a_write_lock(db: Database, store: Store) -> None:
    if db.dialect == "sqlite":
        probe = sqlite3.connect(make_url(store.url).database or "", timeout=0, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")  # "database is locked" if a lost connection holds the lock
            probe.execute("ROLLBACK")
        finally:
            probe.close()
    else:
        async with db.unit_of_work() as uow:
            await uow.session.execute(sa.text("SELECT id FROM sessions FOR UPDATE NOWAIT"))


@pytest.mark.single_node  # its probe locks every session with one FOR UPDATE
async def test_cancelling_mid_statement_never_leaves_the_database_locked(db: Database, store: Store) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("sam")
        chat = await uow.sessions.create(agent.id)
    # Regression: on SQLite a cancelled BEGIN IMMEDIATE once kept the write lock for good,
    # usually within the first 20 attempts.
    for attempt in range(60):
        # Cancel at a different point of the unit of work each time.
        with anyio.move_on_after(attempt * 0.0002):
            async with db.unit_of_work() as uow:
                while True:
                    await uow.messages.append(chat.id, [{"role": "user"}] * 20)
        await anyio.sleep(0.005)
        assert db.engine.pool.checkedout() == 0
        await _assert_nothing_holds_a_write_lock(db, store)
    async with db.unit_of_work() as uow:
        assert await uow.messages.count(chat.id) == 0
        assert (await uow.sessions.get(chat.id)).next_seq == 1


async def test_uncommitted_writes_are_invisible_and_readers_do_not_wait_for_writers(db: Database) -> None:
    async with db.unit_of_work() as uow:
        await uow.agents.create("committed")
    written, read = anyio.Event(), anyio.Event()
    seen: list[str] = []

    async def writer() -> None:
        async with db.unit_of_work() as uow:
            await uow.agents.create("uncommitted")
            written.set()
            await read.wait()

    async def reader() -> None:
        await written.wait()
        with anyio.fail_after(5):
            async with db.unit_of_work(read_only=True) as uow:
                seen.extend(a.name for a in (await uow.agents.list()).items)
        read.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(writer)
        tg.start_soon(reader)
    assert seen == ["committed"]
    assert await count_rows(db, "agents") == 2


async def test_unit_of_work_cannot_be_entered_twice_at_once(db: Database) -> None:
    uow = db.unit_of_work()
    async with uow:
        with pytest.raises(RuntimeError, match="already open"):
            await uow.__aenter__()
        await uow.agents.create("sam")
    assert await count_rows(db, "agents") == 1


async def test_database_without_the_schema_raises_schema_error_naming_the_upgrade_command(
    store: Store,
) -> None:
    async with store.database() as db:
        with pytest.raises(SchemaError, match="memorm db upgrade"):
            async with db.unit_of_work() as uow:
                await uow.agents.create("sam")
        with pytest.raises(SchemaError, match="memorm db upgrade"):
            async with db.unit_of_work(read_only=True) as uow:
                await uow.agents.list()
        assert await db.current_revision() is None
        assert db.engine.pool.checkedout() == 0


async def test_a_second_database_on_the_same_store_sees_committed_writes(db: Database, store: Store) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("sam")
        chat = await uow.sessions.create(agent.id)
        await uow.messages.append(chat.id, {"role": "user", "content": "hi"})
    async with store.database() as other, other.unit_of_work() as uow:
        assert (await uow.agents.get(agent.id)).name == "sam"
        assert [m.content for m in await uow.messages.window(chat.id)] == ["hi"]
        await uow.messages.append(chat.id, {"role": "assistant", "content": "hello"})
    async with db.unit_of_work() as uow:
        assert [(m.seq, m.content) for m in await uow.messages.window(chat.id)] == [(1, "hi"), (2, "hello")]


async def _commit_will_fail(uow: UnitOfWork, store: Store) -> None:
    """Arrange for this unit of work's COMMIT to fail in the database (a check deferred to COMMIT)."""
    if store.engine == "sqlite":
        await uow.session.execute(sa.text("PRAGMA defer_foreign_keys = ON"))
        await uow.session.execute(
            sa.text(
                "INSERT INTO sessions (id, agent_id, next_seq, created_at, updated_at, meta) VALUES "
                "('0' , 'nobody', 1, '2026-01-01 00:00:00.000000', '2026-01-01 00:00:00.000000', '{}')"
            )
        )
        return
    await uow.session.execute(
        sa.text(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'refused at commit' USING ERRCODE = '23514'; END $$"
        )
    )
    await uow.session.execute(
        sa.text(
            "CREATE CONSTRAINT TRIGGER refuse AFTER UPDATE ON agents DEFERRABLE INITIALLY DEFERRED "
            "FOR EACH ROW EXECUTE FUNCTION refuse()"
        )
    )


@pytest.mark.owner  # DDL, or plans that differ under row-level security
@pytest.mark.single_node  # a deferred trigger fails the commit: no triggers on Citus's tables
async def test_leaving_a_unit_of_work_whose_commit_failed_rolls_back_and_raises(
    db: Database, store: Store
) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("steady", system="before")
    with pytest.raises(DatabaseError, match="failed"):  # noqa: PT012
        async with db.unit_of_work() as uow:
            await _commit_will_fail(uow, store)
            await uow.agents.update(agent.id, system="after")
            with pytest.raises(MemormError):
                await uow.commit()
            # The caller carries on and leaves the block normally: no second COMMIT, no raw error.
    assert db.engine.pool.checkedout() == 0
    async with db.unit_of_work(read_only=True) as uow:
        assert (await uow.agents.get(agent.id)).system == "before"
        assert await uow.session.scalar(sa.text("SELECT count(*) FROM sessions")) == 0


async def test_the_chat_path_sends_only_its_own_statements_and_builds_no_orm_session(db: Database) -> None:
    """An append is BEGIN, the counter and the insert (one statement on Postgres), COMMIT; a
    read-only window or context is one SELECT (plus BEGIN/COMMIT under row-level security,
    which sets the tenant).  None of them makes a SQLAlchemy session."""
    from memorm.testing import capture_statements

    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("statements")
        chat = await uow.sessions.create(agent.id)
        await uow.messages.append(chat.id, [{"role": "user", "content": f"m{i}"} for i in range(5)])
    rls = db.dialect == "postgresql" and not db.bypasses_rls
    with capture_statements(db) as sent:
        async with db.unit_of_work() as uow:
            await uow.messages.append(chat.id, {"role": "user", "content": "one more"})
            assert not uow.link.has_session
    kinds = [statement.split()[0].upper() for statement, _ in sent]
    if db.dialect == "sqlite" or db.distributed:
        assert kinds == ["BEGIN", "UPDATE", "INSERT", "COMMIT"], sent
    else:  # the counter's UPDATE feeds the INSERT: one statement
        assert kinds == ["BEGIN", "WITH", "COMMIT"], sent
    for read in ("window", "context"):
        with capture_statements(db) as sent:
            async with db.unit_of_work(read_only=True) as uow:
                if read == "window":
                    found = await uow.messages.window(chat.id, limit=3)
                else:
                    found = await uow.messages.context(chat.id, max_tokens=1_000)
                assert not uow.link.has_session
        kinds = [statement.split()[0].upper() for statement, _ in sent]
        assert kinds == (["BEGIN", kinds[1], "COMMIT"] if rls else [kinds[0]]), (read, sent)
        assert kinds[1 if rls else 0] in ("SELECT", "WITH"), (read, sent)
        assert [m.content for m in found][-1] == "one more"


async def test_uow_session_is_made_on_demand_and_shares_the_transaction(db: Database) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("on-demand")
        chat = await uow.sessions.create(agent.id)
        await uow.messages.append(chat.id, {"role": "user", "content": "seen"})
        count = await uow.session.scalar(sa.text("SELECT count(*) FROM messages WHERE content = 'seen'"))
        assert count == 1  # the session runs in the unit of work's transaction
        assert uow.link.has_session
        await uow.rollback()
    async with db.unit_of_work(read_only=True) as uow:
        assert await uow.session.scalar(sa.text("SELECT count(*) FROM messages")) == 0


async def test_a_restarted_server_reads_a_sessions_messages_by_agent(db: Database, store: Store) -> None:
    """A Database that did not make the session (another process, or this one restarted) looks
    its agent up once, then names it in every statement on the session's messages: their
    indexes lead with (tenant, agent_id), and without it a window reads the tenant's every row."""
    from memorm.testing import capture_statements

    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("restarted")
        chat = await uow.sessions.create(agent.id)
        await uow.messages.append(chat.id, [{"role": "user", "content": f"m{i}"} for i in range(5)])
    restarted = store.database()
    try:
        reads = {
            "window": lambda uow: uow.messages.window(chat.id, limit=3),
            "context": lambda uow: uow.messages.context(chat.id, max_tokens=1_000),
            "count": lambda uow: uow.messages.count(chat.id),
        }
        for turn in range(2):
            for name, read in reads.items():
                with capture_statements(restarted) as sent:
                    async with restarted.unit_of_work(read_only=True) as uow:
                        assert await read(uow), name
                on_messages = [sql for sql, _ in sent if "FROM messages" in sql]
                lookups = [sql for sql, _ in sent if "FROM messages" not in sql and "FROM sessions" in sql]
                assert on_messages, (name, sent)
                assert all("agent_id =" in sql for sql in on_messages), (name, sent)
                # The agent is looked up on the session's first call only, then remembered.
                assert len(lookups) == (1 if (turn, name) == (0, "window") else 0), (name, sent)
    finally:
        await restarted.dispose()
    appender = store.database()  # an append, which finds the session by its key, remembers its agent
    try:
        async with appender.unit_of_work() as uow:
            await uow.messages.append(chat.id, {"role": "user", "content": "one more"})
        assert appender.backend.session_agents.get(DEFAULT_TENANT, chat.id) == agent.id
    finally:
        await appender.dispose()


@pytest.mark.parametrize("engine", ["postgres"], indirect=True)
async def test_a_deadlock_is_a_transient_conflict_and_the_other_unit_of_work_goes_through(
    db: Database,
) -> None:
    from memorm.errors import ConflictError
    from memorm.translate import transient

    async with db.unit_of_work() as uow:
        first, second = (await uow.agents.create("left")).id, (await uow.agents.create("right")).id
    holding = [anyio.Event(), anyio.Event()]
    outcomes: list[BaseException | None] = [None, None]

    async def rename(index: int, order: tuple[uuid.UUID, uuid.UUID]) -> None:
        try:
            async with db.unit_of_work() as uow:
                for step, agent in enumerate(order):
                    await uow.agents.update(agent, name=f"by-{index}-{step}")
                    if step == 0:
                        holding[index].set()
                        await holding[1 - index].wait()  # each holds one row and wants the other's
        except ConflictError as error:
            outcomes[index] = error

    async with anyio.create_task_group() as tg:
        tg.start_soon(rename, 0, (first, second))
        tg.start_soon(rename, 1, (second, first))
    failed = [outcome for outcome in outcomes if outcome is not None]
    assert len(failed) == 1  # Postgres aborts one of the two
    assert "deadlock" in str(failed[0])
    assert transient(failed[0])
    assert not transient(ConflictError("a stale version"))
    async with db.unit_of_work(read_only=True) as uow:
        names = {(await uow.agents.get(agent)).name for agent in (first, second)}  # type: ignore[union-attr]
    winner = outcomes.index(None)
    assert names == {f"by-{winner}-0", f"by-{winner}-1"}


async def test_repositories_are_made_on_first_use_and_anew_for_each_entry(db: Database) -> None:
    uow = db.unit_of_work()
    with pytest.raises(RuntimeError, match="not open"):
        _ = uow.agents
    async with uow:
        agents = uow.agents
        assert uow.agents is agents  # one repository per unit of work
        assert "messages" not in vars(uow)  # not made until used
        await agents.create("first")
    async with uow:  # entered again: a new connection, so new repositories on it
        assert uow.agents is not agents
        assert uow.agents.link is uow.link
        assert (await uow.agents.get_by_name("first")) is not None


async def test_bypasses_rls_is_never_guessed_before_the_role_is_looked_up(db: Database) -> None:
    # Until the first unit of work it read False, even for a superuser: a start-up
    # check "am I under row-level security?" passed when it should not have.
    if db.dialect == "postgresql":
        async with db.engine.connect() as connection:
            exempt = bool(
                await connection.scalar(
                    sa.text("SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user")
                )
            )
    for learn in ("unit of work", "check_schema"):
        fresh = db.clone()  # its own state: nothing looked up yet
        try:
            if db.dialect == "sqlite":
                assert fresh.bypasses_rls is False  # no row-level security: known without a look
                continue
            view = fresh.for_tenant("acme")
            for unknown in (fresh, view):
                with pytest.raises(MemormError, match=r"not known yet.*check_schema"):
                    _ = unknown.bypasses_rls
            if learn == "unit of work":
                async with view.unit_of_work(read_only=True) as uow:
                    await uow.agents.get_by_name("nobody")
            else:
                await fresh.check_schema()
            assert fresh.bypasses_rls is exempt
            assert view.bypasses_rls is exempt  # a tenant's view shares what its database learned
        finally:
            await fresh.dispose()
