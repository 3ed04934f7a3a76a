# Vendored from the OpenAI Agents SDK (openai-agents 0.24.0, source distribution),
# tests/memory/test_session.py; adapted to memorm as README.md here describes.
# Copyright (c) 2025 OpenAI. SPDX-License-Identifier: MIT (the SDK's LICENSE, whole, is beside this file).
"""Tests for session memory functionality.

The SDK's ``SQLiteSession`` tests, run on ``MemormSession`` over one memorm
``Database`` on SQLite and on Postgres.  Only the session's construction
changed (``backend.session(session_id)``), plus what the notes marked
"memorm:" say.  ``session.close()`` and the temporary directories are gone:
a ``MemormSession`` holds nothing, and the fixture disposes the database.
The SDK's sync tests (``asyncio.run`` in the test's thread) run their bodies
in a worker thread, since memorm's fixtures are async (anyio).

Not applicable to memorm (``SQLiteSession`` internals):

- test_sqlite_session_closed_rejects_empty_add_items: a ``MemormSession`` has
  no ``close()``; it holds no connection.
- test_sqlite_session_pop_item_skips_corrupt_most_recent,
  test_sqlite_session_pop_item_returns_none_after_dropping_only_corrupt_rows,
  test_sqlite_session_get_items_limit_skips_corrupt_newest_rows,
  test_sqlite_session_get_items_session_settings_limit_skips_corrupt_rows:
  memorm keeps items in a JSON column, checked on write, so no row holds
  unparsable JSON; a row that other code wrote reads as its equivalent items.
- test_sqlite_session_rollback_failure_evicts_connection,
  test_sqlite_session_close_retries_quarantined_connection: they plant a
  failing ``sqlite3.Connection`` in the SDK's private connection set.
- test_session_settings_resolve: tests ``SessionSettings`` alone, no session.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, cast

import anyio
import anyio.to_thread
import pytest
from agents import Agent, RunConfig, Runner, SessionSettings, TResponseInputItem
from agents.testing import ScriptedModel
from sqlalchemy import event
from sqlalchemy.orm import Session as OrmSession

from memorm.errors import SchemaError, ValidationError

from .backend import Backend
from .responses import get_text_message

pytestmark = pytest.mark.anyio


async def test_await_mutation_cancellation_hides_later_failure_without_loop_error(backend: Backend) -> None:
    """A failed mutation must not leak a false loop error after caller cancellation.

    memorm: the mutation is an ``add_items`` whose caller is cancelled as its
    COMMIT starts, and whose COMMIT then fails (a ``commit`` listener raises),
    instead of a coroutine handed to the SDK's private ``_await_mutation``.
    """
    loop = asyncio.get_running_loop()
    previous_exception_handler = loop.get_exception_handler()
    loop_errors: list[dict[str, Any]] = []
    session = backend.session("cancelled_then_failed")
    engine = backend.db.engine.sync_engine
    task: asyncio.Task[None]

    def cancel_then_fail(_connection: Any) -> None:
        task.cancel("caller-cancelled")
        raise RuntimeError("mutation failed")

    loop.set_exception_handler(lambda _loop, context: loop_errors.append(context))
    event.listen(engine, "commit", cancel_then_fail)
    task = asyncio.create_task(session.add_items([{"role": "user", "content": "lost"}]))
    try:
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0)
        assert loop_errors == []
    finally:
        event.remove(engine, "commit", cancel_then_fail)
        loop.set_exception_handler(previous_exception_handler)
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


# Helper functions for parametrized testing of different Runner methods
def _run_sync_wrapper(agent, input_data, **kwargs):
    """Wrapper for run_sync that properly sets up an event loop."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return Runner.run_sync(agent, input_data, **kwargs)
    finally:
        loop.close()


