"""LangChain chat history on memorm: lossless round trips, windows, clearing, sync and concurrent use."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import anyio
import pytest
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    ChatMessageChunk,
    FunctionMessage,
    FunctionMessageChunk,
    HumanMessage,
    HumanMessageChunk,
    RemoveMessage,
    SystemMessage,
    SystemMessageChunk,
    ToolMessage,
    ToolMessageChunk,
)

from memorm import Database, Message, Session, ValidationError
from memorm.compat.langchain import MemormChatMessageHistory, adispose_sync
from memorm.repositories import MessageRepository
from memorm.types import utcnow

pytestmark = pytest.mark.anyio

EVERY_TYPE: list[BaseMessage] = [
    SystemMessage("You are Sam.", id="sys-1", additional_kwargs={"cache": {"ttl": 300}}),
    HumanMessage("hi, I'm Ada", name="ada", id="h-1"),
    HumanMessage(
        content=[
            {"type": "text", "text": "what is in"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "text", "text": "this picture?"},
        ],
        id="h-2",
    ),
    AIMessage(
        "",
        id="run-1",
        tool_calls=[
            {
                "name": "lookup",
                "args": {"q": "Ada", "n": 2, "deep": {"x": [1.5, None, True]}},
                "id": "call-1",
            },
            {"name": "clock", "args": {}, "id": "call-2"},
        ],
        invalid_tool_calls=[{"name": "broken", "args": "{not json", "id": "call-3", "error": "bad JSON"}],
        usage_metadata={"input_tokens": 12, "output_tokens": 7, "total_tokens": 19},
        response_metadata={"model_name": "fake-1", "finish_reason": "tool_calls"},
    ),
    ToolMessage("Ada is a mathematician", tool_call_id="call-1", name="lookup", artifact={"rows": [1, 2]}),
    ToolMessage("clock broke", tool_call_id="call-2", status="error"),
    AIMessage(
        content=[{"type": "text", "text": "Ada Lovelace, "}, {"type": "text", "text": "née Byron."}],
        additional_kwargs={"refusal": None},
        name="sam",
    ),
    ChatMessage("internal note", role="developer"),
    ChatMessage("custom speaker", role="narrator"),
    FunctionMessage('{"temp": 21}', name="weather"),
    AIMessageChunk(content="partial", id="chunk-1"),
    HumanMessageChunk(content="typing"),
    SystemMessageChunk(content="sys part"),
    ToolMessageChunk(content="tool part", tool_call_id="call-1"),
    ChatMessageChunk(content="chat part", role="critic"),
    FunctionMessageChunk(content="fn part", name="weather"),
    HumanMessage("ünïcödé ✓ and emoji 🧪, quotes \" ' and \\ backslash"),
    AIMessage(""),
]


async def _agent(db: Database, name: str = "lc") -> uuid.UUID:
    async with db.unit_of_work() as uow:
        return (await uow.agents.create(name)).id


@pytest.fixture
async def db(db: Database) -> AsyncIterator[Database]:
    """conftest's ``db``, whose private sync copy (if a test made one) closes before the store goes."""
    yield db
    await adispose_sync(db)


async def _stored_rows(db: Database, agent_id: uuid.UUID, key: str) -> list[Message]:
    async with db.unit_of_work(read_only=True) as uow:
        chat = await uow.sessions.get_by_key(agent_id, key)
        assert chat is not None
        return await uow.messages.window(chat.id, limit=1000)


async def test_every_message_type_round_trips_to_an_equal_object(db: Database) -> None:
    agent_id = await _agent(db)
    history = MemormChatMessageHistory(db, "chat-1", agent=agent_id)
    await history.aadd_messages(EVERY_TYPE[:5])
    await history.aadd_messages(EVERY_TYPE[5:])

    # A fresh adapter (nothing cached) on the same key reads the same objects back.
    again = await MemormChatMessageHistory(db, "chat-1", agent=agent_id).aget_messages()
    assert again == EVERY_TYPE
    assert [type(m) for m in again] == [type(m) for m in EVERY_TYPE]
    assert again[3].tool_calls == EVERY_TYPE[3].tool_calls  # type: ignore[attr-defined]
    assert again[4].artifact == {"rows": [1, 2]}  # type: ignore[attr-defined]
    assert again[7].role == "developer"
    assert again[8].role == "narrator"


