"""Deleting beside live writers: forget and delete_before lock in the writers' order, so nobody deadlocks.

On Postgres a deadlock aborts one side with a ``ConflictError`` ("deadlock
detected"); on SQLite writers queue for the one write lock, so these tests pin
the same outcome there by construction.

Where a writer must be mid-transaction while the deletion starts, it does not
sleep and hope: it waits until the deletion is seen queued behind the lock it
holds (:func:`_until_waiting_behind`), so the race is provoked every run, or
the test fails.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import anyio
import pytest
import sqlalchemy as sa

from memorm import Database, NotFoundError, UnitOfWork
from memorm.types import utcnow

pytestmark = pytest.mark.anyio

ROUNDS = 8
HANG_GUARD_S = 60  # turns a deletion that never queues behind the writer into a failure


async def _waiting_behind(uow: UnitOfWork) -> int:
    """How many others wait for a lock this unit of work holds."""
    if uow.backend.distributed:  # the waits are on the workers: Citus's view of the whole cluster
        waiting = await uow.session.scalar(
            sa.text("SELECT count(*) FROM citus_lock_waits WHERE blocking_gpid = citus_backend_gpid()")
        )
        return int(waiting or 0)
    if uow.backend.dialect == "postgresql":
        # pg_locks and pg_blocking_pids are live (pg_stat_activity is a per-transaction snapshot).
        waiting = await uow.session.scalar(
            sa.text(
                "SELECT count(*) FROM pg_locks "
                "WHERE NOT granted AND pg_backend_pid() = ANY(pg_blocking_pids(pid))"
            )
        )
        return int(waiting or 0)
    # SQLite: this process's writers queue for the one write lock, which a writing unit of work holds.
    assert uow.backend.writer_lock is not None
    return uow.backend.writer_lock.waiting()


async def _until_waiting_behind(uow: UnitOfWork) -> None:
    """Return once another unit of work is blocked on a lock ``uow`` holds."""
    with anyio.fail_after(HANG_GUARD_S):
        # A poll, not a bet on timing: it ends on what it sees.  No event can stand in
        # for it: the state is in the server's lock table (or inside the writer lock).
        while not await _waiting_behind(uow):  # noqa: ASYNC110
            await anyio.sleep(0.005)


async def _person(db: Database, n: int) -> tuple[uuid.UUID, uuid.UUID]:
    """A shared agent with the person's session (50 messages) and 20 passages about them."""
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create(f"shared-{n}")
        chat = await uow.sessions.create(agent.id, meta={"user_id": f"u{n}"})
        await uow.messages.append(chat.id, [{"role": "user", "content": f"m {i}"} for i in range(50)])
        await uow.passages.add_many(
            agent.id,
            [
                {"text": f"p {i}", "embedding": [1.0, float(i)], "meta": {"user_id": f"u{n}"}}
                for i in range(20)
            ],
        )
    return agent.id, chat.id


async def _race(db: Database, n: int) -> None:
    """Forget person ``n`` while two trims and two passage deletes run on the same rows."""
    agent_id, chat_id = await _person(db, n)
    async with db.unit_of_work(read_only=True) as uow:
        passage_ids = [p.id for p in (await uow.passages.list(agent_id, limit=20)).items]
    outcomes: list[str] = []

    async def trim() -> None:
        try:
            async with db.unit_of_work() as uow:
                await uow.messages.trim(chat_id, keep_last=10)
            outcomes.append("trimmed")
        except NotFoundError:
            outcomes.append("gone")

    async def prune() -> None:
        async with db.unit_of_work() as uow:
            await uow.passages.delete_many(agent_id, passage_ids[:10])
        outcomes.append("pruned")

    async def forget() -> None:
        async with db.unit_of_work() as uow:
            await uow.agents.forget({"user_id": f"u{n}"})
        outcomes.append("forgot")

    async with anyio.create_task_group() as group:  # a ConflictError (deadlock) would fail here
        for task in (trim, prune, forget, trim, prune):
            group.start_soon(task)
    assert sorted(outcomes)[0] == "forgot"
    assert outcomes.count("pruned") == 2
    assert len(outcomes) == 5
    async with db.unit_of_work(read_only=True) as uow:
        assert await uow.passages.count(agent_id) == 0
        with pytest.raises(NotFoundError):
            await uow.sessions.get(chat_id)


async def test_forget_beside_trims_and_passage_deletes_never_deadlocks(db: Database) -> None:
    # trim locks the session, then deletes messages; delete_many locks the agent,
    # then deletes passages.  A forget deleting rows first and locking parents
    # second would wait on them while they wait on it.
    for n in range(ROUNDS):
        await _race(db, n)


async def test_forget_waits_for_a_writer_holding_the_session_instead_of_deadlocking(db: Database) -> None:
    # The writer locks the session (an append), and only later deletes messages (a trim).
    # A forget that deleted the messages before locking the session would hold rows
    # the writer needs while waiting for the session the writer holds.
    agent_id, chat_id = await _person(db, 0)
    locked = anyio.Event()
    order: list[str] = []

    async def writer() -> None:
        async with db.unit_of_work() as uow:
            await uow.messages.append(chat_id, {"role": "user", "content": "one more"})
            locked.set()
            await _until_waiting_behind(uow)  # forget is blocked on the session this holds
            await uow.messages.trim(chat_id, keep_last=5)
        order.append("writer")

    async def forget() -> None:
        await locked.wait()
        async with db.unit_of_work() as uow:
            removed = await uow.agents.forget({"user_id": "u0"})
        order.append("forget")
        assert (removed.sessions, removed.messages, removed.passages) == (1, 5, 20)

    async with anyio.create_task_group() as group:
        group.start_soon(writer)
        group.start_soon(forget)
    assert order == ["writer", "forget"]
    assert await _left(db, agent_id) == 0


async def _left(db: Database, agent_id: uuid.UUID) -> int:
    async with db.unit_of_work(read_only=True) as uow:
        return await uow.passages.count(agent_id) + (await uow.sessions.list(agent_id)).total


async def test_delete_before_waits_for_a_writer_holding_the_session(db: Database) -> None:
    # delete_before locks the sessions it deletes from first, as appends and trims
    # do; deleting rows straight away instead let a concurrent trim, deleting the
    # same rows in another order, deadlock with it (Postgres: about 1 run in 15).
    now = utcnow()
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("aging")
        chat = await uow.sessions.create(agent.id)
        old = [
            {"role": "user", "content": f"m {n}", "created_at": now - timedelta(days=9)} for n in range(50)
        ]
        await uow.messages.append(chat.id, old)
    locked = anyio.Event()
    order: list[str] = []

    async def writer() -> None:
        async with db.unit_of_work() as uow:
            await uow.messages.append(chat.id, {"role": "user", "content": "new"})
            locked.set()
            await _until_waiting_behind(uow)  # delete_before is blocked on the session this holds
            assert await uow.messages.trim(chat.id, keep_last=11) == 40
        order.append("writer")

    async def aging() -> None:
        await locked.wait()
        async with db.unit_of_work() as uow:
            assert await uow.messages.delete_before(agent.id, now - timedelta(days=1)) == 10
        order.append("delete_before")

    async with anyio.create_task_group() as group:
        group.start_soon(writer)
        group.start_soon(aging)
    assert order == ["writer", "delete_before"]
    async with db.unit_of_work(read_only=True) as uow:
        assert [m.content for m in await uow.messages.window(chat.id)] == ["new"]