async def run_agent_async(runner_method: str, agent, input_data, **kwargs):
    """Helper function to run agent with different methods."""
    if runner_method == "run":
        return await Runner.run(agent, input_data, **kwargs)
    elif runner_method == "run_sync":
        # For run_sync, we need to run it in a thread with its own event loop
        return await asyncio.to_thread(_run_sync_wrapper, agent, input_data, **kwargs)
    elif runner_method == "run_streamed":
        result = Runner.run_streamed(agent, input_data, **kwargs)
        # For streaming, we first try to get at least one event to trigger any early exceptions
        # If there's an exception in setup (like memory validation), it will be raised here
        try:
            first_event = None
            async for event in result.stream_events():
                if first_event is None:
                    first_event = event
                # Continue consuming all events
                pass
        except Exception:
            # If an exception occurs during streaming, we let it propagate up
            raise
        return result
    else:
        raise ValueError(f"Unknown runner method: {runner_method}")


RUNNER_METHODS = pytest.mark.parametrize("runner_method", ["run", "run_sync", "run_streamed"])


# Parametrized tests for different runner methods
@RUNNER_METHODS
async def test_session_memory_basic_functionality_parametrized(backend: Backend, runner_method):
    """Test basic session memory functionality with SQLite backend across all runner methods."""
    session_id = "test_session_123"
    session = backend.session(session_id)

    model = ScriptedModel()
    agent = Agent(name="test", model=model)

    # First turn
    model.enqueue([get_text_message("San Francisco")])
    result1 = await run_agent_async(
        runner_method,
        agent,
        "What city is the Golden Gate Bridge in?",
        session=session,
    )
    assert result1.final_output == "San Francisco"

    # Second turn - should have conversation history
    model.enqueue([get_text_message("California")])
    result2 = await run_agent_async(
        runner_method,
        agent,
        "What state is it in?",
        session=session,
    )
    assert result2.final_output == "California"

    # Verify that the input to the second turn includes the previous conversation
    # The model should have received the full conversation history
    last_input = model.calls[-1].input
    assert len(last_input) > 1  # Should have more than just the current message


@RUNNER_METHODS
async def test_session_memory_with_explicit_instance_parametrized(backend: Backend, runner_method):
    """Test session memory with an explicit SQLiteSession instance across all runner methods."""
    session_id = "test_session_456"
    session = backend.session(session_id)

    model = ScriptedModel()
    agent = Agent(name="test", model=model)

    # First turn
    model.enqueue([get_text_message("Hello")])
    result1 = await run_agent_async(runner_method, agent, "Hi there", session=session)
    assert result1.final_output == "Hello"

    # Second turn
    model.enqueue([get_text_message("I remember you said hi")])
    result2 = await run_agent_async(
        runner_method,
        agent,
        "Do you remember what I said?",
        session=session,
    )
    assert result2.final_output == "I remember you said hi"


@RUNNER_METHODS
async def test_session_memory_disabled_parametrized(runner_method):
    """Test that session memory is disabled when session=None across all runner methods."""
    model = ScriptedModel()
    agent = Agent(name="test", model=model)

    # First turn (no session parameters = disabled)
    model.enqueue([get_text_message("Hello")])
    result1 = await run_agent_async(runner_method, agent, "Hi there")
    assert result1.final_output == "Hello"

    # Second turn - should NOT have conversation history
    model.enqueue([get_text_message("I don't remember")])
    result2 = await run_agent_async(runner_method, agent, "Do you remember what I said?")
    assert result2.final_output == "I don't remember"

    # Verify that the input to the second turn is just the current message
    last_input = model.calls[-1].input
    assert len(last_input) == 1  # Should only have the current message


@RUNNER_METHODS
async def test_session_memory_different_sessions_parametrized(backend: Backend, runner_method):
    """Test that different session IDs maintain separate conversation histories across all runner
    methods."""
    model = ScriptedModel()
    agent = Agent(name="test", model=model)

    # Session 1
    session_id_1 = "session_1"
    session_1 = backend.session(session_id_1)

    model.enqueue([get_text_message("I like cats")])
    result1 = await run_agent_async(runner_method, agent, "I like cats", session=session_1)
    assert result1.final_output == "I like cats"

    # Session 2 - different session
    session_id_2 = "session_2"
    session_2 = backend.session(session_id_2)

    model.enqueue([get_text_message("I like dogs")])
    result2 = await run_agent_async(runner_method, agent, "I like dogs", session=session_2)
    assert result2.final_output == "I like dogs"

    # Back to Session 1 - should remember cats, not dogs
    model.enqueue([get_text_message("Yes, you mentioned cats")])
    result3 = await run_agent_async(
        runner_method,
        agent,
        "What did I say I like?",
        session=session_1,
    )
    assert result3.final_output == "Yes, you mentioned cats"


