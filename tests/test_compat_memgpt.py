"""MemGPT-style memory classes: (results, total) shapes, stable pages, one unit of work per call."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from memorm import Database, HashingEmbedder, Message
from memorm.compat.memgpt import ArchivalMemory, PersistenceManager, RecallMemory, chunk_text, from_openai
from memorm.repositories import MessageRepository

pytestmark = pytest.mark.anyio

CALL = [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]


async def _agent_and_session(db: Database) -> tuple[object, object]:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("memgpt", core_memory={"persona": "p", "human": "h"})
        chat = await uow.sessions.create(agent.id)
    return agent.id, chat.id


def test_chunk_text_respects_the_limit_and_keeps_every_word() -> None:
    text = "\n\n".join(" ".join(f"w{p}_{i}." for i in range(300)) for p in range(3))
    chunks = chunk_text(text, max_chars=500)
    assert all(len(chunk) <= 500 for chunk in chunks)
    assert " ".join(chunks).split() == text.split()


async def test_archival_insert_chunks_and_search_pages_are_stable_with_true_totals(db: Database) -> None:
    agent_id, _ = await _agent_and_session(db)
    memory = ArchivalMemory(db, agent_id, HashingEmbedder(dim=64))
    long_text = " ".join(f"Fact number {i} is about cats and tea." for i in range(200))
    ids = await memory.insert(long_text)
    ids += await memory.insert("A short note about tea.")
    assert len(ids) > 2
    assert await memory.count() == len(ids)
    seen: list[str] = []
    for start in range(0, len(ids), 3):
        page, total = await memory.search("tea", count=3, start=start)
        assert total == len(ids)
        seen += [result["id"] for result in page]
    assert sorted(seen) == sorted(str(i) for i in ids)  # disjoint pages covering everything
    again, _ = await memory.search("tea", count=3, start=3)
    assert [r["id"] for r in again] == seen[3:6]


async def test_archival_results_carry_the_passages_own_timestamp(db: Database) -> None:
    agent_id, _ = await _agent_and_session(db)
    memory = ArchivalMemory(db, agent_id, HashingEmbedder(dim=32))
    before = datetime.now(timezone.utc)
    [passage_id] = await memory.insert("the passage")
    async with db.unit_of_work() as uow:
        stored = await uow.passages.get(passage_id)
    [result], total = await memory.search("passage")
    assert total == 1
    assert result["content"] == "the passage"
    assert result["timestamp"] == stored.created_at.isoformat()
    assert before <= datetime.fromisoformat(result["timestamp"]) <= datetime.now(timezone.utc)


async def test_recall_text_search_totals_exclude_system_messages(db: Database) -> None:
    agent_id, session_id = await _agent_and_session(db)
    async with db.unit_of_work() as uow:
        await uow.messages.append(session_id, [{"role": "system", "content": "kettle rules"}])
        await uow.messages.append(session_id, [{"role": "user", "content": f"kettle {i}"} for i in range(25)])
    recall = RecallMemory(db, agent_id)
    page, total = await recall.text_search("kettle", count=10)
    assert total == 25
    assert len(page) == 10
    assert {r["role"] for r in page} == {"user"}
    rest, _ = await recall.text_search("kettle", count=10, start=20)
    assert len(rest) == 5


async def test_recall_date_search_includes_the_whole_end_day(db: Database) -> None:
    agent_id, session_id = await _agent_and_session(db)
    day = datetime(2026, 3, 1, tzinfo=timezone.utc)
    stamps = [day - timedelta(microseconds=1), day, day + timedelta(hours=23, minutes=59, seconds=59)]
    stamps.append(day + timedelta(days=1))
    async with db.unit_of_work() as uow:
        await uow.messages.append(
            session_id, [{"role": "user", "content": f"m{i}", "created_at": t} for i, t in enumerate(stamps)]
        )
        await uow.messages.append(session_id, {"role": "system", "content": "s", "created_at": day})
    results, total = await RecallMemory(db, agent_id).date_search("2026-03-01", "2026-03-01")
    assert total == 2
    assert [r["content"] for r in results] == ["m1", "m2"]


async def test_persistence_manager_keeps_the_log_and_core_memory(db: Database) -> None:
    agent_id, session_id = await _agent_and_session(db)
    manager = PersistenceManager(db, agent_id, session_id)
    state = {
        "system": "You are Sam.",
        "core_memory": {"persona": "Sam"},
        "messages": [{"role": "user", "content": "hi"}],
    }
    await manager.init(state)
    await manager.init(state)  # a restart: nothing duplicated
    await manager.append_to_messages(
        [
            {"role": "assistant", "content": None, "tool_calls": CALL, "refusal": None},
            {"role": "tool", "content": "42", "tool_call_id": "c1"},
            Message(role="assistant", content="It is 42."),
        ]
    )
    await manager.prepend_to_messages([{"role": "user", "content": "summary"}])
    await manager.swap_system_message({"role": "system", "content": "You are Sam, v2."})
    await manager.update_memory({"persona": "Sam", "human": "Ada"})
    async with db.unit_of_work() as uow:
        log = await uow.messages.window(session_id)
        agent = await uow.agents.get(agent_id)
    assert [(m.role, m.content) for m in log] == [
        ("system", "You are Sam, v2."),
        ("user", "summary"),
        ("user", "hi"),
        ("assistant", None),  # as OpenAI sent it
        ("tool", "42"),
        ("assistant", "It is 42."),
    ]
    assert log[3].meta == {"openai": {"refusal": None}}
    assert agent.core_memory == {"persona": "Sam", "human": "Ada"}


async def test_trim_messages_drops_the_oldest_without_splitting_a_tool_call(db: Database) -> None:
    agent_id, session_id = await _agent_and_session(db)
    manager = PersistenceManager(db, agent_id, session_id)
    await manager.init({"system": "sys"})
    await manager.append_to_messages(
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": None, "tool_calls": CALL},
            {"role": "tool", "content": "a", "tool_call_id": "c1"},
            {"role": "assistant", "content": "done"},
        ]
    )
    assert await manager.trim_messages(2) == 3  # dropping the call alone would orphan its answer
    async with db.unit_of_work() as uow:
        assert [m.content for m in await uow.messages.window(session_id)] == ["sys", "done"]


async def test_a_call_that_fails_midway_leaves_nothing_behind(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent_id, session_id = await _agent_and_session(db)
    manager = PersistenceManager(db, agent_id, session_id)

    async def crash(self: MessageRepository, *args: object, **kwargs: object) -> None:
        raise RuntimeError("the process died here")

    monkeypatch.setattr(MessageRepository, "replace_system", crash)
    with pytest.raises(RuntimeError, match="died"):
        await manager.init(
            {"core_memory": {"persona": "new"}, "messages": [{"role": "user", "content": "x"}], "system": "s"}
        )
    async with db.unit_of_work() as uow:
        assert await uow.messages.count(session_id) == 0
        assert (await uow.agents.get(agent_id)).core_memory == {"persona": "p", "human": "h"}


def test_from_openai_keeps_unknown_fields_in_meta() -> None:
    converted = from_openai({"role": "assistant", "content": None, "audio": {"id": "a1"}, "tool_calls": CALL})
    assert converted == {
        "role": "assistant",
        "content": None,
        "tool_calls": CALL,
        "meta": {"openai": {"audio": {"id": "a1"}}},
    }
