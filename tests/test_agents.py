"""Agents: create, read, page, optimistic updates, unique names, cascading delete."""

from __future__ import annotations

import uuid

import pytest
from conftest import count_rows

from memorm import ConflictError, Database, NotFoundError, ValidationError

pytestmark = pytest.mark.anyio


async def test_created_agent_reads_back_by_id_and_by_name(db: Database) -> None:
    async with db.unit_of_work() as uow:
        created = await uow.agents.create(
            "sam",
            system="You are Sam.",
            core_memory={"persona": "helpful", "human": "Ada"},
            llm_config={"model": "gpt-x", "temperature": 0.2},
            meta={"team": "red"},
        )
    assert created.version == 1
    async with db.unit_of_work() as uow:
        by_id = await uow.agents.get(created.id)
        by_name = await uow.agents.get_by_name("sam")
        missing = await uow.agents.get_by_name("nobody")
    assert by_name is not None
    assert by_name.id == by_id.id == created.id
    assert by_id.name == "sam"
    assert by_id.system == "You are Sam."
    assert by_id.core_memory == {"persona": "helpful", "human": "Ada"}
    assert by_id.llm_config == {"model": "gpt-x", "temperature": 0.2}
    assert by_id.meta == {"team": "red"}
    assert by_id.version == 1
    assert missing is None


async def test_list_pages_agents_oldest_first_with_true_total(db: Database) -> None:
    async with db.unit_of_work() as uow:
        names = [f"agent-{i:02d}" for i in range(7)]
        ids = [(await uow.agents.create(name)).id for name in names]
    async with db.unit_of_work() as uow:
        first = await uow.agents.list(limit=3)
        middle = await uow.agents.list(limit=3, offset=3)
        last = await uow.agents.list(limit=3, offset=6)
        past_end = await uow.agents.list(limit=3, offset=10)
    assert [a.id for a in first.items] == ids[:3]
    assert [a.id for a in middle.items] == ids[3:6]
    assert [a.id for a in last.items] == ids[6:]
    assert past_end.items == []
    assert {first.total, middle.total, last.total, past_end.total} == {7}
    assert (first.limit, first.offset, middle.offset) == (3, 0, 3)
    assert first.has_more
    assert not last.has_more


@pytest.mark.parametrize(("limit", "offset"), [(0, 0), (1001, 0), (10, -1), ("5", 0)])
async def test_list_rejects_bad_page_bounds(db: Database, limit: object, offset: object) -> None:
    async with db.unit_of_work() as uow:
        with pytest.raises(ValidationError):
            await uow.agents.list(limit=limit, offset=offset)  # type: ignore[arg-type]


async def test_every_update_bumps_version_and_changes_fields(db: Database) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("sam", system="v1")
    async with db.unit_of_work() as uow:
        updated = await uow.agents.update(agent.id, system="v2")
        assert updated.version == 2
        updated = await uow.agents.update(agent.id, name="samantha", meta={"k": [1, 2]})
        assert updated.version == 3
    async with db.unit_of_work() as uow:
        stored = await uow.agents.get(agent.id)
    assert (stored.name, stored.system, stored.meta, stored.version) == ("samantha", "v2", {"k": [1, 2]}, 3)
    assert stored.updated_at >= agent.updated_at


async def test_update_with_stale_expected_version_conflicts_and_changes_nothing(db: Database) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("sam", system="original")
        await uow.agents.update(agent.id, system="second")  # now at version 2
    async with db.unit_of_work() as uow:
        with pytest.raises(ConflictError):
            await uow.agents.update(agent.id, expected_version=1, system="lost update")
        ok = await uow.agents.update(agent.id, expected_version=2, name="still-works")
        assert ok.version == 3
    async with db.unit_of_work() as uow:
        stored = await uow.agents.get(agent.id)
    assert (stored.name, stored.system, stored.version) == ("still-works", "second", 3)


async def test_update_core_memory_sets_labels_one_at_a_time_and_keeps_both(db: Database) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("sam", core_memory={"persona": "old"})
    async with db.unit_of_work() as uow:
        first = (await uow.agents.update_core_memory(agent.id, "human", "Ada")).version
        second = await uow.agents.update_core_memory(agent.id, "persona", "new", expected_version=2)
    assert (first, second.version) == (2, 3)
    async with db.unit_of_work() as uow:
        stored = await uow.agents.get(agent.id)
    assert stored.core_memory == {"persona": "new", "human": "Ada"}
    assert stored.version == 3