async def test_sqlite_session_memory_direct(backend: Backend):
    """Test SQLiteSession class directly."""
    session_id = "direct_test"
    session = backend.session(session_id)

    # Test adding and retrieving items
    items: list[TResponseInputItem] = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there!"},
    ]

    await session.add_items(items)
    retrieved = await session.get_items()

    assert len(retrieved) == 2
    assert retrieved[0].get("role") == "user"
    assert retrieved[0].get("content") == "Hello"
    assert retrieved[1].get("role") == "assistant"
    assert retrieved[1].get("content") == "Hi there!"

    # Test clearing session
    await session.clear_session()
    retrieved_after_clear = await session.get_items()
    assert len(retrieved_after_clear) == 0


async def test_sqlite_session_close_closes_worker_thread_connections(backend: Backend):
    """Test that close cleans up connections opened by async worker threads.

    memorm: ``Database.dispose()`` closes the pools of every loop; the session holds none.
    """
    session = backend.session("worker_thread_close")

    await session.add_items([{"role": "user", "content": "Hello"}])
    connections = await backend.open_connections()

    assert connections

    await backend.db.dispose()

    assert await backend.open_connections(settled=0) == 0


async def test_sqlite_session_reaps_connections_from_exited_worker_threads(backend: Backend):
    """Test that a session closes connections owned by exited worker threads.

    memorm: an event loop's pool closes as ``asyncio.run`` shuts the loop down.
    """
    session = backend.session("exited_worker_threads")
    retained = await backend.open_connections()  # this test's loop keeps its own pool

    async def turn(content: str) -> int:
        await session.add_items([{"role": "user", "content": content}])
        return await backend.open_connections()

    def body() -> None:
        # Each asyncio.run shuts down its event loop, so the pool that served
        # the session closes and none of its connections outlive the turn.
        assert asyncio.run(turn("turn 0")) == retained + 1  # (abandoned,) = session._connections

        for turn_number in range(1, 5):
            asyncio.run(turn(f"turn {turn_number}"))
            assert asyncio.run(backend.open_connections(settled=retained)) == retained

        items = asyncio.run(session.get_items())
        assert [item["content"] for item in items] == [f"turn {turn}" for turn in range(5)]

    await anyio.to_thread.run_sync(body)


async def test_sqlite_session_closes_retired_connections_before_the_next_allocation(backend: Backend):
    """Test that connections left by a burst of retired workers close before the next one opens.

    memorm: three loops' pools are open at once; each closes as its loop ends,
    so none is open when the next loop opens its first connection.
    """
    session = backend.session("retired_workers")
    retained = await backend.open_connections()

    def body() -> None:
        # Each worker holds at the barrier until all of them have registered a
        # connection, so they retire together instead of one at a time.
        open_while_registered: list[int] = []
        registered = threading.Barrier(
            3, action=lambda: open_while_registered.append(asyncio.run(backend.open_connections()))
        )

        def serve_one_turn(index: int) -> None:
            async def turn() -> None:
                await session.add_items([{"role": "user", "content": f"worker {index}"}])
                await asyncio.to_thread(registered.wait)

            # asyncio.run waits for its executor to shut down, so this worker has
            # exited by the time the thread is joined.
            asyncio.run(turn())

        workers = [threading.Thread(target=serve_one_turn, args=(index,)) for index in range(3)]
        try:
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join(timeout=5)
                assert not worker.is_alive()

            assert open_while_registered == [retained + 3]  # retired = list(session._connections)

            retired_open_at_allocation: list[int] = []

            async def next_turn() -> None:
                retired = await backend.open_connections(settled=retained) - retained
                retired_open_at_allocation.append(retired)
                await session.add_items([{"role": "user", "content": "after they retired"}])

            asyncio.run(next_turn())

            # The replacement connection must not be allocated while the retired ones
            # still hold their descriptors.
            assert retired_open_at_allocation == [0]
            assert asyncio.run(backend.open_connections(settled=retained)) == retained

            # The workers write concurrently, so only the final turn has a fixed position.
            contents = [item["content"] for item in asyncio.run(session.get_items())]
            assert sorted(contents[:-1]) == ["worker 0", "worker 1", "worker 2"]
            assert contents[-1] == "after they retired"
        finally:
            registered.abort()
            for worker in workers:
                worker.join(timeout=5)

    await anyio.to_thread.run_sync(body)


