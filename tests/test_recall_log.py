"""Recall memory, the log itself: appending, token counts, windows, reads and concurrent appenders."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import anyio
import pytest
from conftest import Store

from memorm import (
    ConflictError,
    Database,
    Message,
    NotFoundError,
    ValidationError,
)
from memorm.tokens import estimate_tokens

pytestmark = pytest.mark.anyio

CALL = [{"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "tea"}'}}]


async def new_session(db: Database, name: str = "sam") -> tuple[uuid.UUID, uuid.UUID]:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create(name)
        chat = await uow.sessions.create(agent.id)
    return agent.id, chat.id


async def append_texts(db: Database, session_id: uuid.UUID, *texts: str, role: str = "user") -> None:
    async with db.unit_of_work() as uow:
        await uow.messages.append(session_id, [{"role": role, "content": text} for text in texts])


async def test_batch_with_tool_call_and_answers_is_stored_in_order(db: Database) -> None:
    agent_id, chat = await new_session(db)
    typed = Message(role="user", content="what tea?", name="ada")
    async with db.unit_of_work() as uow:
        stored = await uow.messages.append(
            chat,
            [
                typed,
                {"role": "assistant", "content": "", "tool_calls": CALL},
                {"role": "tool", "content": "oolong", "tool_call_id": "call_1", "name": "lookup"},
                {"role": "assistant", "content": "Oolong."},
            ],
        )
    assert stored[0] is typed  # Message inputs come back filled in
    assert (typed.seq, typed.session_id, typed.agent_id) == (1, chat, agent_id)
    async with db.unit_of_work() as uow:
        log = await uow.messages.window(chat)
    assert [m.id for m in log] == [m.id for m in stored]
    assert [(m.seq, m.role, m.content) for m in log] == [
        (1, "user", "what tea?"),
        (2, "assistant", ""),
        (3, "tool", "oolong"),
        (4, "assistant", "Oolong."),
    ]
    assert log[0].name == "ada"
    assert log[1].tool_calls == CALL
    assert (log[2].tool_call_id, log[2].name, log[2].tool_calls) == ("call_1", "lookup", None)
    assert {m.agent_id for m in log} == {agent_id}


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param({"role": "robot", "content": "x"}, id="role"),
        pytest.param({"role": "user", "content": "nul \x00 byte"}, id="nul"),
        pytest.param({"role": "user", "content": "x", "token_count": -1}, id="negative-tokens"),
        pytest.param({"role": "user", "content": "x", "colour": "red"}, id="unknown-field"),
        pytest.param({"role": "user", "content": "x", "created_at": datetime(2024, 1, 1)}, id="naive-time"),
        pytest.param({"role": "assistant", "content": "", "tool_calls": {"not": "a list"}}, id="tool-calls"),
        pytest.param({"role": "tool", "content": "x", "tool_call_id": "call\x00"}, id="nul-call-id"),
        pytest.param({"role": "assistant", "content": "", "tool_calls": [{"id": "c\x00"}]}, id="nul-in-call"),
        pytest.param({"role": "user", "content": "lone \ud800 surrogate"}, id="surrogate"),
        pytest.param("just a string", id="not-a-message"),
    ],
)
async def test_batch_with_one_bad_message_writes_nothing(db: Database, bad: Any) -> None:
    _, chat = await new_session(db)
    await append_texts(db, chat, "kept")
    async with db.unit_of_work() as uow:
        with pytest.raises(ValidationError):
            await uow.messages.append(chat, [{"role": "user", "content": "a"}, bad, {"role": "user"}])
        # The unit of work is still usable and its counter untouched.
        await uow.messages.append(chat, {"role": "user", "content": "after"})
    async with db.unit_of_work() as uow:
        log = await uow.messages.window(chat)
    assert [(m.seq, m.content) for m in log] == [(1, "kept"), (2, "after")]


async def test_append_to_unknown_session_raises_not_found(db: Database) -> None:
    await new_session(db)
    with pytest.raises(NotFoundError):
        async with db.unit_of_work() as uow:
            await uow.messages.append(uuid.uuid4(), {"role": "user", "content": "lost"})


async def test_append_with_a_taken_id_raises_conflict_and_writes_nothing(db: Database) -> None:
    _, chat = await new_session(db)
    async with db.unit_of_work() as uow:
        (first,) = await uow.messages.append(chat, {"role": "user", "content": "one"})
    with pytest.raises(ConflictError):
        async with db.unit_of_work() as uow:
            await uow.messages.append(
                chat, [{"role": "user", "content": "two"}, {"id": first.id, "role": "user", "content": "dup"}]
            )
    async with db.unit_of_work() as uow:
        assert [m.content for m in await uow.messages.window(chat)] == ["one"]


async def test_conflicting_append_takes_no_seq_and_the_unit_of_work_carries_on(db: Database) -> None:
    _, chat = await new_session(db)
    async with db.unit_of_work() as uow:
        (first,) = await uow.messages.append(chat, {"role": "user", "content": "one"})
    # The conflict is found before the counter moves: carrying on commits no gap.
    async with db.unit_of_work() as uow:
        await uow.messages.append(chat, {"role": "user", "content": "two"})
        with pytest.raises(ConflictError):
            await uow.messages.append(chat, [{"id": first.id, "role": "user", "content": "dup"}])
        await uow.messages.append(chat, {"role": "user", "content": "three"})
    async with db.unit_of_work() as uow:
        assert [(m.seq, m.content) for m in await uow.messages.window(chat)] == [
            (1, "one"),
            (2, "two"),
            (3, "three"),
        ]


async def test_large_tool_answer_with_many_distinct_words_is_stored_and_searchable(db: Database) -> None:
    # Postgres caps a tsvector at 1 MB: a naive GIN index makes this insert fail there.
    agent, chat = await new_session(db)
    dump = " ".join(f"row{i:07d}" for i in range(150_000))  # a big CSV-like tool output, ~1.6 MB
    async with db.unit_of_work() as uow:
        await uow.messages.append(chat, {"role": "tool", "content": dump, "tool_call_id": "call_1"})
    async with db.unit_of_work() as uow:
        assert [len(m.content) for m in await uow.messages.window(chat)] == [len(dump)]
        assert (await uow.messages.search(agent, "row0000001")).total == 1  # its head is indexed


async def test_token_count_is_kept_when_given_and_estimated_otherwise(db: Database) -> None:
    _, chat = await new_session(db)
    plain = {"role": "user", "content": "x" * 41, "name": "ada"}
    call = {"role": "assistant", "content": "", "tool_calls": CALL}
    async with db.unit_of_work() as uow:
        await uow.messages.append(
            chat, [{"role": "user", "content": "given", "token_count": 7}, plain, call, {"role": "user"}]
        )
        await uow.messages.append(chat, {"role": "user", "content": "zero", "token_count": 0})
    async with db.unit_of_work() as uow:
        counts = [m.token_count for m in await uow.messages.window(chat)]
    assert counts == [7, estimate_tokens(plain), estimate_tokens(call), 4, 0]
    assert estimate_tokens(plain) == 4 + (41 + 3 + 3) // 4  # content + name, rounded up, plus overhead


async def test_custom_token_counter_estimates_missing_counts(db: Database, store: Store) -> None:
    _, chat = await new_session(db)
    seen: list[Mapping[str, Any]] = []

    def counter(message: Mapping[str, Any]) -> int:
        seen.append(dict(message))
        return 1000 + len(message["content"])

    custom = store.database(token_counter=counter)
    try:
        async with custom.unit_of_work() as uow:
            await uow.messages.append(
                chat, [{"role": "user", "content": "abc"}, {"role": "user", "content": "x", "token_count": 5}]
            )
            await uow.messages.replace_system(chat, "be brief")
        async with db.unit_of_work() as uow:
            log = await uow.messages.window(chat)
    finally:
        await custom.dispose()
    assert [(m.role, m.token_count) for m in log] == [("system", 1008), ("user", 1003), ("user", 5)]
    assert [(m["role"], m["content"]) for m in seen] == [("user", "abc"), ("system", "be brief")]


async def test_window_cursors_page_back_and_forward_exactly(db: Database) -> None:
    _, chat = await new_session(db)
    roles = ["user", "assistant"] * 5
    async with db.unit_of_work() as uow:
        await uow.messages.append(chat, [{"role": r, "content": f"m{i}"} for i, r in enumerate(roles, 1)])
    async with db.unit_of_work() as uow:
        m = uow.messages
        newest = await m.window(chat, limit=3)
        back = await m.window(chat, limit=3, before_seq=8)
        oldest = await m.window(chat, limit=3, before_seq=3)
        forward = await m.window(chat, limit=3, after_seq=2)
        tail = await m.window(chat, limit=3, after_seq=9)
        past_end = await m.window(chat, after_seq=10)
        users = await m.window(chat, roles=["user"], limit=2)
        users_back = await m.window(chat, roles="user", before_seq=5)
        answers_forward = await m.window(chat, roles=["assistant"], after_seq=4, limit=2)
        everything = await m.window(chat, limit=1000)

    def seqs(window: list[Message]) -> list[int]:
        return [msg.seq for msg in window]

    assert seqs(newest) == [8, 9, 10]
    assert seqs(back) == [5, 6, 7]
    assert seqs(oldest) == [1, 2]
    assert seqs(forward) == [3, 4, 5]
    assert seqs(tail) == [10]
    assert past_end == []
    assert seqs(users) == [7, 9]
    assert seqs(users_back) == [1, 3]
    assert seqs(answers_forward) == [6, 8]
    assert [msg.content for msg in everything] == [f"m{i}" for i in range(1, 11)]


async def test_window_rejects_bad_arguments_and_unknown_sessions(db: Database) -> None:
    _, chat = await new_session(db)
    async with db.unit_of_work() as uow:
        assert await uow.messages.window(chat) == []
        for bad in [{"limit": 0}, {"limit": 1001}, {"before_seq": 3, "after_seq": 1}, {"roles": ["bot"]}]:
            with pytest.raises(ValidationError):
                await uow.messages.window(chat, **bad)
        with pytest.raises(NotFoundError):
            await uow.messages.window(uuid.uuid4())


async def test_get_and_count_by_role(db: Database) -> None:
    _, chat = await new_session(db)
    async with db.unit_of_work() as uow:
        stored = await uow.messages.append(
            chat,
            [
                {"role": "system", "content": "s"},
                {"role": "user", "content": "u1"},
                {"role": "assistant", "content": "", "tool_calls": CALL},
                {"role": "tool", "content": "t", "tool_call_id": "call_1"},
                {"role": "user", "content": "u2"},
            ],
        )
    async with db.unit_of_work() as uow:
        got = await uow.messages.get(str(stored[3].id))
        counts = (
            await uow.messages.count(chat),
            await uow.messages.count(chat, roles=["user"]),
            await uow.messages.count(chat, roles=["tool", "system"]),
            await uow.messages.count(chat, roles="assistant"),
        )
        with pytest.raises(NotFoundError):
            await uow.messages.get(uuid.uuid4())
        with pytest.raises(NotFoundError):
            await uow.messages.count(uuid.uuid4())
    assert (got.id, got.seq, got.content, got.tool_call_id) == (stored[3].id, 4, "t", "call_1")
    assert counts == (5, 2, 2, 1)


async def test_concurrent_appenders_get_unique_gap_free_seqs(db: Database) -> None:
    agent_id, shared = await new_session(db)
    async with db.unit_of_work() as uow:
        own = [(await uow.sessions.create(agent_id)).id for _ in range(50)]

    async def append(chat: uuid.UUID, writer: int) -> None:
        async with db.unit_of_work() as uow:
            await uow.messages.append(
                chat,
                [{"role": "user", "content": f"w{writer}a"}, {"role": "assistant", "content": f"w{writer}b"}],
            )

    async with anyio.create_task_group() as tasks:
        for writer in range(50):
            tasks.start_soon(append, shared, writer)
            tasks.start_soon(append, own[writer], writer)

    async with db.unit_of_work() as uow:
        log = await uow.messages.window(shared, limit=1000)
        total = await uow.messages.count(shared)
        others = [await uow.messages.window(chat) for chat in own]
    assert total == 100
    assert [m.seq for m in log] == list(range(1, 101))
    # Each writer's batch stays contiguous: one allocation per append.
    for first, second in zip(log[::2], log[1::2], strict=True):
        assert (first.content[:-1], first.content[-1], second.content) == (
            second.content[:-1],
            "a",
            first.content[:-1] + "b",
        )
    assert sorted(m.content for m in log) == sorted(f"w{w}{x}" for w in range(50) for x in "ab")
    for writer, window in enumerate(others):
        assert [(m.seq, m.content) for m in window] == [(1, f"w{writer}a"), (2, f"w{writer}b")]