async def test_update_core_memory_with_stale_version_conflicts_and_changes_nothing(db: Database) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("sam", core_memory={"persona": "p"})
        await uow.agents.update_core_memory(agent.id, "human", "Ada")
    async with db.unit_of_work() as uow:
        with pytest.raises(ConflictError):
            await uow.agents.update_core_memory(agent.id, "human", "Bob", expected_version=1)
    async with db.unit_of_work() as uow:
        stored = await uow.agents.get(agent.id)
    assert stored.core_memory == {"persona": "p", "human": "Ada"}
    assert stored.version == 2


async def test_duplicate_name_conflicts_and_the_unit_of_work_carries_on(db: Database) -> None:
    async with db.unit_of_work() as uow:
        first = await uow.agents.create("sam")
        with pytest.raises(ConflictError):
            await uow.agents.create("sam")
        other = await uow.agents.create("max")
        with pytest.raises(ConflictError):
            await uow.agents.update(other.id, name="sam")
        chat = await uow.sessions.create(other.id)
    async with db.unit_of_work() as uow:
        page = await uow.agents.list()
        assert (await uow.sessions.get(chat.id)).agent_id == other.id
        assert (await uow.agents.get(other.id)).version == 1
    assert sorted((a.name, a.id) for a in page.items) == sorted([("sam", first.id), ("max", other.id)])


async def test_delete_agent_removes_its_sessions_messages_and_passages(db: Database) -> None:
    async with db.unit_of_work() as uow:
        doomed = await uow.agents.create("doomed")
        kept = await uow.agents.create("kept")
        for agent in (doomed, kept):
            for _ in range(2):
                chat = await uow.sessions.create(agent.id)
                await uow.messages.append(chat.id, [{"role": "user", "content": "hi"}] * 3)
            await uow.passages.add(agent.id, "a fact", [0.1, 0.2, 0.3])
    async with db.unit_of_work() as uow:
        await uow.agents.delete(doomed.id)
    for table in ("sessions", "messages", "archival_passages"):
        assert await count_rows(db, table, agent_id=doomed.id) == 0, table
    assert await count_rows(db, "agents") == 1
    assert await count_rows(db, "sessions", agent_id=kept.id) == 2
    assert await count_rows(db, "messages", agent_id=kept.id) == 6
    assert await count_rows(db, "archival_passages", agent_id=kept.id) == 1
    async with db.unit_of_work() as uow:
        with pytest.raises(NotFoundError):
            await uow.agents.get(doomed.id)


async def test_unknown_agent_ids_raise_not_found(db: Database) -> None:
    unknown = uuid.uuid4()
    async with db.unit_of_work() as uow:
        with pytest.raises(NotFoundError):
            await uow.agents.get(unknown)
        with pytest.raises(NotFoundError):
            await uow.agents.update(unknown, system="x")
        with pytest.raises(NotFoundError):
            await uow.agents.update_core_memory(unknown, "human", "Ada")
        with pytest.raises(NotFoundError):
            await uow.agents.delete(unknown)


async def test_agent_ids_given_as_strings_work(db: Database) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("sam")
    async with db.unit_of_work() as uow:
        assert (await uow.agents.get(str(agent.id))).id == agent.id
        assert (await uow.agents.get(agent.id.hex)).id == agent.id
        updated = await uow.agents.update(str(agent.id), system="via str")
        assert updated.system == "via str"
        await uow.agents.delete(str(agent.id).upper())
    assert await count_rows(db, "agents") == 0


@pytest.mark.parametrize("bad_id", [42, "not-a-uuid", None, b"0" * 16, 1.5])
async def test_agent_ids_of_the_wrong_type_raise_validation_error(db: Database, bad_id: object) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("sam")
        with pytest.raises(ValidationError):
            await uow.agents.get(bad_id)  # type: ignore[arg-type]
        with pytest.raises(ValidationError):
            await uow.agents.update(bad_id, system="x")  # type: ignore[arg-type]
        with pytest.raises(ValidationError):
            await uow.agents.delete(bad_id)  # type: ignore[arg-type]
        with pytest.raises(ValidationError):
            await uow.sessions.create(bad_id)  # type: ignore[arg-type]
    assert (await count_rows(db, "agents"), await count_rows(db, "sessions")) == (1, 0)
    assert agent.version == 1


@pytest.mark.parametrize(
    "changes",
    [{"name": ""}, {"name": "   "}, {"version": 9}, {"id": uuid.uuid4()}, {"core_memory": {"human": 1}}],
)
async def test_invalid_updates_raise_validation_error_and_change_nothing(
    db: Database, changes: dict[str, object]
) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("sam", core_memory={"human": "Ada"})
    async with db.unit_of_work() as uow:
        with pytest.raises(ValidationError):
            await uow.agents.update(agent.id, **changes)
    async with db.unit_of_work() as uow:
        stored = await uow.agents.get(agent.id)
    assert (stored.name, stored.core_memory, stored.version) == ("sam", {"human": "Ada"}, 1)