async def test_sqlite_session_keeps_connections_of_live_worker_threads(backend: Backend):
    """Test that connections owned by running worker threads are never closed.

    memorm: the pool of a loop that still runs keeps its connection, open and pooled.
    """
    session = backend.session("live_worker_threads")
    # A second running loop has its own default executor, so its worker is a
    # different thread that stays alive for as long as that loop does.
    other_loop = asyncio.new_event_loop()
    other_thread = threading.Thread(target=other_loop.run_forever)
    other_thread.start()

    async def pooled() -> int:  # connections in the running loop's pool
        return backend.db.engine.pool.checkedin()

    try:
        asyncio.run_coroutine_threadsafe(
            session.add_items([{"role": "user", "content": "from the other loop"}]),
            other_loop,
        ).result(timeout=5)
        held = asyncio.run_coroutine_threadsafe(pooled(), other_loop).result(timeout=5)
        assert held == 1  # (held,) = session._connections

        # Registering from this loop's worker sweeps while the other worker lives.
        await session.add_items([{"role": "user", "content": "from this loop"}])

        assert asyncio.run_coroutine_threadsafe(pooled(), other_loop).result(timeout=5) == held
        assert await backend.open_connections() == await pooled() + held  # held.execute("SELECT 1")

        items = await session.get_items()
        assert [item["content"] for item in items] == [
            "from the other loop",
            "from this loop",
        ]
    finally:
        other_loop.call_soon_threadsafe(other_loop.stop)
        other_thread.join(timeout=5)
        other_loop.close()


async def test_sqlite_session_memory_pop_item(backend: Backend):
    """Test SQLiteSession pop_item functionality."""
    session_id = "pop_test"
    session = backend.session(session_id)

    # Test popping from empty session
    popped = await session.pop_item()
    assert popped is None

    # Add items
    items: list[TResponseInputItem] = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there!"},
        {"role": "user", "content": "How are you?"},
    ]

    await session.add_items(items)

    # Verify all items are there
    retrieved = await session.get_items()
    assert len(retrieved) == 3

    # Pop the most recent item
    popped = await session.pop_item()
    assert popped is not None
    assert popped.get("role") == "user"
    assert popped.get("content") == "How are you?"

    # Verify item was removed
    retrieved_after_pop = await session.get_items()
    assert len(retrieved_after_pop) == 2
    assert retrieved_after_pop[-1].get("content") == "Hi there!"

    # Pop another item
    popped2 = await session.pop_item()
    assert popped2 is not None
    assert popped2.get("role") == "assistant"
    assert popped2.get("content") == "Hi there!"

    # Pop the last item
    popped3 = await session.pop_item()
    assert popped3 is not None
    assert popped3.get("role") == "user"
    assert popped3.get("content") == "Hello"

    # Try to pop from empty session again
    popped4 = await session.pop_item()
    assert popped4 is None

    # Verify session is empty
    final_items = await session.get_items()
    assert len(final_items) == 0


async def test_session_memory_pop_different_sessions(backend: Backend):
    """Test that pop_item only affects the specified session."""
    session_1_id = "session_1"
    session_2_id = "session_2"
    session_1 = backend.session(session_1_id)
    session_2 = backend.session(session_2_id)

    # Add items to both sessions
    items_1: list[TResponseInputItem] = [
        {"role": "user", "content": "Session 1 message"},
    ]
    items_2: list[TResponseInputItem] = [
        {"role": "user", "content": "Session 2 message 1"},
        {"role": "user", "content": "Session 2 message 2"},
    ]

    await session_1.add_items(items_1)
    await session_2.add_items(items_2)

    # Pop from session 2
    popped = await session_2.pop_item()
    assert popped is not None
    assert popped.get("content") == "Session 2 message 2"

    # Verify session 1 is unaffected
    session_1_items = await session_1.get_items()
    assert len(session_1_items) == 1
    assert session_1_items[0].get("content") == "Session 1 message"

    # Verify session 2 has one item left
    session_2_items = await session_2.get_items()
    assert len(session_2_items) == 1
    assert session_2_items[0].get("content") == "Session 2 message 1"