async def test_messages_fill_memorms_columns_with_the_closest_role(db: Database) -> None:
    agent_id = await _agent(db)
    await MemormChatMessageHistory(db, "chat-1", agent=agent_id).aadd_messages(EVERY_TYPE)
    rows = await _stored_rows(db, agent_id, "chat-1")
    assert [row.role for row in rows] == [
        "system",
        "user",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "system",  # developer
        "user",  # narrator: unknown roles are users
        "tool",  # FunctionMessage
        "assistant",  # AIMessageChunk
        "user",
        "system",
        "tool",
        "user",  # ChatMessageChunk(role="critic")
        "tool",
        "user",
        "assistant",
    ]
    assert rows[1].name == "ada"
    assert rows[1].content == "hi, I'm Ada"
    assert rows[2].content == "what is inthis picture?"  # text blocks, for search and token counts
    assert rows[3].tool_calls == [
        {
            "id": "call-1",
            "type": "function",
            "function": {
                "name": "lookup",
                "arguments": '{"q": "Ada", "n": 2, "deep": {"x": [1.5, null, true]}}',
            },
        },
        {"id": "call-2", "type": "function", "function": {"name": "clock", "arguments": "{}"}},
    ]
    assert (rows[4].tool_call_id, rows[4].name) == ("call-1", "lookup")
    assert rows[9].name == "weather"
    # LangChain's serialisation (type, ids, metadata) lives in meta; a string content only in its column.
    assert rows[1].meta["langchain"]["type"] == "human"
    assert rows[1].meta["langchain"]["data"]["id"] == "h-1"
    assert "content" not in rows[1].meta["langchain"]["data"]
    assert rows[2].meta["langchain"]["data"]["content"][1]["type"] == "image_url"
    assert rows[8].meta["langchain"]["data"]["role"] == "narrator"
    assert rows[10].meta["langchain"]["type"] == "AIMessageChunk"


async def test_messages_written_with_memorms_own_api_read_as_langchain_messages(db: Database) -> None:
    agent_id = await _agent(db)
    async with db.unit_of_work() as uow:
        chat = await uow.sessions.get_or_create(agent_id, "native")
        stored = await uow.messages.append(
            chat.id,
            [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "weather?", "name": "ada"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "wx", "arguments": '{"city": "Oslo"}'},
                        },
                        {"id": "c2", "type": "function", "function": {"name": "wx", "arguments": "{oops"}},
                        {"id": "c3", "name": "clock", "args": {}},  # flat, LangChain-like
                    ],
                },
                {"role": "tool", "content": "rain", "tool_call_id": "c1", "name": "wx"},
                {
                    "role": "user",
                    "content": "thanks",
                    "meta": {"langchain": {"type": "other-app", "data": {}}},
                },
            ],
        )
    got = await MemormChatMessageHistory(db, "native", agent=agent_id).aget_messages()
    ids = [str(row.id) for row in stored]
    assert got[:2] == [
        SystemMessage("be brief", id=ids[0]),
        HumanMessage("weather?", name="ada", id=ids[1]),
    ]
    assert isinstance(got[2], AIMessage)
    assert got[2].tool_calls == [
        {"name": "wx", "args": {"city": "Oslo"}, "id": "c1", "type": "tool_call"},
        {"name": "clock", "args": {}, "id": "c3", "type": "tool_call"},
    ]
    assert [(c["id"], c["args"]) for c in got[2].invalid_tool_calls] == [("c2", "{oops")]
    assert got[3] == ToolMessage("rain", tool_call_id="c1", name="wx", id=ids[3])
    assert got[4] == HumanMessage(
        "thanks", id=ids[4]
    )  # another app's "langchain" meta: read from the columns


async def test_window_reads_only_the_newest_messages(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    agent_id = await _agent(db)
    history = MemormChatMessageHistory(db, "long", agent=agent_id)
    sent = [HumanMessage(f"m{i}") if i % 2 else AIMessage(f"m{i}") for i in range(40)]
    await history.aadd_messages(sent)

    limits: list[Any] = []
    real_window = MessageRepository.window

    async def spy(self: MessageRepository, session_id: Any, **kwargs: Any) -> list[Message]:
        limits.append(kwargs.get("limit"))
        return await real_window(self, session_id, **kwargs)

    monkeypatch.setattr(MessageRepository, "window", spy)
    windowed = MemormChatMessageHistory(db, "long", agent=agent_id, window=5)
    assert await windowed.aget_messages() == sent[-5:]
    assert limits == [5]  # one query for five rows, not the whole history
    assert await MemormChatMessageHistory(db, "long", agent=agent_id, window=500).aget_messages() == sent


async def test_whole_history_and_large_windows_are_read_in_pages(db: Database) -> None:
    agent_id = await _agent(db)
    history = MemormChatMessageHistory(db, "huge", agent=agent_id)
    sent = [HumanMessage(f"message {i}") for i in range(2345)]
    await history.aadd_messages(sent)
    assert await history.aget_messages() == sent  # three forward pages of <= 1,000
    big_window = MemormChatMessageHistory(db, "huge", agent=agent_id, window=2100)
    assert await big_window.aget_messages() == sent[-2100:]  # three backward pages


async def test_window_must_be_a_positive_integer(db: Database) -> None:
    agent_id = await _agent(db)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValidationError):
            MemormChatMessageHistory(db, "k", agent=agent_id, window=bad)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        MemormChatMessageHistory(db, "", agent=agent_id)


