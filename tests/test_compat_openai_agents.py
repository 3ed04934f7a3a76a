"""The Agents SDK's session protocol over memorm: exact round trips, the reference semantics, real runs."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from datetime import datetime, timedelta
from typing import Any

import agents
import anyio.to_thread
import pytest
from agents import Agent as SdkAgent
from agents import ItemHelpers, Runner, SQLiteSession, function_tool
from agents.items import (
    MCPApprovalRequestItem,
    MCPListToolsItem,
    MessageOutputItem,
    ReasoningItem,
    ToolCallItem,
    TResponseInputItem,
)
from agents.memory import Session as SdkSession
from agents.memory import SessionSettings
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tool import ToolOutputImage, ToolOutputText
from openai.types.responses import (
    EasyInputMessageParam,
    ResponseCodeInterpreterToolCall,
    ResponseComputerToolCall,
    ResponseCustomToolCall,
    ResponseCustomToolCallOutputParam,
    ResponseFileSearchToolCall,
    ResponseFunctionToolCall,
    ResponseFunctionWebSearch,
    ResponseOutputMessage,
    ResponseReasoningItem,
)
from openai.types.responses.response_input_item_param import (
    ComputerCallOutput,
    ItemReference,
    LocalShellCallOutput,
    McpApprovalResponse,
    ShellCallOutput,
)
from openai.types.responses.response_output_item import (
    ImageGenerationCall,
    LocalShellCall,
    McpApprovalRequest,
    McpCall,
    McpListTools,
)
from sqlalchemy import event

import memorm.compat.openai_agents as adapter
from memorm import Database, ValidationError
from memorm.compat.openai_agents import ITEM_KEY, MemormSession
from memorm.repositories import MessageRepository
from memorm.types import utcnow
from tests.conftest import Store, count_rows

pytestmark = pytest.mark.anyio
agents.set_tracing_disabled(True)  # models are scripted and traces off: nothing reaches the network

SDK_AGENT = SdkAgent(name="catalog")  # RunItems need an agent; it only labels them


async def _agent(db: Database, name: str = "assistant") -> Any:
    async with db.unit_of_work() as uow:
        return (await uow.agents.create(name)).id


def _message(key: str, text: str) -> TResponseInputItem:
    """An assistant message as the runner stores it."""
    return MessageOutputItem(agent=SDK_AGENT, raw_item=assistant_message(text, item_id=key)).to_input_item()


def sdk_items() -> list[TResponseInputItem]:
    """One of each kind of input item, built the way the SDK builds them."""
    call = function_call("lookup", {"city": "Zürich", "days": 3}, call_id="call_fn")
    assert isinstance(call, ResponseFunctionToolCall)
    output_text = MessageOutputItem(
        agent=SDK_AGENT,
        raw_item=ResponseOutputMessage.model_validate(
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [
                    {"type": "output_text", "text": "Sunny ☀ in Zürich", "annotations": [], "logprobs": []},
                    {"type": "refusal", "refusal": "no forecasts past a week"},
                ],
            }
        ),
    ).to_input_item()
    reasoning = ReasoningItem(
        agent=SDK_AGENT,
        raw_item=ResponseReasoningItem.model_validate(
            {
                "id": "rs_1",
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": "weighing the forecast"}],
                "encrypted_content": "gAAAA==",
            }
        ),
    ).to_input_item()
    tool_calls = [
        ResponseComputerToolCall.model_validate(
            {
                "id": "cu_1",
                "call_id": "call_cu",
                "type": "computer_call",
                "status": "completed",
                "pending_safety_checks": [],
                "action": {"type": "click", "button": "left", "x": 10, "y": 20},
            }
        ),
        ResponseFileSearchToolCall.model_validate(
            {
                "id": "fs_1",
                "type": "file_search_call",
                "status": "completed",
                "queries": ["tea"],
                "results": [{"file_id": "f1", "score": 0.75, "text": "tea", "attributes": {"n": 1}}],
            }
        ),
        ResponseFunctionWebSearch.model_validate(
            {
                "id": "ws_1",
                "type": "web_search_call",
                "status": "completed",
                "action": {"type": "search", "query": "weather"},
            }
        ),
        McpCall(id="mcp_1", type="mcp_call", name="echo", arguments="{}", server_label="srv", output="hi"),
        ResponseCodeInterpreterToolCall.model_validate(
            {
                "id": "ci_1",
                "type": "code_interpreter_call",
                "status": "completed",
                "code": "print(1.5 * 2)",
                "container_id": "c1",
                "outputs": [{"type": "logs", "logs": "3.0"}],
            }
        ),
        ImageGenerationCall(id="ig_1", type="image_generation_call", status="completed", result="aGk="),
        LocalShellCall.model_validate(
            {
                "id": "ls_1",
                "call_id": "call_ls",
                "type": "local_shell_call",
                "status": "completed",
                "action": {"type": "exec", "command": ["ls", "-l"], "env": {"LANG": "C"}},
            }
        ),
        ResponseCustomToolCall(id="ct_1", call_id="call_ct", type="custom_tool_call", name="sql", input="x"),
    ]
    return [
        *ItemHelpers.input_to_new_input_list("What's the weather in Zürich?"),
        EasyInputMessageParam(role="system", content="You are terse."),
        EasyInputMessageParam(role="developer", content="Answer in °C."),
        EasyInputMessageParam(
            role="user",
            content=[
                {"type": "input_text", "text": "and this picture?"},
                {"type": "input_image", "image_url": "data:image/png;base64,iVBO", "detail": "auto"},
                {"type": "input_file", "file_id": "file_1"},
            ],
        ),
        ToolCallItem(agent=SDK_AGENT, raw_item=call).to_input_item(),
        ItemHelpers.tool_call_output_item(call, "12 °C, wind 0.5 m/s"),
        ItemHelpers.tool_call_output_item(
            call, [ToolOutputText(text="chart"), ToolOutputImage(image_url="data:image/png;base64,AA")]
        ),
        output_text,
        reasoning,
        *(ToolCallItem(agent=SDK_AGENT, raw_item=raw).to_input_item() for raw in tool_calls),
        ComputerCallOutput(
            type="computer_call_output",
            call_id="call_cu",
            output={"type": "computer_screenshot", "image_url": "data:image/png;base64,AA"},
            acknowledged_safety_checks=[],
        ),
        LocalShellCallOutput(type="local_shell_call_output", id="ls_1", output="total 0"),
        ResponseCustomToolCallOutputParam(type="custom_tool_call_output", call_id="call_ct", output="1 row"),
        ShellCallOutput(
            type="shell_call_output",
            call_id="call_sh",
            output=[{"stdout": "ok", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}],
        ),
        MCPListToolsItem(
            agent=SDK_AGENT,
            raw_item=McpListTools.model_validate(
                {
                    "id": "ml_1",
                    "type": "mcp_list_tools",
                    "server_label": "srv",
                    "tools": [{"name": "echo", "input_schema": {"type": "object", "properties": {}}}],
                }
            ),
        ).to_input_item(),
        MCPApprovalRequestItem(
            agent=SDK_AGENT,
            raw_item=McpApprovalRequest(
                id="ar_1",
                type="mcp_approval_request",
                name="rm",
                arguments='{"path": "/"}',
                server_label="srv",
            ),
        ).to_input_item(),
        McpApprovalResponse(type="mcp_approval_response", approval_request_id="ar_1", approve=False),
        ItemReference(type="item_reference", id="msg_0"),
        {"type": "compaction", "encrypted_content": "opaque", "id": "cmp_1"},
    ]


# -- protocol and round trips --------------------------------------------------


async def test_memorm_session_satisfies_the_sdk_session_protocol(db: Database) -> None:
    agent_id = await _agent(db)
    session = MemormSession("chat", db, agent=agent_id)
    assert isinstance(session, SdkSession)
    assert session.session_id == "chat"
    assert session.session_settings == SessionSettings()
    tuned = MemormSession("chat", db, agent=str(agent_id), session_settings={"limit": 2})
    assert tuned.session_settings == SessionSettings(limit=2)


async def test_every_item_type_round_trips_exactly(db: Database, store: Store) -> None:
    agent_id = await _agent(db)
    items = sdk_items()
    assert len({item.get("type", "message") for item in items}) >= 18  # the catalogue covers the kinds
    await MemormSession("all", db, agent=agent_id).add_items(items)
    again = store.database()  # another pool: the items come from the database, not from memory
    try:
        read = await MemormSession("all", again, agent=agent_id).get_items()
    finally:
        await again.dispose()
    assert read == items
    for original, stored in zip(items, read, strict=True):
        assert stored == original, original


async def test_items_map_onto_memorm_columns(db: Database) -> None:
    agent_id = await _agent(db)
    items = sdk_items()
    await MemormSession("cols", db, agent=agent_id).add_items(items)
    async with db.unit_of_work(read_only=True) as uow:
        chat = await uow.sessions.get_by_key(agent_id, "cols")
        assert chat is not None
        rows = await uow.messages.window(chat.id, limit=100)
        hits = await uow.messages.search(agent_id, "picture")
        refusals = await uow.messages.search(agent_id, "forecasts")
    assert [row.meta[ITEM_KEY] for row in rows] == items
    by_type = {
        (item.get("type", "message"), item.get("role")): row for item, row in zip(items, rows, strict=True)
    }
    assert [rows[i].role for i in range(4)] == ["user", "system", "system", "user"]
    assert rows[3].content == "and this picture?"
    assert [hit.id for hit in hits.items] == [rows[3].id]  # text inside content parts is searchable
    assert [hit.id for hit in refusals.items] == [by_type["message", "assistant"].id]
    call = by_type["function_call", None]
    assert (call.role, call.content) == ("assistant", "")
    assert call.tool_calls == [
        {
            "id": "call_fn",
            "type": "function",
            "function": {"name": "lookup", "arguments": '{"city":"Zürich","days":3}'},
        }
    ]
    answers = [row for row in rows if row.meta[ITEM_KEY].get("type") == "function_call_output"]
    assert [(row.role, row.tool_call_id, row.content) for row in answers] == [
        ("tool", "call_fn", "12 °C, wind 0.5 m/s"),
        ("tool", "call_fn", "chart"),
    ]
    assert by_type["computer_call", None].tool_calls == [{"id": "call_cu", "type": "computer_call"}]
    assert (
        by_type["computer_call_output", None].role,
        by_type["computer_call_output", None].tool_call_id,
    ) == (
        "tool",
        "call_cu",
    )
    assert by_type["reasoning", None].content == "weighing the forecast"
    assert by_type["web_search_call", None].role == "assistant"
    assert all(row.token_count and row.token_count > 0 for row in rows)


async def test_bad_items_raise_before_anything_is_stored(db: Database) -> None:
    agent_id = await _agent(db)
    session = MemormSession("bad", db, agent=agent_id)
    good: TResponseInputItem = {"role": "user", "content": "fine"}
    for bad in (
        {"role": "user", "content": "x", "score": float("nan")},
        {"role": "user", "content": "nul \x00"},
        "not a dict",
    ):
        with pytest.raises(ValidationError):
            await session.add_items([good, bad])
    assert await session.get_items() == []
    assert await count_rows(db, "messages") == 0


# -- get_items ----------------------------------------------------------------


async def test_get_items_matches_the_sdks_sqlite_session(db: Database) -> None:
    agent_id = await _agent(db)
    ours = MemormSession("ref", db, agent=agent_id)
    reference = SQLiteSession("ref")
    try:
        batches = [[_message(f"m{i}", f"text {i}") for i in range(start, start + 3)] for start in (0, 3, 6)]
        for session in (ours, reference):
            for batch in batches:
                await session.add_items(batch)
        expected_all = [item for batch in batches for item in batch]
        for limit in (None, 0, 1, 3, 8, 9, 50, -1):
            assert await ours.get_items(limit) == await reference.get_items(limit), limit
        assert await ours.get_items(3) == expected_all[-3:]
        assert await ours.get_items() == expected_all
        for session in (ours, reference):  # settings bound calls without a limit
            session.session_settings = SessionSettings(limit=2)
        assert await ours.get_items() == await reference.get_items() == expected_all[-2:]
        assert await ours.get_items(4) == expected_all[-4:]
        assert await ours.pop_item() == await reference.pop_item() == expected_all[-1]
    finally:
        reference.close()


async def test_get_items_reads_only_the_pages_it_needs(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    agent_id = await _agent(db)
    session = MemormSession("paged", db, agent=agent_id)
    items = [_message(f"m{i}", f"text {i}") for i in range(12)]
    await session.add_items(items)
    asked: list[int] = []
    window = MessageRepository.window

    async def spy(self: MessageRepository, *args: Any, **kwargs: Any) -> Any:
        found = await window(self, *args, **kwargs)
        asked.append(len(found))
        return found

    monkeypatch.setattr(MessageRepository, "window", spy)
    monkeypatch.setattr(adapter, "PAGE", 5)
    assert await session.get_items() == items
    assert asked == [5, 5, 2]
    asked.clear()
    assert await session.get_items(2) == items[-2:]
    assert asked == [2]
    asked.clear()
    assert await session.get_items(7) == items[-7:]
    assert asked == [5, 2]


# -- pop_item and clear_session -----------------------------------------------


async def test_pop_item_removes_and_returns_the_newest_item(db: Database) -> None:
    agent_id = await _agent(db)
    session = MemormSession("pop", db, agent=agent_id)
    assert await session.pop_item() is None  # unknown session: nothing, and nothing created
    await session.add_items([])
    async with db.unit_of_work(read_only=True) as uow:
        assert await uow.sessions.get_by_key(agent_id, "pop") is None
    items = sdk_items()[:5]
    await session.add_items(items)
    assert await session.pop_item() == items[4]
    assert await session.pop_item() == items[3]
    assert await session.get_items() == items[:3]
    await session.add_items([items[4]])  # appends continue after the pops, in order
    assert await session.get_items() == [*items[:3], items[4]]
    for expected in (items[4], *reversed(items[:3])):
        assert await session.pop_item() == expected
    assert await session.pop_item() is None
    assert await count_rows(db, "messages") == 0


async def test_ttl_renews_the_sessions_expiry_on_every_write(db: Database) -> None:
    agent_id = await _agent(db)
    session = MemormSession("brief", db, agent=agent_id, ttl=timedelta(hours=1))
    await session.add_items([{"role": "user", "content": "hello"}])
    first = await _expiry(db, agent_id, "brief")
    await session.add_items([{"role": "user", "content": "again"}])
    renewed = await _expiry(db, agent_id, "brief")
    assert utcnow() + timedelta(minutes=59) < renewed <= utcnow() + timedelta(hours=1)
    assert renewed > first
    async with db.unit_of_work() as uow:
        assert (await uow.sessions.purge_expired(now=renewed - timedelta(seconds=1))).sessions == 0
        assert (await uow.sessions.purge_expired(now=renewed)).messages == 2
    assert await session.get_items() == []
    with pytest.raises(ValidationError):
        MemormSession("brief", db, agent=agent_id, ttl=-5)


async def _expiry(db: Database, agent_id: Any, key: str) -> datetime:
    async with db.unit_of_work(read_only=True) as uow:
        chat = await uow.sessions.get_by_key(agent_id, key)
    assert chat is not None
    assert chat.expires_at is not None
    return chat.expires_at


async def test_concurrent_pops_never_return_the_same_item(db: Database) -> None:
    agent_id = await _agent(db)
    items = [_message(f"m{i}", f"text {i}") for i in range(10)]
    await MemormSession("race", db, agent=agent_id).add_items(items)
    popped = await asyncio.gather(*(MemormSession("race", db, agent=agent_id).pop_item() for _ in range(14)))
    taken = [item for item in popped if item is not None]
    assert len(taken) == 10
    assert sorted(item["id"] for item in taken) == sorted(item["id"] for item in items)
    assert await MemormSession("race", db, agent=agent_id).get_items() == []


async def test_clear_session_deletes_the_items_but_keeps_the_memorm_session(db: Database) -> None:
    agent_id = await _agent(db)
    session = MemormSession("clear", db, agent=agent_id)
    other = MemormSession("other", db, agent=agent_id)
    await session.clear_session()  # unknown session: a no-op
    await session.add_items(sdk_items()[:6])
    await other.add_items([_message("keep", "kept")])
    async with db.unit_of_work() as uow:
        chat = await uow.sessions.get_by_key(agent_id, "clear")
        assert chat is not None
        await uow.messages.prepend(chat.id, [{"role": "user", "content": "prepended below the first"}])
    await session.clear_session()
    assert await session.get_items() == []
    assert await session.pop_item() is None
    async with db.unit_of_work(read_only=True) as uow:
        kept = await uow.sessions.get_by_key(agent_id, "clear")
        assert kept is not None
        assert kept.id == chat.id
        assert await uow.messages.count(chat.id) == 0
    await session.add_items([_message("new", "after clear")])
    assert await session.get_items() == [_message("new", "after clear")]
    assert await other.get_items() == [_message("keep", "kept")]


# -- sessions, keys and concurrency -------------------------------------------


async def test_a_key_names_one_session_per_agent(db: Database) -> None:
    first, second = await _agent(db, "first"), await _agent(db, "second")
    await MemormSession("same-key", db, agent=first).add_items([_message("a", "for first")])
    await MemormSession("same-key", db, agent=second).add_items([_message("b", "for second")])
    assert await MemormSession("same-key", db, agent=first).get_items() == [_message("a", "for first")]
    assert await MemormSession("same-key", db, agent=second).get_items() == [_message("b", "for second")]


async def test_a_hundred_concurrent_sessions_share_one_database(db: Database) -> None:
    agent_id = await _agent(db)

    async def converse(n: int) -> list[TResponseInputItem]:
        session = MemormSession(f"user-{n}", db, agent=agent_id)
        for turn in range(3):
            history = await session.get_items()
            assert len(history) == 2 * turn
            await session.add_items(
                [{"role": "user", "content": f"u{n}.{turn}"}, _message(f"a{n}.{turn}", f"reply {n}.{turn}")]
            )
        return await session.get_items()

    histories = await asyncio.gather(*(converse(n) for n in range(100)))
    for n, history in enumerate(histories):
        expected: list[TResponseInputItem] = []
        for turn in range(3):
            expected += [
                {"role": "user", "content": f"u{n}.{turn}"},
                _message(f"a{n}.{turn}", f"reply {n}.{turn}"),
            ]
        assert history == expected
    assert await count_rows(db, "sessions", agent_id=agent_id) == 100


async def test_concurrent_first_writes_to_one_key_share_one_session(db: Database) -> None:
    agent_id = await _agent(db)
    items = [_message(f"m{i}", f"text {i}") for i in range(20)]
    await asyncio.gather(*(MemormSession("shared", db, agent=agent_id).add_items([item]) for item in items))
    stored = await MemormSession("shared", db, agent=agent_id).get_items()
    assert sorted(item["id"] for item in stored) == sorted(item["id"] for item in items)
    assert await count_rows(db, "sessions", agent_id=agent_id) == 1


# -- messages other code wrote ------------------------------------------------


async def test_messages_written_through_memorm_read_as_items(db: Database) -> None:
    agent_id = await _agent(db)
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}},
        {"id": "c2", "type": "function", "function": {"name": "time", "arguments": {"tz": "CET"}}},
    ]
    async with db.unit_of_work() as uow:
        chat = await uow.sessions.create(agent_id, key="legacy")
        await uow.messages.append(
            chat.id,
            [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather and time in Oslo?"},
                {"role": "assistant", "content": "Checking.", "tool_calls": calls},
            ],
        )
    session = MemormSession("legacy", db, agent=agent_id)
    calls_as_items = [
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call", "call_id": "c2", "name": "time", "arguments": '{"tz": "CET"}'},
    ]
    head = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather and time in Oslo?"},
        {"role": "assistant", "content": "Checking."},
    ]
    assert await session.get_items() == [*head, *calls_as_items]
    assert await session.get_items(2) == calls_as_items  # one message, two of the newest items
    answer: TResponseInputItem = {"type": "function_call_output", "call_id": "c2", "output": "12:00"}
    await session.add_items([answer])
    async with db.unit_of_work() as uow:
        await uow.messages.append(chat.id, {"role": "tool", "tool_call_id": "c1", "content": "rain"})
    assert (await session.get_items(2))[0] == answer
    assert await session.pop_item() == {"type": "function_call_output", "call_id": "c1", "output": "rain"}
    assert await session.pop_item() == answer
    assert await session.pop_item() == calls_as_items[1]  # the rest of that message stays
    assert await session.get_items() == [*head, calls_as_items[0]]
    assert await session.pop_item() == calls_as_items[0]
    assert await session.get_items() == head


# -- loops and cancellation (found by the SDK's own tests, tests/upstream) -------


async def test_add_items_cancelled_as_its_commit_fails_raises_the_cancellation(db: Database) -> None:
    agent_id = await _agent(db)
    session = MemormSession("cancelled", db, agent=agent_id)
    engine = db.engine.sync_engine
    task: asyncio.Task[None]

    def cancel_then_fail(_connection: Any) -> None:
        task.cancel()
        raise RuntimeError("the COMMIT failed")

    event.listen(engine, "commit", cancel_then_fail)
    try:
        task = asyncio.create_task(session.add_items([{"role": "user", "content": "lost"}]))
        with pytest.raises(asyncio.CancelledError) as raised:  # not the failure: the caller asked to stop
            await task
    finally:
        event.remove(engine, "commit", cancel_then_fail)
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert await session.get_items() == []
    assert db.engine.pool.checkedout() == 0


async def test_dispose_closes_the_pool_of_a_dead_loop_before_its_own_loop_ends(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent_id = await _agent(db)
    session = MemormSession("dead-loop", db, agent=agent_id)
    crashed: list[Any] = []
    monkeypatch.setattr(threading, "excepthook", crashed.append)

    def aiosqlite_threads() -> set[threading.Thread]:
        return {thread for thread in threading.enumerate() if "_connection_worker_thread" in thread.name}

    def dead_loop() -> None:
        loop = asyncio.new_event_loop()
        loop.run_until_complete(session.add_items([{"role": "user", "content": "from a dead loop"}]))
        loop.close()  # without shutdown_asyncgens, as the SDK's own tests do: the pool outlives the loop

    before = aiosqlite_threads()
    await anyio.to_thread.run_sync(dead_loop)
    dead = aiosqlite_threads() - before
    # dispose() from a loop that closes as soon as it returns (a sync program's asyncio.run).
    await anyio.to_thread.run_sync(lambda: asyncio.run(db.dispose()))
    for thread in dead:
        await anyio.to_thread.run_sync(thread.join, 10)
    assert crashed == []  # no aiosqlite thread died on "Event loop is closed"
    assert not any(thread.is_alive() for thread in dead)
    assert await session.get_items() == [{"role": "user", "content": "from a dead loop"}]


# -- a real run ---------------------------------------------------------------


@function_tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


async def test_runner_keeps_the_conversation_in_memorm(db: Database, store: Store) -> None:
    agent_id = await _agent(db)
    model = ScriptedModel(
        [
            [function_call("weather", {"city": "Paris"}, call_id="call_1")],
            [assistant_message("It is sunny in Paris.", item_id="msg_a")],
            [assistant_message("You asked about Paris.", item_id="msg_b")],
        ]
    )
    assistant = SdkAgent(name="assistant", instructions="Be brief.", model=model, tools=[weather])

    first = await Runner.run(assistant, "Weather in Paris?", session=MemormSession("run", db, agent=agent_id))
    assert first.final_output == "It is sunny in Paris."
    async with db.unit_of_work(read_only=True) as uow:
        chat = await uow.sessions.get_by_key(agent_id, "run")
        assert chat is not None
        rows = await uow.messages.window(chat.id, limit=50)
    assert [row.role for row in rows] == ["user", "assistant", "tool", "assistant"]
    assert rows[0].content == "Weather in Paris?"
    assert rows[1].tool_calls is not None
    assert rows[1].tool_calls[0]["function"]["name"] == "weather"
    assert (rows[2].tool_call_id, rows[2].content) == ("call_1", "sunny in Paris")
    assert rows[3].content == "It is sunny in Paris."
    stored = [row.meta[ITEM_KEY] for row in rows]

    again = store.database()  # a fresh pool and session object: the history can only come from memorm
    try:
        second = await Runner.run(
            assistant, "What did I ask?", session=MemormSession("run", again, agent=agent_id)
        )
        assert second.final_output == "You asked about Paris."
        assert model.calls[2].input == [*stored, {"role": "user", "content": "What did I ask?"}]
        assert model.calls[2].input[:3] == model.calls[1].input  # what the first run sent, as it sent it
        history = await MemormSession("run", again, agent=agent_id).get_items()
    finally:
        await again.dispose()
    assert history[:4] == stored
    assert history[4:] == [
        {"role": "user", "content": "What did I ask?"},
        second.new_items[-1].to_input_item(),
    ]
    model.assert_complete()


def test_importing_memorm_does_not_import_the_sdk() -> None:
    code = "import sys, memorm, memorm.compat; assert 'agents' not in sys.modules, 'agents imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