async def test_sqlite_session_get_items_with_limit(backend: Backend):
    """Test SQLiteSession get_items with limit parameter."""
    session_id = "count_test"
    session = backend.session(session_id)

    # Add multiple items
    items: list[TResponseInputItem] = [
        {"role": "user", "content": "Message 1"},
        {"role": "assistant", "content": "Response 1"},
        {"role": "user", "content": "Message 2"},
        {"role": "assistant", "content": "Response 2"},
        {"role": "user", "content": "Message 3"},
        {"role": "assistant", "content": "Response 3"},
    ]

    await session.add_items(items)

    # Test getting all items (default behavior)
    all_items = await session.get_items()
    assert len(all_items) == 6
    assert all_items[0].get("content") == "Message 1"
    assert all_items[-1].get("content") == "Response 3"

    # Test getting latest 2 items
    latest_2 = await session.get_items(limit=2)
    assert len(latest_2) == 2
    assert latest_2[0].get("content") == "Message 3"
    assert latest_2[1].get("content") == "Response 3"

    # Test getting latest 4 items
    latest_4 = await session.get_items(limit=4)
    assert len(latest_4) == 4
    assert latest_4[0].get("content") == "Message 2"
    assert latest_4[1].get("content") == "Response 2"
    assert latest_4[2].get("content") == "Message 3"
    assert latest_4[3].get("content") == "Response 3"

    # Test getting more items than available
    latest_10 = await session.get_items(limit=10)
    assert len(latest_10) == 6  # Should return all available items
    assert latest_10[0].get("content") == "Message 1"
    assert latest_10[-1].get("content") == "Response 3"

    # Test getting 0 items
    latest_0 = await session.get_items(limit=0)
    assert len(latest_0) == 0


@RUNNER_METHODS
async def test_session_memory_appends_list_input_by_default(backend: Backend, runner_method):
    """Test that list inputs are appended to session history when no callback is provided."""
    session_id = "test_validation_parametrized"
    session = backend.session(session_id)

    model = ScriptedModel()
    agent = Agent(name="test", model=model)

    initial_history: list[TResponseInputItem] = [
        {"role": "user", "content": "Earlier message"},
        {"role": "assistant", "content": "Saved reply"},
    ]
    await session.add_items(initial_history)

    list_input = [{"role": "user", "content": "Test message"}]

    model.enqueue([get_text_message("This should run")])
    await run_agent_async(runner_method, agent, list_input, session=session)

    assert model.calls[-1].input == initial_history + list_input


@RUNNER_METHODS
async def test_session_callback_prepared_input(backend: Backend, runner_method):
    """Test if the user passes a list of items and want to append them."""
    model = ScriptedModel()
    agent = Agent(name="test", model=model)

    # Session
    session_id = "session_1"
    session = backend.session(session_id)

    # Add first messages manually
    initial_history: list[TResponseInputItem] = [
        {"role": "user", "content": "Hello there."},
        {"role": "assistant", "content": "Hi, I'm here to assist you."},
    ]
    await session.add_items(initial_history)

    def filter_assistant_messages(history, new_input):
        # Only include user messages from history
        return [item for item in history if item["role"] == "user"] + new_input

    new_turn_input = [{"role": "user", "content": "What your name?"}]
    model.enqueue([get_text_message("I'm gpt-4o")])

    # Run the agent with the callable
    await run_agent_async(
        runner_method,
        agent,
        new_turn_input,
        session=session,
        run_config=RunConfig(session_input_callback=filter_assistant_messages),
    )

    expected_model_input = [
        initial_history[0],  # From history
        new_turn_input[0],  # New input
    ]

    assert len(model.calls[-1].input) == 2
    assert model.calls[-1].input == expected_model_input


