"""clear, pop, get_many, delete_many and Database.clone: the operations adapters build on."""

from __future__ import annotations

import uuid

import anyio
import pytest
from conftest import Store

from memorm import Database

pytestmark = pytest.mark.anyio


async def _session(db: Database, messages: int) -> tuple[object, object]:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("extras")
        chat = await uow.sessions.create(agent.id)
        await uow.messages.append(chat.id, {"role": "system", "content": "sys"})
        await uow.messages.append(chat.id, [{"role": "user", "content": f"m{i}"} for i in range(messages)])
    return agent.id, chat.id


async def test_clear_deletes_every_message_and_restarts_numbering(db: Database) -> None:
    agent_id, chat = await _session(db, 5)
    async with db.unit_of_work() as uow:
        assert await uow.messages.clear(chat) == 6
        [first] = await uow.messages.append(chat, {"role": "user", "content": "again"})
        assert first.seq == 1
        assert (await uow.messages.search(agent_id, "m3")).total == 0


async def test_pop_returns_the_newest_and_concurrent_pops_never_share_one(db: Database) -> None:
    _, chat = await _session(db, 10)
    popped: list[str] = []

    async def pop() -> None:
        async with db.unit_of_work() as uow:
            message = await uow.messages.pop(chat)
            if message is not None:
                popped.append(message.content)

    async with anyio.create_task_group() as tg:
        for _ in range(14):
            tg.start_soon(pop)
    assert sorted(popped) == sorted(["sys", *(f"m{i}" for i in range(10))])
    async with db.unit_of_work() as uow:
        assert await uow.messages.pop(chat) is None
        [again] = await uow.messages.append(chat, {"role": "user", "content": "x"})
        assert again.seq == 1


async def test_get_many_keeps_the_given_order_and_delete_many_stays_in_the_agent(db: Database) -> None:
    async with db.unit_of_work() as uow:
        mine = await uow.agents.create("mine")
        theirs = await uow.agents.create("theirs")
        passages = await uow.passages.add_many(
            mine.id, [{"text": f"p{i}", "embedding": [1.0, i]} for i in range(5)]
        )
        [other] = await uow.passages.add_many(theirs.id, [{"text": "o", "embedding": [1.0, 0.0]}])
    ids = [p.id for p in passages]
    async with db.unit_of_work() as uow:
        got = await uow.passages.get_many([ids[3], ids[0], other.id, ids[4]])
        assert [p.text for p in got] == ["p3", "p0", "o", "p4"]
        assert await uow.passages.delete_many(mine.id, [ids[1], ids[2], other.id]) == 2
    async with db.unit_of_work() as uow:
        assert await uow.passages.count(mine.id) == 3
        assert await uow.passages.count(theirs.id) == 1  # another agent's id was ignored


async def test_clone_opens_the_same_database_with_the_same_options(db: Database, store: Store) -> None:
    async with db.unit_of_work() as uow:
        await uow.agents.create("seen by the clone")
    clone = db.clone()
    try:
        assert clone.url == db.url
        assert clone.token_counter is db.token_counter
        async with clone.unit_of_work() as uow:
            assert await uow.agents.get_by_name("seen by the clone") is not None
    finally:
        await clone.dispose()


async def test_delete_many_of_unknown_ids_leaves_the_archive_version_alone(db: Database) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("versions")
        await uow.passages.add(agent.id, "kept", [1.0, 0.0])
    async with db.unit_of_work() as uow:
        before = (await uow.agents.get(agent.id)).archive_version
        assert await uow.passages.delete_many(agent.id, [uuid.uuid4()]) == 0
    async with db.unit_of_work() as uow:
        uow.session.expire_all()
        assert (await uow.agents.get(agent.id)).archive_version == before
