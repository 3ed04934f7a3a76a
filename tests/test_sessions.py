"""Sessions: an agent's conversations."""

from __future__ import annotations

import uuid

import anyio
import pytest
from conftest import count_rows

from memorm import ConflictError, Database, NotFoundError, ValidationError

pytestmark = pytest.mark.anyio


async def test_created_session_reads_back_with_its_agent_title_and_meta(db: Database) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("sam")
        chat = await uow.sessions.create(agent.id, title="first chat", meta={"channel": "web"})
        untitled = await uow.sessions.create(str(agent.id))
    async with db.unit_of_work() as uow:
        stored = await uow.sessions.get(chat.id)
        by_str = await uow.sessions.get(str(untitled.id))
    assert (stored.id, stored.agent_id, stored.title, stored.meta) == (
        chat.id,
        agent.id,
        "first chat",
        {"channel": "web"},
    )
    assert stored.next_seq == 1
    assert (by_str.agent_id, by_str.title, by_str.meta) == (agent.id, None, {})


async def test_list_pages_one_agents_sessions_oldest_first(db: Database) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("sam")
        other = await uow.agents.create("max")
        ids = []
        for i in range(5):
            ids.append((await uow.sessions.create(agent.id, title=f"chat {i}")).id)
            await uow.sessions.create(other.id)
    async with db.unit_of_work() as uow:
        first = await uow.sessions.list(agent.id, limit=2)
        rest = await uow.sessions.list(agent.id, limit=10, offset=2)
        others = await uow.sessions.list(other.id)
        nobody = await uow.sessions.list(uuid.uuid4())
    assert [s.id for s in first.items] + [s.id for s in rest.items] == ids
    assert (first.total, rest.total, others.total) == (5, 5, 5)
    assert all(s.agent_id == other.id for s in others.items)
    assert (nobody.items, nobody.total) == ([], 0)


async def test_delete_session_removes_its_messages_only(db: Database) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("sam")
        doomed = await uow.sessions.create(agent.id)
        kept = await uow.sessions.create(agent.id)
        await uow.messages.append(doomed.id, [{"role": "user", "content": "bye"}] * 4)
        await uow.messages.append(kept.id, [{"role": "user", "content": "stay"}] * 2)
    async with db.unit_of_work() as uow:
        await uow.sessions.delete(doomed.id)
    assert await count_rows(db, "messages", session_id=doomed.id) == 0
    assert await count_rows(db, "messages", session_id=kept.id) == 2
    assert await count_rows(db, "sessions") == 1
    async with db.unit_of_work() as uow:
        with pytest.raises(NotFoundError):
            await uow.sessions.get(doomed.id)
        with pytest.raises(NotFoundError):
            await uow.sessions.delete(doomed.id)
        assert (await uow.agents.get(agent.id)).name == "sam"


async def test_create_session_for_unknown_agent_raises_not_found_and_writes_nothing(db: Database) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("sam")
        with pytest.raises(NotFoundError):
            await uow.sessions.create(uuid.uuid4(), title="orphan")
        # The unit of work is still usable after the failed create.
        kept = await uow.sessions.create(agent.id)
    assert await count_rows(db, "sessions") == 1
    async with db.unit_of_work() as uow:
        assert (await uow.sessions.get(kept.id)).agent_id == agent.id


async def test_get_unknown_session_raises_not_found(db: Database) -> None:
    async with db.unit_of_work() as uow:
        with pytest.raises(NotFoundError):
            await uow.sessions.get(uuid.uuid4())


@pytest.mark.parametrize("bad_id", [42, "not-a-uuid"])
async def test_session_ids_of_the_wrong_type_raise_validation_error(db: Database, bad_id: object) -> None:
    async with db.unit_of_work() as uow:
        with pytest.raises(ValidationError):
            await uow.sessions.get(bad_id)  # type: ignore[arg-type]
        with pytest.raises(ValidationError):
            await uow.sessions.delete(bad_id)  # type: ignore[arg-type]
        with pytest.raises(ValidationError):
            await uow.sessions.list(bad_id)  # type: ignore[arg-type]


@pytest.mark.parametrize("fields", [{"title": 7}, {"meta": ["not", "a", "dict"]}, {"meta": {"k": {1, 2}}}])
async def test_create_session_with_bad_fields_raises_validation_error_and_writes_nothing(
    db: Database, fields: dict[str, object]
) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("sam")
        with pytest.raises(ValidationError):
            await uow.sessions.create(agent.id, **fields)  # type: ignore[arg-type]
    assert await count_rows(db, "sessions") == 0


async def test_get_or_create_returns_one_session_per_key_even_under_concurrency(db: Database) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("keys")
        other = await uow.agents.create("other-keys")

    async def get_or_create(agent_id: uuid.UUID) -> uuid.UUID:
        async with db.unit_of_work() as uow:
            return (await uow.sessions.get_or_create(agent_id, "thread-1", title="t")).id

    ids: list[uuid.UUID] = []

    async def collect() -> None:
        ids.append(await get_or_create(agent.id))

    async with anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(collect)
    assert len(set(ids)) == 1
    theirs = await get_or_create(other.id)  # keys are per agent
    assert theirs != ids[0]
    async with db.unit_of_work() as uow:
        found = await uow.sessions.get_by_key(agent.id, "thread-1")
        assert found is not None
        assert (found.id, found.key) == (ids[0], "thread-1")
        assert await uow.sessions.get_by_key(agent.id, "thread-2") is None
        assert (await uow.sessions.list(agent.id)).total == 1


async def test_creating_a_session_with_a_taken_key_conflicts_and_writes_nothing(db: Database) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("taken")
        await uow.sessions.create(agent.id, key="k")
    async with db.unit_of_work() as uow:
        with pytest.raises(ConflictError):
            await uow.sessions.create(agent.id, key="k")
        with pytest.raises(ValidationError):
            await uow.sessions.get_or_create(agent.id, "")
        assert (await uow.sessions.list(agent.id)).total == 1