@RUNNER_METHODS
async def test_session_callback_repeating_history_does_not_grow_session(backend: Backend, runner_method):
    model = ScriptedModel()
    agent = Agent(name="test", model=model)
    session = backend.session("session_repeat")

    def repeat_first(history, new_input):
        if not history:
            return new_input
        return history + [history[0]] + new_input  # noqa: RUF005

    for turn in range(3):
        model.enqueue([get_text_message(f"assistant {turn}")])
        await run_agent_async(
            runner_method,
            agent,
            f"user {turn}",
            session=session,
            run_config=RunConfig(session_input_callback=repeat_first),
        )

    stored = await session.get_items()
    user_messages = [item for item in stored if item.get("role") == "user"]
    assert [item.get("content") for item in user_messages] == [
        "user 0",
        "user 1",
        "user 2",
    ]
    assert len(stored) == 6


async def test_sqlite_session_unicode_content(backend: Backend):
    """Test that session correctly stores and retrieves unicode/non-ASCII content."""
    session_id = "unicode_test"
    session = backend.session(session_id)

    # Add unicode content to the session
    items: list[TResponseInputItem] = [
        {"role": "user", "content": "こんにちは"},
        {"role": "assistant", "content": "😊👍"},
        {"role": "user", "content": "Привет"},
    ]
    await session.add_items(items)

    # Retrieve items and verify unicode content
    retrieved = await session.get_items()
    assert retrieved[0].get("content") == "こんにちは"
    assert retrieved[1].get("content") == "😊👍"
    assert retrieved[2].get("content") == "Привет"


async def test_sqlite_session_special_characters_and_sql_injection(backend: Backend):
    """
    Test that session safely stores and retrieves items with special characters and SQL keywords.
    """
    session_id = "special_chars_test"
    session = backend.session(session_id)

    # Add items with special characters and SQL keywords
    items: list[TResponseInputItem] = [
        {"role": "user", "content": "O'Reilly"},
        {"role": "assistant", "content": "DROP TABLE sessions;"},
        {"role": "user", "content": ('"SELECT * FROM users WHERE name = "admin";"')},
        {"role": "assistant", "content": "Robert'); DROP TABLE students;--"},
        {"role": "user", "content": "Normal message"},
    ]
    await session.add_items(items)

    # Retrieve all items and verify they are stored correctly
    retrieved = await session.get_items()
    assert len(retrieved) == len(items)
    assert retrieved[0].get("content") == "O'Reilly"
    assert retrieved[1].get("content") == "DROP TABLE sessions;"
    assert retrieved[2].get("content") == '"SELECT * FROM users WHERE name = "admin";"'
    assert retrieved[3].get("content") == "Robert'); DROP TABLE students;--"
    assert retrieved[4].get("content") == "Normal message"


async def test_sqlite_session_concurrent_access(backend: Backend):
    """
    Test concurrent access to the same session to verify data integrity.
    """
    import concurrent.futures

    session_id = "concurrent_test"
    session = backend.session(session_id)

    # Add initial item
    items: list[TResponseInputItem] = [{"role": "user", "content": f"Message {i}"} for i in range(10)]

    # Use ThreadPoolExecutor to simulate concurrent writes
    def add_item(item):
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        loop.run_until_complete(session.add_items([item]))
        loop.close()

    with concurrent.futures.ThreadPoolExecutor(max_workers=5) as executor:
        executor.map(add_item, items)

    # Retrieve all items and verify all are present
    retrieved = await session.get_items()
    contents = {
        content for item in retrieved for content in [item.get("content")] if isinstance(content, str)
    }
    expected = {f"Message {i}" for i in range(10)}
    assert contents == expected


async def test_sqlite_session_file_lock_is_shared_across_instances(backend: Backend):
    """File-backed sessions pointing at the same DB path should reuse one process-local lock.

    memorm: sessions on one ``Database`` share its writer queue (SQLite) and
    pool; the SDK's assertions on its private lock table have no counterpart.
    """
    session_1 = backend.session("session_1")
    session_2 = backend.session("session_2")

    await asyncio.gather(
        session_1.add_items([{"role": "user", "content": "session_1"}]),
        session_2.add_items([{"role": "user", "content": "session_2"}]),
    )

    assert [item.get("content") for item in await session_1.get_items()] == ["session_1"]
    assert [item.get("content") for item in await session_2.get_items()] == ["session_2"]