async def test_aclear_empties_only_its_own_session_and_the_history_continues(db: Database) -> None:
    agent_id = await _agent(db)
    mine = MemormChatMessageHistory(db, "mine", agent=agent_id)
    other = MemormChatMessageHistory(db, "other", agent=agent_id)
    await mine.aadd_messages([HumanMessage("a"), AIMessage("b"), HumanMessage("c")])
    await other.aadd_messages([HumanMessage("keep me")])

    await mine.aclear()
    assert await mine.aget_messages() == []
    assert await MemormChatMessageHistory(db, "mine", agent=agent_id).aget_messages() == []
    assert await other.aget_messages() == [HumanMessage("keep me")]

    await mine.aadd_messages([HumanMessage("after")])
    assert await mine.aget_messages() == [HumanMessage("after")]
    rows = await _stored_rows(db, agent_id, "mine")
    assert [row.seq for row in rows] == [1]  # the counter rewound with the clear


async def test_aclear_also_removes_prepended_messages(db: Database) -> None:
    agent_id = await _agent(db)
    history = MemormChatMessageHistory(db, "k", agent=agent_id)
    await history.aadd_messages([HumanMessage("a"), AIMessage("b")])
    async with db.unit_of_work() as uow:
        chat = await uow.sessions.get_by_key(agent_id, "k")
        assert chat is not None
        await uow.messages.prepend(chat.id, [{"role": "user", "content": "summary"}])
    assert len(await history.aget_messages()) == 3
    await history.aclear()
    assert await history.aget_messages() == []


async def test_reads_and_clears_of_an_unknown_key_create_no_session(db: Database) -> None:
    agent_id = await _agent(db)
    history = MemormChatMessageHistory(db, "never-written", agent=agent_id)
    assert await history.aget_messages() == []
    await history.aclear()
    await history.aadd_messages([])
    async with db.unit_of_work(read_only=True) as uow:
        assert await uow.sessions.get_by_key(agent_id, "never-written") is None
    await history.aadd_messages([HumanMessage("now")])
    async with db.unit_of_work(read_only=True) as uow:
        chat = await uow.sessions.get_by_key(agent_id, "never-written")
    assert chat is not None
    assert chat.agent_id == agent_id


async def test_a_deleted_session_is_recreated_by_the_next_write(db: Database) -> None:
    agent_id = await _agent(db)
    history = MemormChatMessageHistory(db, "k", agent=agent_id)
    await history.aadd_messages([HumanMessage("old")])
    async with db.unit_of_work() as uow:
        chat = await uow.sessions.get_by_key(agent_id, "k")
        assert chat is not None
        await uow.sessions.delete(chat.id)
    assert await history.aget_messages() == []  # the cached session is gone: nothing, no error
    await history.aadd_messages([HumanMessage("new")])
    assert await history.aget_messages() == [HumanMessage("new")]
    async with db.unit_of_work() as uow:
        chat = await uow.sessions.get_by_key(agent_id, "k")
        assert chat is not None
        await uow.sessions.delete(chat.id)
    await history.aadd_messages([HumanMessage("newer")])  # a cached id of a deleted session, on write
    assert await MemormChatMessageHistory(db, "k", agent=agent_id).aget_messages() == [HumanMessage("newer")]


