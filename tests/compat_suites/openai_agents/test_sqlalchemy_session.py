# Vendored from the OpenAI Agents SDK (openai-agents 0.24.0, source distribution),
# tests/extensions/memory/test_sqlalchemy_session.py; adapted to memorm as README.md here describes.
# Copyright (c) 2025 OpenAI. SPDX-License-Identifier: MIT (the SDK's LICENSE, whole, is beside this file).
"""The SDK's ``SQLAlchemySession`` tests, run on ``MemormSession`` on both engines.

Only the session's construction changed: ``SQLAlchemySession.from_url(id,
url=...)`` is ``backend.session(id, db=...)`` on another ``Database`` on the
same store (``db.clone()``, disposed where the SDK disposes its engine), and
``SQLAlchemySession(id, engine=shared)`` is ``backend.session(id)`` on the
test's ``Database``.  ``create_tables=True`` has no counterpart: the fixture
creates memorm's schema.  Notes marked "memorm:" say what else changed.

Not applicable to memorm (``SQLAlchemySession`` internals):

- test_sqlalchemy_session_defaults_to_escaped_non_ascii_storage,
  test_sqlalchemy_session_can_store_non_ascii_without_escaping: its
  ``ensure_ascii`` option for a text column; memorm stores JSON (non-ASCII
  round trips: test_session.py's test_sqlite_session_unicode_content).
- test_sqlite_fallback_reserves_writer_before_tail_claim,
  test_pop_item_supports_unknown_delete_rowcount,
  test_pop_item_retries_returning_claim_lost_to_concurrent_delete: fakes of
  its private session factory and dialect flags (concurrent pops:
  test_concurrent_pop_item_returns_each_row_once).
- test_pop_item_skips_corrupt_most_recent, test_get_items_limit_skips_corrupt_newest_rows,
  test_pop_item_returns_none_after_dropping_only_corrupt_rows: memorm keeps
  items in a JSON column, checked on write; no row holds unparsable JSON.
- test_create_tables_false_does_not_allocate_shared_init_lock,
  test_sqlite_configuration_registry_releases_collected_engines,
  test_sqlite_configuration_registry_does_not_grow_unbounded: its private
  lock map and engine registry.
- test_get_items_orders_by_id_for_ties: inspects its ORDER BY clauses;
  memorm orders by ``seq`` (the two same-timestamp cases below pin it).
- test_engine_property_from_url, test_engine_property_from_external_engine,
  test_engine_property_is_read_only: its ``engine`` property.
- test_session_settings_default, test_get_items_uses_session_settings_limit,
  test_get_items_explicit_limit_overrides_session_settings, test_session_settings_resolve,
  test_runner_with_session_settings_override: the same tests as
  test_session.py's, vendored there.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, cast

import pytest
from agents import Agent, Runner, TResponseInputItem
from agents.testing import ScriptedModel
from openai.types.responses.response_output_message_param import ResponseOutputMessageParam
from openai.types.responses.response_output_text_param import ResponseOutputTextParam
from openai.types.responses.response_reasoning_item_param import (
    ResponseReasoningItemParam,
    Summary,
)
from sqlalchemy import event

from .backend import Backend
from .responses import get_text_message

pytestmark = pytest.mark.anyio


def _make_message_item(item_id: str, text_value: str) -> TResponseInputItem:
    content: ResponseOutputTextParam = {
        "type": "output_text",
        "text": text_value,
        "annotations": [],
        "logprobs": [],
    }
    message: ResponseOutputMessageParam = {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [content],
    }
    return cast(TResponseInputItem, message)


def _make_reasoning_item(item_id: str, summary_text: str) -> TResponseInputItem:
    summary: Summary = {"type": "summary_text", "text": summary_text}
    reasoning: ResponseReasoningItemParam = {
        "id": item_id,
        "type": "reasoning",
        "summary": [summary],
    }
    return cast(TResponseInputItem, reasoning)


def _item_ids(items: Sequence[TResponseInputItem]) -> list[str]:
    result: list[str] = []
    for item in items:
        item_dict = cast(dict[str, Any], item)
        result.append(cast(str, item_dict["id"]))
    return result


@pytest.fixture
def agent() -> Agent:
    """Fixture for a basic agent with a scripted model."""
    return Agent(name="test", model=ScriptedModel())


async def test_sqlalchemy_session_direct_ops(backend: Backend, agent: Agent):
    """Test direct database operations of SQLAlchemySession."""
    session_id = "direct_ops_test"
    session = backend.session(session_id)

    # 1. Add items
    items: list[TResponseInputItem] = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there!"},
    ]
    await session.add_items(items)

    # 2. Get items and verify
    retrieved = await session.get_items()
    assert len(retrieved) == 2
    assert retrieved[0].get("content") == "Hello"
    assert retrieved[1].get("content") == "Hi there!"

    # 3. Pop item
    popped = await session.pop_item()
    assert popped is not None
    assert popped.get("content") == "Hi there!"
    retrieved_after_pop = await session.get_items()
    assert len(retrieved_after_pop) == 1
    assert retrieved_after_pop[0].get("content") == "Hello"

    # 4. Clear session
    await session.clear_session()
    retrieved_after_clear = await session.get_items()
    assert len(retrieved_after_clear) == 0


async def test_runner_integration(backend: Backend, agent: Agent):
    """Test that SQLAlchemySession works correctly with the agent Runner."""
    session_id = "runner_integration_test"
    session = backend.session(session_id)

    # First turn
    assert isinstance(agent.model, ScriptedModel)
    agent.model.enqueue([get_text_message("San Francisco")])
    result1 = await Runner.run(
        agent,
        "What city is the Golden Gate Bridge in?",
        session=session,
    )
    assert result1.final_output == "San Francisco"

    # Second turn
    agent.model.enqueue([get_text_message("California")])
    result2 = await Runner.run(agent, "What state is it in?", session=session)
    assert result2.final_output == "California"

    # Verify history was passed to the model on the second turn
    last_input = agent.model.calls[-1].input
    assert len(last_input) > 1
    assert any("Golden Gate Bridge" in str(item.get("content", "")) for item in last_input)


async def test_session_isolation(backend: Backend, agent: Agent):
    """Test that different session IDs result in isolated conversation histories."""
    session_id_1 = "session_1"
    session1 = backend.session(session_id_1)

    session_id_2 = "session_2"
    session2 = backend.session(session_id_2)

    # Interact with session 1
    assert isinstance(agent.model, ScriptedModel)
    agent.model.enqueue([get_text_message("I like cats.")])
    await Runner.run(agent, "I like cats.", session=session1)

    # Interact with session 2
    agent.model.enqueue([get_text_message("I like dogs.")])
    await Runner.run(agent, "I like dogs.", session=session2)

    # Go back to session 1 and check its memory
    agent.model.enqueue([get_text_message("You said you like cats.")])
    result = await Runner.run(agent, "What animal did I say I like?", session=session1)
    assert "cats" in result.final_output.lower()
    assert "dogs" not in result.final_output.lower()


async def test_get_items_with_limit(backend: Backend, agent: Agent):
    """Test the limit parameter in get_items."""
    session_id = "limit_test"
    session = backend.session(session_id)

    items: list[TResponseInputItem] = [
        {"role": "user", "content": "1"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "3"},
        {"role": "assistant", "content": "4"},
    ]
    await session.add_items(items)

    # Get last 2 items
    latest_2 = await session.get_items(limit=2)
    assert len(latest_2) == 2
    assert latest_2[0].get("content") == "3"
    assert latest_2[1].get("content") == "4"

    # Get all items
    all_items = await session.get_items()
    assert len(all_items) == 4

    # Get more than available
    more_than_all = await session.get_items(limit=10)
    assert len(more_than_all) == 4


async def test_pop_from_empty_session(backend: Backend):
    """Test that pop_item returns None on an empty session."""
    session = backend.session("empty_session")
    popped = await session.pop_item()
    assert popped is None


async def test_concurrent_pop_item_returns_each_row_once(backend: Backend):
    """Concurrent atomic DELETE claims must return each stored row at most once."""
    writer = backend.session("concurrent_pop")
    other = backend.session("concurrent_pop")
    await writer.add_items(
        [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "second"},
        ]
    )

    tasks = [asyncio.create_task(session.pop_item()) for session in (writer, other)]
    try:
        popped = await asyncio.wait_for(asyncio.gather(*tasks), timeout=2)
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    contents = {cast(dict[str, Any], item)["content"] for item in popped if item is not None}
    assert contents == {"first", "second"}


@pytest.mark.parametrize("operation", ["add", "pop", "clear"])
async def test_mutation_cancellation_waits_for_transaction_exit(
    backend: Backend,
    operation: str,
) -> None:
    """Cancellation must wait until the transaction context finishes settling.

    memorm: the task is cancelled twice as its unit of work's COMMIT starts (a
    ``commit`` listener), instead of inside a fake transaction's exit; the
    transaction has returned once its connection is back in the pool.
    """
    session = backend.session(f"transaction_cancellation_{operation}")
    if operation != "add":
        await session.add_items([{"role": "user", "content": "claimed"}])
    engine = backend.db.engine.sync_engine
    done_while_settling: list[bool] = []
    applied = transaction_returned = False
    task: asyncio.Task[Any]

    def transaction_applied(_connection: Any) -> None:
        nonlocal applied
        if applied:
            return
        applied = True
        loop = asyncio.get_running_loop()
        task.cancel()
        loop.call_soon(task.cancel)
        loop.call_soon(lambda: done_while_settling.append(task.done()))

    def transaction_exit(*_args: Any) -> None:
        nonlocal transaction_returned
        transaction_returned = True

    event.listen(engine, "commit", transaction_applied)
    event.listen(engine, "checkin", transaction_exit)

    if operation == "add":
        task = asyncio.create_task(session.add_items([{"role": "user", "content": "once"}]))
    elif operation == "pop":
        task = asyncio.create_task(session.pop_item())
    else:
        task = asyncio.create_task(session.clear_session())

    try:
        with pytest.raises(asyncio.CancelledError):
            await task
        assert done_while_settling == [False]
    finally:
        for name, listener in (("commit", transaction_applied), ("checkin", transaction_exit)):
            if event.contains(engine, name, listener):
                event.remove(engine, name, listener)
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    assert transaction_returned is True


async def test_get_items_limit_returns_fewer_when_history_exhausted(backend: Backend):
    """Window expansion stops at the end of history instead of looping."""
    session = backend.session("limit_exhausted")

    await session.add_items([{"role": "user", "content": "only valid"}])

    retrieved = await session.get_items(limit=5)
    assert [item.get("content") for item in retrieved] == ["only valid"]


async def test_add_empty_items_list(backend: Backend):
    """Test that adding an empty list of items is a no-op."""
    session_id = "add_empty_test"
    session = backend.session(session_id)

    initial_items = await session.get_items()
    assert len(initial_items) == 0

    await session.add_items([])

    items_after_add = await session.get_items()
    assert len(items_after_add) == 0


async def test_add_items_concurrent_first_access_with_create_tables(backend: Backend):
    """Concurrent first writes should not race table creation or drop items."""
    session = backend.session("concurrent_first_access", db=backend.db.clone())
    submitted = [f"msg-{i}" for i in range(25)]

    async def worker(content: str) -> None:
        await session.add_items([{"role": "user", "content": content}])

    try:
        results = await asyncio.gather(
            *(worker(content) for content in submitted),
            return_exceptions=True,
        )

        assert [result for result in results if isinstance(result, Exception)] == []

        stored = await session.get_items()
    finally:
        await session.db.dispose()
    assert len(stored) == len(submitted)
    stored_contents: list[str] = []
    for item in stored:
        content = item.get("content")
        assert isinstance(content, str)
        stored_contents.append(content)
    assert sorted(stored_contents) == sorted(submitted)


async def test_add_items_concurrent_first_write_after_tables_exist(backend: Backend):
    """Concurrent first writes should not race parent session creation."""
    setup_session = backend.session("concurrent_first_write")
    await setup_session.get_items()

    session = backend.session("concurrent_first_write", db=backend.db.clone())
    submitted = [f"msg-{i}" for i in range(25)]

    async def worker(content: str) -> None:
        await session.add_items([{"role": "user", "content": content}])

    try:
        results = await asyncio.gather(
            *(worker(content) for content in submitted),
            return_exceptions=True,
        )

        assert [result for result in results if isinstance(result, Exception)] == []

        stored = await session.get_items()
    finally:
        await session.db.dispose()
    assert len(stored) == len(submitted)
    stored_contents: list[str] = []
    for item in stored:
        content = item.get("content")
        assert isinstance(content, str)
        stored_contents.append(content)
    assert sorted(stored_contents) == sorted(submitted)


async def test_add_items_waits_for_transient_sqlite_write_lock(backend: Backend):
    """SQLite writes should wait briefly for a transient lock instead of failing.

    memorm: the lock is taken by a driver connection outside memorm: ``BEGIN
    IMMEDIATE`` on SQLite, on Postgres an EXCLUSIVE lock on memorm's tables.
    """
    session = backend.session("sqlite_write_lock_retry")
    await session.get_items()

    async with backend.raw_connection() as conn:
        await conn.take_write_lock()
        blocked_write = asyncio.create_task(session.add_items([{"role": "user", "content": "after-lock"}]))
        await asyncio.sleep(0.1)
        await conn.rollback()

    await asyncio.wait_for(blocked_write, timeout=5)

    stored = await session.get_items()
    assert len(stored) == 1
    assert stored[0].get("content") == "after-lock"


async def test_add_items_concurrent_first_access_across_sessions_with_shared_engine(backend: Backend):
    """Concurrent first writes should not race table creation across session instances."""
    session_a = backend.session("shared_engine_a")
    session_b = backend.session("shared_engine_b")

    results = await asyncio.gather(
        session_a.add_items([{"role": "user", "content": "one"}]),
        session_b.add_items([{"role": "user", "content": "two"}]),
        return_exceptions=True,
    )

    assert [result for result in results if isinstance(result, Exception)] == []

    stored_a = await session_a.get_items()
    assert len(stored_a) == 1
    assert stored_a[0].get("content") == "one"

    stored_b = await session_b.get_items()
    assert len(stored_b) == 1
    assert stored_b[0].get("content") == "two"


async def test_add_items_concurrent_first_access_across_from_url_sessions(backend: Backend):
    """Concurrent first writes should not race table creation across from_url sessions."""
    session_a = backend.session("from_url_a", db=backend.db.clone())
    session_b = backend.session("from_url_b", db=backend.db.clone())
    try:
        results = await asyncio.gather(
            session_a.add_items([{"role": "user", "content": "one"}]),
            session_b.add_items([{"role": "user", "content": "two"}]),
            return_exceptions=True,
        )

        assert [result for result in results if isinstance(result, Exception)] == []

        stored_a = await session_a.get_items()
        assert len(stored_a) == 1
        assert stored_a[0].get("content") == "one"

        stored_b = await session_b.get_items()
        assert len(stored_b) == 1
        assert stored_b[0].get("content") == "two"
    finally:
        await session_a.db.dispose()
        await session_b.db.dispose()


async def test_add_items_concurrent_first_access_across_from_url_sessions_cross_loop(backend: Backend):
    """Concurrent first writes should not race or hang across event loops."""
    barrier = threading.Barrier(2)
    results: list[tuple[str, str, Any]] = []
    results_lock = threading.Lock()

    def worker(session_id: str, content: str) -> None:
        async def run() -> tuple[str, Any]:
            session = backend.session(session_id, db=backend.db.clone())
            barrier.wait()
            try:
                await asyncio.wait_for(
                    session.add_items([{"role": "user", "content": content}]),
                    timeout=5,
                )
                stored = await session.get_items()
                return ("ok", stored)
            finally:
                await session.db.dispose()

        try:
            status, payload = asyncio.run(run())
        except Exception as exc:
            status, payload = type(exc).__name__, str(exc)

        with results_lock:
            results.append((session_id, status, payload))

    threads = [
        threading.Thread(target=worker, args=("from_url_cross_loop_a", "one")),
        threading.Thread(target=worker, args=("from_url_cross_loop_b", "two")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        await asyncio.to_thread(thread.join)

    assert len(results) == 2
    assert [status for _, status, _ in results] == ["ok", "ok"]

    stored_by_session = {
        session_id: cast(list[TResponseInputItem], payload) for session_id, _, payload in results
    }
    assert stored_by_session["from_url_cross_loop_a"][0].get("content") == "one"
    assert stored_by_session["from_url_cross_loop_b"][0].get("content") == "two"


async def test_add_items_concurrent_first_access_with_shared_session_cross_loop(backend: Backend):
    """A shared session instance should not hang when used from two event loops."""
    session = backend.session("shared_session_cross_loop")
    barrier = threading.Barrier(2)
    results: list[tuple[str, str]] = []
    results_lock = threading.Lock()

    def worker(content: str) -> None:
        async def run() -> None:
            barrier.wait()
            await asyncio.wait_for(
                session.add_items([{"role": "user", "content": content}]),
                timeout=5,
            )

        try:
            asyncio.run(run())
            status = "ok"
        except Exception as exc:
            status = type(exc).__name__

        with results_lock:
            results.append((content, status))

    threads = [
        threading.Thread(target=worker, args=("one",)),
        threading.Thread(target=worker, args=("two",)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        await asyncio.to_thread(thread.join)

    assert sorted(results) == [("one", "ok"), ("two", "ok")]

    stored = await session.get_items()
    stored_contents: list[str] = []
    for item in stored:
        content = item.get("content")
        assert isinstance(content, str)
        stored_contents.append(content)
    assert sorted(stored_contents) == ["one", "two"]


async def test_add_items_cancelled_waiter_does_not_strand_table_init_lock(backend: Backend):
    """Cancelling a waiting initializer must not leave the shared init lock acquired.

    memorm: the holder is a unit of work that has begun creating the
    waiter's session, so the waiter's first write waits for it (SQLite: the
    writer queue; Postgres: the unique key); the follower must get through
    once the holder ends.  The SDK's assertions on its private lock are gone.
    """
    waiter = backend.session("waiter")
    follower = backend.session("follower")

    async with backend.db.unit_of_work() as holder:
        await holder.sessions.get_or_create(backend.agent_id, "waiter")  # acquired
        try:
            blocked = asyncio.create_task(waiter.add_items([{"role": "user", "content": "waiter"}]))
            await asyncio.sleep(0.05)
            blocked.cancel()
            with pytest.raises(asyncio.CancelledError):
                await blocked
        finally:
            await holder.rollback()  # the holder releases, having written nothing

    await asyncio.wait_for(
        follower.add_items([{"role": "user", "content": "follower"}]),
        timeout=2,
    )
    stored = await follower.get_items()
    assert len(stored) == 1
    assert stored[0].get("content") == "follower"


async def test_get_items_same_timestamp_consistent_order(backend: Backend):
    """Test that items with identical timestamps keep insertion order.

    memorm: the timestamps are set in memorm's messages table; the SDK's
    reshuffling of its own query results has no counterpart.
    """
    session_id = "same_timestamp_test"
    session = backend.session(session_id)

    older_item = _make_message_item("older_same_ts", "old")
    reasoning_item = _make_reasoning_item("rs_same_ts", "...")
    message_item = _make_message_item("msg_same_ts", "...")
    await session.add_items([older_item])
    await session.add_items([reasoning_item, message_item])

    shared = datetime(2025, 10, 15, 17, 26, 39, 132483, tzinfo=timezone.utc)
    older = shared - timedelta(milliseconds=1)
    await backend.set_created_at(
        session_id, {"rs_same_ts": shared, "msg_same_ts": shared, "older_same_ts": older}
    )

    retrieved = await session.get_items()
    assert _item_ids(retrieved) == ["older_same_ts", "rs_same_ts", "msg_same_ts"]

    latest_two = await session.get_items(limit=2)
    assert _item_ids(latest_two) == ["rs_same_ts", "msg_same_ts"]


async def test_pop_item_same_timestamp_returns_latest(backend: Backend):
    """Test that pop_item returns the newest item when timestamps tie."""
    session_id = "same_timestamp_pop_test"
    session = backend.session(session_id)

    reasoning_item = _make_reasoning_item("rs_pop_same_ts", "...")
    message_item = _make_message_item("msg_pop_same_ts", "...")
    await session.add_items([reasoning_item, message_item])

    shared = datetime(2025, 10, 15, 17, 26, 39, 132483, tzinfo=timezone.utc)
    await backend.set_created_at(session_id, {"rs_pop_same_ts": shared, "msg_pop_same_ts": shared})

    popped = await session.pop_item()
    assert popped is not None
    assert cast(dict[str, Any], popped)["id"] == "msg_pop_same_ts"

    remaining = await session.get_items()
    assert _item_ids(remaining) == ["rs_pop_same_ts"]


@pytest.mark.parametrize("use_dictionary", [False, True], ids=["class", "dictionary"])
async def test_session_settings_from_url(backend: Backend, use_dictionary: bool):
    """Test passing session_settings via from_url."""
    from agents.memory import SessionSettings

    session = backend.session(
        "from_url_settings_test",
        session_settings={"limit": 5} if use_dictionary else SessionSettings(limit=5),
    )

    assert isinstance(session.session_settings, SessionSettings)
    assert session.session_settings.limit == 5
