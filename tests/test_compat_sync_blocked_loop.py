"""Sync bridges never deadlock: a sync call on a running loop's thread never waits for that loop.

A sync method called on the thread of a running event loop blocks that loop
until it returns.  If a task of that loop holds what the call needs (SQLite's
write lock, a Postgres row its open unit of work wrote, the schema check),
the call raises `BlockedLoopError` at once instead of waiting for ever.

Each scenario runs on a loop of its own, in a thread the test joins with a
timeout; a watchdog cancels a sync call that outlives `HANG` seconds, so a
regression fails the test instead of hanging the suite.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
from conftest import Store
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.base import empty_checkpoint

from memorm import Database, Message
from memorm.compat._sync import BRIDGE, adispose_sync
from memorm.compat.langchain import MemormChatMessageHistory
from memorm.compat.langgraph import MemormSaver, MemormStore
from memorm.errors import BlockedLoopError

pytestmark = pytest.mark.anyio

HANG = 10.0  # seconds after which a sync call counts as hung (it should answer in milliseconds)

# A task of the scenario's loop that holds something: it sets `held` once it does,
# and lets go once `done` is set.
Hold = Callable[[asyncio.Event, asyncio.Event], Coroutine[Any, Any, None]]


@dataclass
class Outcome:
    """What a sync call made on a running loop's thread did."""

    result: Any = None
    error: BaseException | None = None
    hung: bool = False  # the watchdog had to cancel it
    finished: bool = False  # the scenario's thread ended


def _free_bridge(outcome: Outcome) -> None:
    """Cancel the sync bridge's calls under way: a hung call returns (with CancelledError)."""
    outcome.hung = True
    loop = BRIDGE._loop
    assert loop is not None

    def cancel() -> None:
        for task in asyncio.all_tasks(loop):
            if getattr(task.get_coro(), "__name__", "") == "_call":
                task.cancel()

    loop.call_soon_threadsafe(cancel)


async def _on_own_loop(call: Callable[[], Any], hold: Hold | None = None) -> Outcome:
    """`call()` on the thread of a running loop, while a task of that loop runs `hold` (if given)."""
    outcome = Outcome()

    async def scenario() -> None:
        held, done = asyncio.Event(), asyncio.Event()
        holder = None if hold is None else asyncio.create_task(hold(held, done))
        if holder is not None:
            await held.wait()
        watchdog = threading.Timer(HANG, _free_bridge, (outcome,))
        watchdog.start()
        try:
            outcome.result = call()  # blocks this loop: `holder` runs no more until it returns
        except BaseException as error:
            outcome.error = error
        finally:
            watchdog.cancel()
            done.set()
            if holder is not None:
                await holder

    def run() -> None:
        asyncio.run(scenario())
        outcome.finished = True

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    await anyio.to_thread.run_sync(thread.join, 3 * HANG)
    assert not thread.is_alive(), "the scenario's thread hung"
    assert outcome.finished
    assert not outcome.hung, f"the sync call hung (cancelled after {HANG} s)"
    return outcome


@pytest.fixture
async def agent(db: Database) -> uuid.UUID:
    async with db.unit_of_work() as uow:
        return (await uow.agents.create("blocked")).id


@pytest.fixture(autouse=True)
async def _sync_pool_closed(db: Database) -> Any:
    yield
    await adispose_sync(db)


# -- LangChain's chat history --------------------------------------------------------


async def _contents(history: MemormChatMessageHistory) -> list[Any]:
    return [message.content for message in await history.aget_messages()]


async def test_add_messages_raises_at_once_while_a_task_of_its_loop_writes_that_session(
    db: Database, agent: uuid.UUID
) -> None:
    """SQLite: the task holds the write lock.  Postgres: its append holds the session's row."""
    history = MemormChatMessageHistory(db, "chat", agent=agent)
    await history.aadd_messages([HumanMessage("first")])
    session_id = history._session_id
    assert session_id is not None

    async def hold(held: asyncio.Event, done: asyncio.Event) -> None:
        async with db.unit_of_work() as uow:
            await uow.messages.append(session_id, [Message(role="user", content="held")])
            held.set()
            await done.wait()

    outcome = await _on_own_loop(lambda: history.add_messages([HumanMessage("sync")]), hold)
    assert isinstance(outcome.error, BlockedLoopError), outcome.error
    message = str(outcome.error)
    assert "MemormChatMessageHistory.add_messages()" in message
    assert "Await MemormChatMessageHistory.aadd_messages() instead" in message
    # The holder committed once its loop ran again; the refused call wrote nothing.
    assert await _contents(history) == ["first", "held"]


async def test_sync_history_calls_run_on_a_loop_that_holds_nothing(db: Database, agent: uuid.UUID) -> None:
    history = MemormChatMessageHistory(db, "chat", agent=agent)
    outcome = await _on_own_loop(lambda: history.add_messages([HumanMessage("alone")]))
    assert outcome.error is None

    # A read-only unit of work open on the loop holds nothing a write waits for.
    async def read(held: asyncio.Event, done: asyncio.Event) -> None:
        async with db.unit_of_work(read_only=True) as uow:
            assert await uow.sessions.get_by_key(agent, "chat") is not None
            held.set()
            await done.wait()

    outcome = await _on_own_loop(lambda: history.add_messages([HumanMessage("beside a reader")]), read)
    assert outcome.error is None
    # A read beside an open writer waits for nothing either.
    session_id = history._session_id
    assert session_id is not None

    async def write(held: asyncio.Event, done: asyncio.Event) -> None:
        async with db.unit_of_work() as uow:
            await uow.messages.append(session_id, [Message(role="user", content="written")])
            held.set()
            await done.wait()

    outcome = await _on_own_loop(lambda: [m.content for m in history.messages], write)
    assert outcome.error is None
    assert outcome.result == ["alone", "beside a reader"]
    assert await _contents(history) == ["alone", "beside a reader", "written"]