async def test_ttl_makes_an_idle_session_expire_and_every_write_renews_it(db: Database) -> None:
    agent_id = await _agent(db)
    history = MemormChatMessageHistory(db, "k", agent=agent_id, ttl=timedelta(minutes=30))
    before = utcnow()
    await history.aadd_messages([HumanMessage("first")])
    first = await _session(db, agent_id)
    assert first.expires_at is not None
    assert before + timedelta(minutes=30) <= first.expires_at <= utcnow() + timedelta(minutes=30)
    await history.aadd_messages([HumanMessage("second")])
    renewed = await _session(db, agent_id)
    assert renewed.expires_at is not None
    assert renewed.expires_at > first.expires_at

    # 29 minutes after the last write the session lives; 31 minutes after, a purge takes it.
    async with db.unit_of_work() as uow:
        kept = await uow.sessions.purge_expired(now=renewed.expires_at - timedelta(minutes=1))
        gone = await uow.sessions.purge_expired(now=renewed.expires_at + timedelta(minutes=1))
    assert (kept.sessions, gone.sessions, gone.messages) == (0, 1, 2)
    assert await history.aget_messages() == []
    await history.aadd_messages([HumanMessage("again")])  # a fresh session under the same key
    assert await history.aget_messages() == [HumanMessage("again")]
    with pytest.raises(ValidationError):
        MemormChatMessageHistory(db, "k", agent=agent_id, ttl=0)


async def _session(db: Database, agent_id: uuid.UUID) -> Session:
    async with db.unit_of_work(read_only=True) as uow:
        chat = await uow.sessions.get_by_key(agent_id, "k")
    assert chat is not None
    return chat


async def test_aclear_finds_a_session_recreated_under_its_key(db: Database) -> None:
    agent_id = await _agent(db)
    history = MemormChatMessageHistory(db, "k", agent=agent_id)
    await history.aadd_messages([HumanMessage("old")])  # caches the session id
    async with db.unit_of_work() as uow:
        chat = await uow.sessions.get_by_key(agent_id, "k")
        assert chat is not None
        await uow.sessions.delete(chat.id)
    await MemormChatMessageHistory(db, "k", agent=agent_id).aadd_messages([HumanMessage("new")])
    await history.aclear()  # the cached id is stale: the key's new session is cleared
    assert await MemormChatMessageHistory(db, "k", agent=agent_id).aget_messages() == []


async def test_same_key_of_two_agents_is_two_sessions(db: Database) -> None:
    sam, max_ = await _agent(db, "sam"), await _agent(db, "max")
    await MemormChatMessageHistory(db, "user-1", agent=sam).aadd_messages([HumanMessage("to sam")])
    await MemormChatMessageHistory(db, "user-1", agent=max_).aadd_messages([HumanMessage("to max")])
    assert await MemormChatMessageHistory(db, "user-1", agent=sam).aget_messages() == [HumanMessage("to sam")]
    assert await MemormChatMessageHistory(db, "user-1", agent=max_).aget_messages() == [
        HumanMessage("to max")
    ]


async def test_a_batch_with_an_unstorable_message_writes_nothing(db: Database) -> None:
    agent_id = await _agent(db)
    history = MemormChatMessageHistory(db, "k", agent=agent_id)
    with pytest.raises(ValidationError):
        await history.aadd_messages([HumanMessage("ok"), RemoveMessage(id="x")])
    with pytest.raises(ValidationError):
        await history.aadd_messages(
            [HumanMessage("ok"), ToolMessage("r", tool_call_id="c", artifact=object())]
        )
    with pytest.raises(ValidationError):
        await history.aadd_messages([HumanMessage("ok", additional_kwargs={"x": float("nan")})])
    assert await history.aget_messages() == []


async def test_sync_api_from_a_thread_while_the_event_loop_runs(db: Database) -> None:
    agent_id = await _agent(db)
    history = MemormChatMessageHistory(db, "threaded", agent=agent_id)
    await history.aadd_messages([SystemMessage("sys")])  # the async side uses db on this loop
    loop_ticks = 0

    def sync_work() -> list[BaseMessage]:
        history.add_messages([HumanMessage("from a thread")])
        history.add_message(AIMessage("", tool_calls=[{"name": "f", "args": {"a": 1}, "id": "c"}]))
        history.add_user_message("again")
        return history.messages

    async def ticker() -> None:
        nonlocal loop_ticks
        while True:
            loop_ticks += 1
            await anyio.sleep(0.001)

    async with anyio.create_task_group() as group:
        group.start_soon(ticker)
        seen = await anyio.to_thread.run_sync(sync_work)
        group.cancel_scope.cancel()

    expected = [
        SystemMessage("sys"),
        HumanMessage("from a thread"),
        AIMessage("", tool_calls=[{"name": "f", "args": {"a": 1}, "id": "c"}]),
        HumanMessage("again"),
    ]
    assert seen == expected
    assert loop_ticks > 0  # the loop kept running while the thread waited on the database
    assert await history.aget_messages() == expected  # the sync writes landed in the same store
    await anyio.to_thread.run_sync(history.clear)
    assert await history.aget_messages() == []