async def test_sqlite_session_failed_add_items_releases_write_lock(backend: Backend):
    """A failed add_items must not leave an open write transaction on the cached connection."""
    session = backend.session("rollback_test")

    # memorm: an item that is not JSON is a ValidationError (the SDK's TypeError),
    # raised before the first statement.
    unserializable = cast(TResponseInputItem, {"role": "user", "content": object()})
    with pytest.raises(ValidationError):
        await session.add_items([unserializable])

    # memorm: the probe is another connection taking the write lock at once (SQLite),
    # or no backend of the database left inside a transaction (Postgres).
    assert await backend.write_lock_is_free()
    rolled_back = await backend.stored_sessions("rollback_test")

    assert rolled_back == 0

    # The session must remain usable after the failure.
    await session.add_items([{"role": "user", "content": "after failure"}])
    assert [item.get("content") for item in await session.get_items()] == ["after failure"]


async def test_session_add_items_exception_propagates_in_streamed(backend: Backend):
    """Test that exceptions from session.add_items are properly propagated
    in run_streamed instead of causing the stream to hang forever.
    Regression test for https://github.com/openai/openai-agents-python/issues/2130
    """
    session = backend.session("test_exception_session")

    async def _failing_add_items(_items):
        raise RuntimeError("Simulated session.add_items failure")

    session.add_items = _failing_add_items  # type: ignore[method-assign]

    model = ScriptedModel()
    agent = Agent(name="test", model=model)
    model.enqueue([get_text_message("This should not be reached")])

    result = Runner.run_streamed(agent, "Hello", session=session)

    async def consume_stream():
        async for _event in result.stream_events():
            pass

    with pytest.raises(RuntimeError, match="Simulated session.add_items failure"):  # noqa: RUF043
        # Timeout ensures test fails fast instead of hanging forever if bug regresses
        await asyncio.wait_for(consume_stream(), timeout=5.0)


# ============================================================================
# SessionSettings Tests
# ============================================================================


async def test_session_settings_default(backend: Backend):
    """Test that session_settings defaults to empty SessionSettings."""
    from agents.memory import SessionSettings

    session = backend.session("default_settings_test")

    # Should have default SessionSettings
    assert isinstance(session.session_settings, SessionSettings)
    assert session.session_settings.limit is None


async def test_session_settings_constructor(backend: Backend):
    """Test passing session_settings via constructor."""
    from agents.memory import SessionSettings

    session = backend.session("constructor_settings_test", session_settings=SessionSettings(limit=5))

    assert session.session_settings is not None
    assert session.session_settings.limit == 5


async def test_session_settings_constructor_normalizes_dictionary(backend: Backend) -> None:
    session = backend.session("dictionary_settings_test", session_settings={"limit": 0})

    assert isinstance(session.session_settings, SessionSettings)
    assert session.session_settings.limit == 0
    assert session.session_settings.resolve({"limit": 4}).limit == 4


async def test_session_settings_rejects_unknown_dictionary_fields(backend: Backend) -> None:
    with pytest.raises(TypeError, match="Unknown session settings: limitt"):
        backend.session("invalid_settings_test", session_settings={"limitt": 1})


async def test_get_items_uses_session_settings_limit(backend: Backend):
    """Test that get_items uses session_settings.limit as default."""
    from agents.memory import SessionSettings

    session = backend.session("uses_settings_limit_test", session_settings=SessionSettings(limit=3))

    # Add 5 items
    items: list[TResponseInputItem] = [{"role": "user", "content": f"Message {i}"} for i in range(5)]
    await session.add_items(items)

    # get_items() with no limit should use session_settings.limit=3
    retrieved = await session.get_items()
    assert len(retrieved) == 3
    # Should get the last 3 items
    assert retrieved[0].get("content") == "Message 2"
    assert retrieved[1].get("content") == "Message 3"
    assert retrieved[2].get("content") == "Message 4"


async def test_get_items_explicit_limit_overrides_session_settings(backend: Backend):
    """Test that explicit limit parameter overrides session_settings."""
    from agents.memory import SessionSettings

    session = backend.session("explicit_override_test", session_settings=SessionSettings(limit=5))

    # Add 10 items
    items: list[TResponseInputItem] = [{"role": "user", "content": f"Message {i}"} for i in range(10)]
    await session.add_items(items)

    # Explicit limit=2 should override session_settings.limit=5
    retrieved = await session.get_items(limit=2)
    assert len(retrieved) == 2
    assert retrieved[0].get("content") == "Message 8"
    assert retrieved[1].get("content") == "Message 9"