async def test_a_sync_read_raises_at_once_while_a_task_of_its_loop_checks_the_schema(
    db: Database, store: Store, agent: uuid.UUID
) -> None:
    """A lock across loops (here the schema check's) held by a task of the blocked loop."""
    fresh = store.database()  # no unit of work yet: the first one checks the schema, under a lock
    history = MemormChatMessageHistory(fresh, "chat", agent=agent)

    async def hold(held: asyncio.Event, done: asyncio.Event) -> None:
        checking = asyncio.create_task(fresh.check_schema())
        await asyncio.sleep(0)  # it takes the lock, then waits for the database
        assert fresh.backend._schema_lock.locked()
        held.set()
        await checking

    try:
        outcome = await _on_own_loop(lambda: history.messages, hold)
        assert isinstance(outcome.error, BlockedLoopError), outcome.error
        assert "the schema check" in str(outcome.error)
        assert "Await MemormChatMessageHistory.aget_messages() instead" in str(outcome.error)
        # Once the check is done, the same call runs.
        assert (await _on_own_loop(lambda: history.messages)).result == []
    finally:
        await adispose_sync(fresh)
        await fresh.dispose()


# -- LangGraph's saver and store, allow_blocking=True --------------------------------


def _thread(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


async def test_saver_put_raises_at_once_while_a_task_of_its_loop_writes_the_threads_session(
    db: Database, agent: uuid.UUID
) -> None:
    """SQLite: the write lock.  Postgres: the thread's session row, made and not yet committed."""
    saver = MemormSaver(db, agent=agent, allow_blocking=True)

    async def hold(held: asyncio.Event, done: asyncio.Event) -> None:
        async with db.unit_of_work() as uow:
            await uow.sessions.get_or_create(agent, "thread-1")
            held.set()
            await done.wait()

    checkpoint = empty_checkpoint()
    outcome = await _on_own_loop(lambda: saver.put(_thread("thread-1"), checkpoint, {}, {}), hold)  # type: ignore[arg-type]
    assert isinstance(outcome.error, BlockedLoopError), outcome.error
    assert "MemormSaver.put()" in str(outcome.error)
    assert "Await MemormSaver.aput() instead" in str(outcome.error)
    assert await saver.aget_tuple(_thread("thread-1")) is None  # type: ignore[arg-type]
    # With nothing held, the same call runs.
    outcome = await _on_own_loop(lambda: saver.put(_thread("thread-1"), checkpoint, {}, {}))  # type: ignore[arg-type]
    assert outcome.error is None
    found = await saver.aget_tuple(_thread("thread-1"))  # type: ignore[arg-type]
    assert found is not None
    assert found.checkpoint["id"] == checkpoint["id"]


async def test_store_put_raises_at_once_while_a_task_of_its_loop_holds_the_item(
    db: Database, agent: uuid.UUID
) -> None:
    """SQLite: the write lock.  Postgres: the item's row, locked by an open unit of work."""
    store = MemormStore(db, agent=agent, allow_blocking=True)
    await store.aput(("prefs",), "k", {"v": 0})

    async def hold(held: asyncio.Event, done: asyncio.Event) -> None:
        async with db.unit_of_work() as uow:
            await uow.graph_store.lock(agent, [("prefs", "k")])
            held.set()
            await done.wait()

    outcome = await _on_own_loop(lambda: store.put(("prefs",), "k", {"v": 1}), hold)
    assert isinstance(outcome.error, BlockedLoopError), outcome.error
    # LangGraph's sync `put` is its `batch`: the message names that.
    assert "MemormStore.batch()" in str(outcome.error)
    assert "Await MemormStore.abatch() instead" in str(outcome.error)
    item = await store.aget(("prefs",), "k")
    assert item is not None
    assert item.value == {"v": 0}
    # With nothing held, the same call runs.
    assert (await _on_own_loop(lambda: store.put(("prefs",), "k", {"v": 1}))).error is None
    item = await store.aget(("prefs",), "k")
    assert item is not None
    assert item.value == {"v": 1}


# -- what a loop holds: its writing units of work, counted until they close -----------


async def test_every_way_out_of_a_writing_unit_of_work_stops_counting_it(db: Database) -> None:
    """A count left behind would make every later sync call on this loop refuse for nothing."""
    state = db.engines.current()
    async with db.unit_of_work(read_only=True):
        assert state.writers == 0  # a read-only unit of work holds nothing a write waits for
    async with db.unit_of_work():
        assert state.writers == 1
    assert state.writers == 0
    with pytest.raises(ValueError, match="boom"):
        async with db.unit_of_work():
            raise ValueError("boom")
    assert state.writers == 0

    async def write_for_ever() -> None:
        async with db.unit_of_work():
            await asyncio.Event().wait()

    async with db.unit_of_work():
        # On SQLite it queues for the write lock this one holds; on Postgres it is open.
        waiting = asyncio.create_task(write_for_ever())
        await asyncio.sleep(0.05)
        assert state.writers == 2
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert state.writers == 1
    assert state.writers == 0