def test_sync_api_from_plain_sync_code(db: Database, anyio_backend: str) -> None:
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()  # no event loop runs here
    history = MemormChatMessageHistory(db, "plain", agent=_sync_agent(db))
    assert history.messages == []
    history.add_messages([HumanMessage("one"), AIMessage("two")])
    history.add_ai_message("three")
    assert history.messages == [HumanMessage("one"), AIMessage("two"), AIMessage("three")]
    assert MemormChatMessageHistory(db, "plain", agent=history.agent_id, window=2).messages == [
        AIMessage("two"),
        AIMessage("three"),
    ]
    assert str(history) == "Human: one\nAI: two\nAI: three"
    history.clear()
    assert history.messages == []


def _sync_agent(db: Database) -> uuid.UUID:
    """An agent, created through the sync bridge's loop (the test has none of its own)."""
    from memorm.compat.langchain import _BRIDGE

    async def create(copy: Database) -> uuid.UUID:
        async with copy.unit_of_work() as uow:
            return (await uow.agents.create("plain")).id

    return _BRIDGE.run(db, create)


async def test_sync_calls_from_many_threads_at_once(db: Database) -> None:
    agent_id = await _agent(db)
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            history = MemormChatMessageHistory(db, f"t{index}", agent=agent_id)
            for turn in range(3):
                history.add_messages([HumanMessage(f"{index}.{turn}")])
            assert history.messages == [HumanMessage(f"{index}.{turn}") for turn in range(3)]
        except BaseException as error:
            errors.append(error)

    def run_all() -> None:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    await anyio.to_thread.run_sync(run_all)
    assert errors == []
    assert await MemormChatMessageHistory(db, "t7", agent=agent_id).aget_messages() == [
        HumanMessage(f"7.{turn}") for turn in range(3)
    ]


async def test_hundred_concurrent_sessions_share_one_database(db: Database) -> None:
    agent_id = await _agent(db)
    results: dict[int, list[BaseMessage]] = {}

    def conversation(index: int) -> list[BaseMessage]:
        return [
            HumanMessage(f"session {index} asks", id=f"{index}-q"),
            AIMessage(
                "",
                tool_calls=[{"name": "lookup", "args": {"session": index}, "id": f"call-{index}"}],
            ),
            ToolMessage(f"answer for {index}", tool_call_id=f"call-{index}"),
            AIMessage(f"session {index} done"),
        ]

    async def talk(index: int) -> None:
        history = MemormChatMessageHistory(db, f"session-{index}", agent=agent_id)
        messages = conversation(index)
        await history.aadd_messages(messages[:1])
        await history.aadd_messages(messages[1:3])
        await history.aadd_messages(messages[3:])
        results[index] = await history.aget_messages()

    async with anyio.create_task_group() as group:
        for index in range(100):
            group.start_soon(talk, index)

    assert len(results) == 100
    for index, messages in results.items():
        assert messages == conversation(index)
    async with db.unit_of_work(read_only=True) as uow:
        assert (await uow.sessions.list(agent_id, limit=1000)).total == 100


def test_importing_memorm_does_not_import_langchain() -> None:
    code = (
        "import sys, memorm, memorm.compat; "
        "loaded = sorted(m for m in sys.modules if m.split('.')[0].startswith('langchain')); "
        "assert not loaded, loaded; "
        "import memorm.compat.langchain; "
        "assert 'langchain_core' in sys.modules"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


async def test_tool_call_arguments_nested_past_pythons_parser_read_as_an_invalid_tool_call(
    db: Database,
) -> None:
    agent_id = await _agent(db)
    deep = "[" * 100_000 + "]" * 100_000  # json.loads recursed until RecursionError
    async with db.unit_of_work() as uow:
        chat = await uow.sessions.get_or_create(agent_id, "deep")
        await uow.messages.append(
            chat.id,
            [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": deep}}
                    ],
                }
            ],
        )
    (got,) = await MemormChatMessageHistory(db, "deep", agent=agent_id).aget_messages()
    assert isinstance(got, AIMessage)
    assert got.tool_calls == []
    assert [(c["id"], c["args"]) for c in got.invalid_tool_calls] == [("c1", deep)]