async def test_runner_with_session_settings_override(backend: Backend):
    """Test that RunConfig can override session's default settings."""
    from agents.memory import SessionSettings

    # Session with default limit=100
    session = backend.session("runner_override_test", session_settings=SessionSettings(limit=100))

    # Add some history
    items: list[TResponseInputItem] = [{"role": "user", "content": f"Turn {i}"} for i in range(10)]
    await session.add_items(items)

    model = ScriptedModel()
    agent = Agent(name="test", model=model)
    model.enqueue([get_text_message("Got it")])

    await Runner.run(
        agent,
        "New question",
        session=session,
        run_config=RunConfig(
            session_settings=SessionSettings(limit=2)  # Override to 2
        ),
    )

    # Verify the agent received only the last 2 history items + new question
    last_input = model.calls[-1].input
    # Filter out the new "New question" input
    history_items = [item for item in last_input if item.get("content") != "New question"]
    # Should have 2 history items (last two from the 10 we added)
    assert len(history_items) == 2


async def test_sqlite_session_failed_clear_session_rolls_back(backend: Backend):
    """A failed clear must restore earlier statements and release the cached write lock."""
    session = backend.session("clear_rollback")
    await session.add_items([{"role": "user", "content": "kept"}])

    await backend.drop_table("sessions")  # memorm's agent_sessions

    with pytest.raises(SchemaError):  # memorm: sqlite3.OperationalError, translated
        await session.clear_session()

    assert backend.db.engine.pool.checkedout() == 0  # not conn.in_transaction for each connection
    assert await backend.write_lock_is_free()


async def test_sqlite_session_failed_pop_item_releases_write_lock(backend: Backend):
    """A failed pop must not leave a write transaction on the cached connection."""
    session = backend.session("pop_rollback")
    await session.add_items([{"role": "user", "content": "kept"}])

    await backend.drop_table("messages")  # memorm's agent_messages

    with pytest.raises(SchemaError):  # memorm: sqlite3.OperationalError, translated
        await session.pop_item()

    assert backend.db.engine.pool.checkedout() == 0  # not conn.in_transaction for each connection
    assert await backend.write_lock_is_free()


@pytest.mark.parametrize("operation", ["add", "pop", "clear"])
async def test_sqlite_session_post_commit_cancellation_propagates_after_known_outcome(
    backend: Backend,
    operation: str,
):
    """Cancellation after a worker commit must propagate without inviting a retry.

    memorm: the cancellation arrives as the unit of work's COMMIT returns
    (SQLAlchemy's ``after_commit``), instead of from a pausing sqlite3 connection.
    """
    session = backend.session(f"post_commit_{operation}")
    item: TResponseInputItem = {"role": "user", "content": "once"}
    if operation != "add":
        await session.add_items([item])

    mutation: asyncio.Task[Any]
    committed = False

    def cancel_after_commit(orm_session: OrmSession) -> None:
        nonlocal committed
        if committed or orm_session.in_nested_transaction():  # cancelled already; a savepoint
            return
        committed = True
        mutation.cancel()
        asyncio.get_running_loop().call_soon(mutation.cancel)

    event.listen(OrmSession, "after_commit", cancel_after_commit)

    if operation == "add":
        mutation = asyncio.create_task(session.add_items([item]))
    elif operation == "pop":
        mutation = asyncio.create_task(session.pop_item())
    else:
        mutation = asyncio.create_task(session.clear_session())

    try:
        with pytest.raises(asyncio.CancelledError):
            await mutation
    finally:
        event.remove(OrmSession, "after_commit", cancel_after_commit)
        if not mutation.done():
            mutation.cancel()
            await asyncio.gather(mutation, return_exceptions=True)

    if operation == "add":
        assert await session.get_items() == [item]
    elif operation == "pop":
        assert await session.get_items() == []
    else:
        assert await session.get_items() == []
    assert mutation.cancelled()
