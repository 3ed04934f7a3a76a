"""Messages: appending with database-assigned ``seq``, windows, counts, concurrency."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import pytest
from conftest import count_rows
from hypothesis import given
from hypothesis import strategies as st

from memorm import ConflictError, Database, Message, NotFoundError, Session, ValidationError

pytestmark = pytest.mark.anyio


async def _new_session(db: Database, name: str = "sam") -> Session:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create(name)
        return await uow.sessions.create(agent.id)


async def test_append_one_message_a_list_and_dicts_assigns_seq_session_and_agent(db: Database) -> None:
    chat = await _new_session(db)
    single = Message(role="system", content="be brief")
    async with db.unit_of_work() as uow:
        one = await uow.messages.append(chat.id, single)
        many = await uow.messages.append(
            chat.id, [Message(role="user", content="hi"), Message(role="assistant", content="hello")]
        )
        dicts = await uow.messages.append(
            str(chat.id),
            [
                {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "args": {"q": "x"}}]},
                {"role": "tool", "content": "42", "name": "calc", "tool_call_id": "c1", "token_count": 3},
            ],
        )
    assert one == [single]  # Message inputs come back as the same objects, filled in
    stored = one + many + dicts
    assert [m.seq for m in stored] == [1, 2, 3, 4, 5]
    assert {m.session_id for m in stored} == {chat.id}
    assert {m.agent_id for m in stored} == {chat.agent_id}
    async with db.unit_of_work() as uow:
        window = await uow.messages.window(chat.id)
    assert [(m.seq, m.role, m.content) for m in window] == [(m.seq, m.role, m.content) for m in stored]
    assert [m.id for m in window] == [m.id for m in stored]
    assert window[3].tool_calls == [{"id": "c1", "args": {"q": "x"}}]
    assert (window[4].name, window[4].tool_call_id, window[4].token_count) == ("calc", "c1", 3)
    assert all(m.agent_id == chat.agent_id and m.session_id == chat.id for m in window)


async def test_window_returns_newest_messages_oldest_first_and_pages_back(db: Database) -> None:
    chat = await _new_session(db)
    async with db.unit_of_work() as uow:
        await uow.messages.append(chat.id, [{"role": "user", "content": f"m{i}"} for i in range(1, 11)])
    async with db.unit_of_work(read_only=True) as uow:
        newest = await uow.messages.window(chat.id, limit=4)
        older = await uow.messages.window(chat.id, limit=4, before_seq=newest[0].seq)
        oldest = await uow.messages.window(chat.id, limit=4, before_seq=older[0].seq)
        nothing = await uow.messages.window(chat.id, limit=4, before_seq=1)
        everything = await uow.messages.window(chat.id, limit=100)
    assert [m.seq for m in newest] == [7, 8, 9, 10]
    assert [m.seq for m in older] == [3, 4, 5, 6]
    assert [m.seq for m in oldest] == [1, 2]
    assert nothing == []
    assert [m.content for m in everything] == [f"m{i}" for i in range(1, 11)]


async def test_count_counts_one_sessions_messages(db: Database) -> None:
    chat = await _new_session(db)
    async with db.unit_of_work() as uow:
        other = await uow.sessions.create(chat.agent_id)
        assert await uow.messages.count(chat.id) == 0
        await uow.messages.append(chat.id, [{"role": "user"}] * 3)
        await uow.messages.append(other.id, {"role": "user"})
        assert await uow.messages.count(chat.id) == 3
    async with db.unit_of_work() as uow:
        assert await uow.messages.count(chat.id) == 3
        assert await uow.messages.count(other.id) == 1


async def test_concurrent_appenders_to_one_session_get_seqs_without_gaps_or_duplicates(db: Database) -> None:
    chat = await _new_session(db)
    tasks, per_task = 50, 2
    returned: list[int] = []

    async def appender(i: int) -> None:
        async with db.unit_of_work() as uow:
            stored = await uow.messages.append(
                chat.id, [{"role": "user", "content": f"{i}-{j}"} for j in range(per_task)]
            )
        returned.extend(m.seq for m in stored)
        assert stored[1].seq == stored[0].seq + 1  # a batch is contiguous

    async with anyio.create_task_group() as tg:
        for i in range(tasks):
            tg.start_soon(appender, i)

    total = tasks * per_task
    assert sorted(returned) == list(range(1, total + 1))
    async with db.unit_of_work() as uow:
        window = await uow.messages.window(chat.id, limit=1000)
        assert await uow.messages.count(chat.id) == total
        assert (await uow.sessions.get(chat.id)).next_seq == total + 1
    assert [m.seq for m in window] == list(range(1, total + 1))
    assert sorted(m.content for m in window) == sorted(
        f"{i}-{j}" for i in range(tasks) for j in range(per_task)
    )
    assert db.engine.pool.checkedout() == 0


async def test_concurrent_appenders_to_separate_sessions_each_number_from_one(db: Database) -> None:
    chat = await _new_session(db)
    async with db.unit_of_work() as uow:
        sessions = [chat] + [await uow.sessions.create(chat.agent_id) for _ in range(49)]

    async def appender(session: Session) -> None:
        for _ in range(2):
            async with db.unit_of_work() as uow:
                await uow.messages.append(session.id, [{"role": "user", "content": str(session.id)}] * 2)

    async with anyio.create_task_group() as tg:
        for session in sessions:
            tg.start_soon(appender, session)

    async with db.unit_of_work(read_only=True) as uow:
        for session in sessions:
            window = await uow.messages.window(session.id)
            assert [m.seq for m in window] == [1, 2, 3, 4]
            assert {m.content for m in window} == {str(session.id)}
    assert await count_rows(db, "messages", agent_id=chat.agent_id) == 200


@pytest.mark.parametrize(
    "bad",
    [
        {"role": "robot", "content": "beep"},
        {"role": None},
        {"content": "no role"},
        {"role": "user", "content": 5},
        {"role": "user", "token_count": -1},
        {"role": "user", "tool_calls": {"not": "a list"}},
        {"role": "user", "surprise": "unknown field"},
        "not a message",
    ],
)
async def test_batch_with_one_bad_message_raises_validation_error_and_writes_nothing(
    db: Database, bad: Any
) -> None:
    chat = await _new_session(db)
    async with db.unit_of_work() as uow:
        await uow.messages.append(chat.id, {"role": "user", "content": "first"})
    async with db.unit_of_work() as uow:
        with pytest.raises(ValidationError):
            await uow.messages.append(chat.id, [{"role": "user", "content": "ok"}, bad, {"role": "user"}])
        # Caught: the unit of work carries on, and the session's counter did not move.
        after = await uow.messages.append(chat.id, {"role": "assistant", "content": "next"})
    assert after[0].seq == 2
    async with db.unit_of_work() as uow:
        window = await uow.messages.window(chat.id)
        assert await uow.messages.count(chat.id) == 2
    assert [(m.seq, m.content) for m in window] == [(1, "first"), (2, "next")]


async def test_append_to_unknown_session_raises_not_found_and_writes_nothing(db: Database) -> None:
    await _new_session(db)
    unknown = uuid.uuid4()
    async with db.unit_of_work() as uow:
        with pytest.raises(NotFoundError):
            await uow.messages.append(unknown, {"role": "user", "content": "hello?"})
        with pytest.raises(NotFoundError):
            await uow.messages.window(unknown)
        with pytest.raises(NotFoundError):
            await uow.messages.count(unknown)
    assert await count_rows(db, "messages") == 0


async def test_empty_batch_appends_nothing_and_returns_empty_list(db: Database) -> None:
    chat = await _new_session(db)
    async with db.unit_of_work() as uow:
        assert await uow.messages.append(chat.id, []) == []
        assert (await uow.messages.append(chat.id, {"role": "user"}))[0].seq == 1


async def test_append_with_an_existing_message_id_raises_conflict_and_writes_nothing(db: Database) -> None:
    chat = await _new_session(db)
    message_id = uuid.uuid4()
    async with db.unit_of_work() as uow:
        await uow.messages.append(chat.id, {"role": "user", "id": message_id})
    # Found by the counter's UPDATE, before the INSERT: the same words on both engines.
    with pytest.raises(ConflictError) as caught:
        async with db.unit_of_work() as uow:
            await uow.messages.append(chat.id, [{"role": "user"}, {"role": "user", "id": str(message_id)}])
    assert str(caught.value).startswith("messages[0]: a message with id ")
    assert str(caught.value).endswith(
        "is not stored, but messages[1] is: a retried append must send the batch it first sent"
    )
    assert await count_rows(db, "messages") == 1
    async with db.unit_of_work() as uow:
        assert (await uow.sessions.get(chat.id)).next_seq == 2


async def test_assistant_message_that_only_calls_tools_keeps_content_none(db: Database) -> None:
    chat = await _new_session(db)
    call = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
    async with db.unit_of_work() as uow:
        [asked] = await uow.messages.append(
            chat.id, {"role": "assistant", "content": None, "tool_calls": [call]}
        )
        await uow.messages.append(chat.id, [{"role": "tool", "content": "sunny", "tool_call_id": "call_1"}])
    assert asked.content is None
    async with db.unit_of_work(read_only=True) as uow:
        window = await uow.messages.window(chat.id)
        assert [(m.role, m.content) for m in window] == [("assistant", None), ("tool", "sunny")]
        assert (await uow.messages.get(asked.id)).content is None
        assert [m.content for m in await uow.messages.context(chat.id, max_tokens=1_000)] == [None, "sunny"]
        assert (await uow.messages.search(chat.agent_id, "sunny")).total == 1


@pytest.mark.parametrize("role", ["system", "user", "tool"])
async def test_no_content_is_refused_for_other_roles_and_writes_nothing(db: Database, role: str) -> None:
    chat = await _new_session(db)
    with pytest.raises(ValidationError, match=r"messages\[1\]\.content: only assistant messages"):
        async with db.unit_of_work() as uow:
            await uow.messages.append(
                chat.id, [{"role": "user", "content": "hi"}, {"role": role, "content": None}]
            )
    assert await count_rows(db, "messages") == 0


async def test_taken_names_and_keys_are_named_the_same_way_on_both_engines(db: Database) -> None:
    async with db.unit_of_work() as uow:
        sam = await uow.agents.create("sam")
        bob = await uow.agents.create("bob")
        await uow.sessions.create(sam.id, key="chat-1")
    async with db.unit_of_work() as uow:
        with pytest.raises(ConflictError) as created:
            await uow.agents.create("sam")
        with pytest.raises(ConflictError) as renamed:
            await uow.agents.update(bob.id, name="sam")
        with pytest.raises(ConflictError) as keyed:
            await uow.sessions.create(sam.id, key="chat-1")
        await uow.agents.create("ann")  # each conflict lost only its savepoint
    assert str(created.value) == str(renamed.value) == "an agent named 'sam' exists"
    assert str(keyed.value) == f"agent {sam.id} has a session with key 'chat-1'"
    async with db.unit_of_work(read_only=True) as uow:
        assert sorted(agent.name for agent in (await uow.agents.list()).items) == ["ann", "bob", "sam"]


_roles = st.sampled_from(["system", "user", "assistant", "tool"])
_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=12)
_batches = st.lists(st.lists(st.tuples(_roles, _text), min_size=0, max_size=4), min_size=1, max_size=5)


@given(batches=_batches, limit=st.integers(1, 8), before=st.none() | st.integers(0, 25))
async def test_random_appends_match_a_list_model(
    db: Database, batches: list[list[tuple[str, str]]], limit: int, before: int | None
) -> None:
    chat = await _new_session(db, name=f"prop-{uuid.uuid4().hex}")
    model: list[tuple[int, str, str]] = []
    for batch in batches:
        async with db.unit_of_work() as uow:
            stored = await uow.messages.append(chat.id, [{"role": r, "content": c} for r, c in batch])
        start = len(model) + 1
        added = [(start + i, role, content) for i, (role, content) in enumerate(batch)]
        model.extend(added)
        assert [(m.seq, m.role, m.content) for m in stored] == added
    expected = [row for row in model if before is None or row[0] < before][-limit:]
    async with db.unit_of_work(read_only=True) as uow:
        window = await uow.messages.window(chat.id, limit=limit, before_seq=before)
        count = await uow.messages.count(chat.id)
    assert [(m.seq, m.role, m.content) for m in window] == expected
    assert count == len(model)
