"""Real LangGraph graphs on MemormSaver: restarts, human in the loop, time travel, tenants, sync use."""

from __future__ import annotations

import asyncio
import operator
import re
import uuid
from typing import Annotated, Any

import anyio
import pytest
import sqlalchemy as sa
from conftest import Store
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from probes import count_sqlite_hops
from typing_extensions import TypedDict

from memorm import Database, NotFoundError, ValidationError
from memorm.compat.langgraph import BlockingCallError, MemormSaver
from memorm.repositories.checkpoints import CheckpointKey, StoredWrite
from memorm.testing import capture_statements
from memorm.uow import UnitOfWork

pytestmark = pytest.mark.anyio


class State(TypedDict):
    steps: Annotated[list[str], operator.add]
    count: int


def _count(state: State) -> dict[str, Any]:
    return {"steps": ["count"], "count": state.get("count", 0) + 1}


def _double(state: State) -> dict[str, Any]:
    return {"steps": ["double"], "count": state["count"] * 2}


def _ask(state: State) -> dict[str, Any]:
    answer = interrupt({"question": "approve?", "count": state["count"]})
    return {"steps": [f"asked:{answer}"]}


def counter() -> StateGraph[State]:
    """START -> count -> double -> END: plain Python nodes, no model, no network."""
    builder = StateGraph(State)
    builder.add_node("count", _count)
    builder.add_node("double", _double)
    builder.add_edge(START, "count")
    builder.add_edge("count", "double")
    builder.add_edge("double", END)
    return builder


def approval() -> StateGraph[State]:
    """START -> count -> ask (waits for a human) -> double -> END."""
    builder = StateGraph(State)
    builder.add_node("count", _count)
    builder.add_node("ask", _ask)
    builder.add_node("double", _double)
    builder.add_edge(START, "count")
    builder.add_edge("count", "ask")
    builder.add_edge("ask", "double")
    builder.add_edge("double", END)
    return builder


def thread(name: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": name}}


async def _agent(db: Database, name: str = "graph") -> uuid.UUID:
    async with db.unit_of_work() as uow:
        return (await uow.agents.create(name)).id


async def test_a_graph_resumes_its_thread_after_a_restart(db: Database, store: Store) -> None:
    agent = await _agent(db)
    graph = counter().compile(checkpointer=MemormSaver(db, agent=agent))
    first = await graph.ainvoke({"steps": [], "count": 1}, thread("t-1"))
    assert first == {"steps": ["count", "double"], "count": 4}
    await db.dispose()

    async with store.database() as again:  # a new process: a new Database on the same store
        graph = counter().compile(checkpointer=MemormSaver(again, agent=agent))
        state = await graph.aget_state(thread("t-1"))
        assert state.values == first
        second = await graph.ainvoke({"steps": ["again"]}, thread("t-1"))
        assert second == {"steps": ["count", "double", "again", "count", "double"], "count": 10}
        assert (await graph.aget_state(thread("other"))).values == {}
        async with again.unit_of_work(read_only=True) as uow:  # the thread is the agent's session "t-1"
            chat = await uow.sessions.get_by_key(agent, "t-1")
            assert chat is not None


async def test_an_interrupted_graph_waits_for_a_human_and_resumes_with_the_answer(
    db: Database, store: Store
) -> None:
    agent = await _agent(db)
    graph = approval().compile(checkpointer=MemormSaver(db, agent=agent))
    paused = await graph.ainvoke({"steps": [], "count": 2}, thread("review"))
    assert paused["__interrupt__"][0].value == {"question": "approve?", "count": 3}
    state = await graph.aget_state(thread("review"))
    assert state.next == ("ask",)
    await db.dispose()

    async with store.database() as again:  # the human answers later, in another process
        graph = approval().compile(checkpointer=MemormSaver(again, agent=agent))
        done = await graph.ainvoke(Command(resume="yes"), thread("review"))
        assert done == {"steps": ["count", "asked:yes", "double"], "count": 6}
        assert (await graph.aget_state(thread("review"))).next == ()


async def test_time_travel_replays_and_forks_from_an_earlier_checkpoint(db: Database) -> None:
    agent = await _agent(db)
    graph = counter().compile(checkpointer=MemormSaver(db, agent=agent))
    await graph.ainvoke({"steps": [], "count": 1}, thread("travel"))
    history = [snapshot async for snapshot in graph.aget_state_history(thread("travel"))]
    assert [snapshot.next for snapshot in history] == [(), ("double",), ("count",), ("__start__",)]
    before_double = history[1]
    assert before_double.values == {"steps": ["count"], "count": 2}

    replayed = await graph.ainvoke(None, before_double.config)  # replay from there
    assert replayed == {"steps": ["count", "double"], "count": 4}
    forked = await graph.aupdate_state(before_double.config, {"count": 50})  # fork: change the past
    result = await graph.ainvoke(None, forked)
    assert result == {"steps": ["count", "double"], "count": 100}
    assert (await graph.aget_state(thread("travel"))).values["count"] == 100
    # The original timeline is still there to go back to.
    assert (await graph.aget_state(history[0].config)).values == {"steps": ["count", "double"], "count": 4}
    limited = [s async for s in graph.aget_state_history(thread("travel"), limit=2)]
    assert len(limited) == 2


def with_subgraph() -> StateGraph[State]:
    """START -> count -> inner (the counter graph as a subgraph: count, double) -> END."""
    builder = StateGraph(State)
    builder.add_node("count", _count)
    builder.add_node("inner", counter().compile())  # inherits the parent's checkpointer
    builder.add_edge(START, "count")
    builder.add_edge("count", "inner")
    builder.add_edge("inner", END)
    return builder


async def test_time_travel_replays_and_forks_a_graph_with_a_subgraph(db: Database) -> None:
    # LangGraph replays a subgraph by listing its checkpoints `before` a config that names
    # the parent's checkpoint and no thread: read as LangGraph's own savers read it.
    agent = await _agent(db)
    graph = with_subgraph().compile(checkpointer=MemormSaver(db, agent=agent))
    # The subgraph returns its whole state: its steps are added to the parent's.
    steps = ["count", "count", "count", "double"]
    assert await graph.ainvoke({"steps": [], "count": 1}, thread("nested")) == {"steps": steps, "count": 6}
    history = [snapshot async for snapshot in graph.aget_state_history(thread("nested"))]
    before_inner = next(snapshot for snapshot in history if snapshot.next == ("inner",))
    assert before_inner.values == {"steps": ["count"], "count": 2}

    replayed = await graph.ainvoke(None, before_inner.config)
    assert replayed == {"steps": steps, "count": 6}
    forked = await graph.aupdate_state(before_inner.config, {"count": 10})
    assert await graph.ainvoke(None, forked) == {"steps": steps, "count": 22}

    saver = MemormSaver(db, agent=agent)
    newest = history[0].config["configurable"]["checkpoint_id"]
    older = [
        item
        async for item in saver.alist(thread("nested"), before={"configurable": {"checkpoint_id": newest}})
    ]
    assert newest not in [item.config["configurable"]["checkpoint_id"] for item in older]
    assert len(older) >= len(history) - 1
    with pytest.raises(ValidationError, match=r"before: configurable\.checkpoint_id must be a string"):
        [item async for item in saver.alist(thread("nested"), before={"configurable": {"checkpoint_id": 7}})]


async def test_two_tenants_threads_never_see_each_other(db: Database) -> None:
    acme, globex = db.for_tenant("acme"), db.for_tenant("globex")
    acme_agent, globex_agent = await _agent(acme), await _agent(globex)
    acme_graph = counter().compile(checkpointer=MemormSaver(acme, agent=acme_agent))
    globex_graph = counter().compile(checkpointer=MemormSaver(globex, agent=globex_agent))
    await acme_graph.ainvoke({"steps": [], "count": 1}, thread("shared-name"))
    assert (await globex_graph.aget_state(thread("shared-name"))).values == {}
    await globex_graph.ainvoke({"steps": [], "count": 7}, thread("shared-name"))
    assert (await acme_graph.aget_state(thread("shared-name"))).values["count"] == 4
    assert (await globex_graph.aget_state(thread("shared-name"))).values["count"] == 16

    # Another tenant's agent id is an unknown agent: nothing to read, and no thread to write.
    intruder = MemormSaver(globex, agent=acme_agent)
    assert await intruder.aget_tuple(thread("shared-name")) is None
    assert [t async for t in intruder.alist(None)] == []
    with pytest.raises(NotFoundError):
        await counter().compile(checkpointer=intruder).ainvoke({"steps": [], "count": 1}, thread("x"))
    await intruder.adelete_thread("shared-name")
    assert (await acme_graph.aget_state(thread("shared-name"))).values["count"] == 4


async def test_deleting_the_session_deletes_the_graph_state_and_delete_thread_keeps_the_session(
    db: Database,
) -> None:
    agent = await _agent(db)
    saver = MemormSaver(db, agent=agent)
    graph = counter().compile(checkpointer=saver)
    for name in ("kept", "gone"):
        await graph.ainvoke({"steps": [], "count": 1}, thread(name))
    async with db.unit_of_work() as uow:
        chat = await uow.sessions.get_by_key(agent, "gone")
        assert chat is not None
        await uow.sessions.delete(chat.id)
    assert await saver.aget_tuple(thread("gone")) is None
    assert await saver.aget_tuple(thread("kept")) is not None

    await saver.adelete_thread("kept")
    assert await saver.aget_tuple(thread("kept")) is None
    async with db.unit_of_work(read_only=True) as uow:
        assert await uow.sessions.get_by_key(agent, "kept") is not None


@pytest.mark.parametrize("ttl", [None, 3600], ids=["no-ttl", "ttl"])
async def test_a_thread_whose_session_was_deleted_meanwhile_starts_again_in_a_new_session(
    db: Database, ttl: int | None
) -> None:
    # The saver remembers each thread's session; a session deleted behind its back
    # (another server, a purge) must not fail its next write or lose it.
    agent = await _agent(db)
    saver = MemormSaver(db, agent=agent, ttl=ttl)
    graph = counter().compile(checkpointer=saver)
    await graph.ainvoke({"steps": [], "count": 1}, thread("again"))
    async with db.unit_of_work() as uow:
        first = await uow.sessions.get_by_key(agent, "again")
        assert first is not None
        await uow.sessions.delete(first.id)
    result = await graph.ainvoke({"steps": [], "count": 5}, thread("again"))
    assert result == {"steps": ["count", "double"], "count": 12}  # a fresh thread: no earlier steps
    async with db.unit_of_work(read_only=True) as uow:
        second = await uow.sessions.get_by_key(agent, "again")
        assert second is not None
        assert second.id != first.id
        assert (second.expires_at is None) == (ttl is None)
    latest = await saver.aget_tuple(thread("again"))
    assert latest is not None
    assert latest.checkpoint["channel_values"]["count"] == 12


async def test_the_sync_interface_runs_a_graph_from_a_worker_thread(db: Database) -> None:
    agent = await _agent(db)
    saver = MemormSaver(db, agent=agent)
    graph = counter().compile(checkpointer=saver)

    def run() -> dict[str, Any]:
        return graph.invoke({"steps": [], "count": 3}, thread("sync"))

    assert await anyio.to_thread.run_sync(run) == {"steps": ["count", "double"], "count": 8}
    listed = await anyio.to_thread.run_sync(lambda: list(saver.list(thread("sync"))))
    assert len(listed) == 4
    assert [t.checkpoint["id"] for t in listed] == [
        t.checkpoint["id"] async for t in saver.alist(thread("sync"))
    ]
    await anyio.to_thread.run_sync(saver.delete_thread, "sync")
    assert await saver.aget_tuple(thread("sync")) is None


async def test_sync_calls_on_a_running_loops_thread_refuse_unless_allowed(db: Database) -> None:
    agent = await _agent(db)
    saver = MemormSaver(db, agent=agent)
    graph = counter().compile(checkpointer=saver)
    calls = [
        lambda: graph.invoke({"steps": [], "count": 3}, thread("loop")),
        lambda: saver.get_tuple(thread("loop")),
        lambda: list(saver.list(None)),
        lambda: saver.delete_thread("loop"),
        lambda: saver.prune(["loop"]),
    ]
    for call in calls:
        with pytest.raises(BlockingCallError, match="would block") as refused:
            call()
        assert isinstance(refused.value, asyncio.InvalidStateError)
        assert "await graph.ainvoke() or graph.astream()" in str(refused.value)  # what a notebook runs
    assert [t async for t in saver.alist(None)] == []
    # allow_blocking: they run here, blocking this loop until done.
    blocking = MemormSaver(db, agent=agent, allow_blocking=True)
    done = counter().compile(checkpointer=blocking).invoke({"steps": [], "count": 3}, thread("loop"))
    assert done == {"steps": ["count", "double"], "count": 8}
    assert blocking.get_tuple(thread("loop")) is not None


async def test_bad_input_is_a_validation_error_before_anything_is_written(db: Database) -> None:
    agent = await _agent(db)
    with pytest.raises(ValidationError, match="pickle"):
        MemormSaver(db, agent=agent, serde=JsonPlusSerializer(pickle_fallback=True))
    saver = MemormSaver(db, agent=agent)
    with pytest.raises(ValidationError, match="thread_id"):
        await saver.aget_tuple({"configurable": {}})
    with pytest.raises(ValidationError, match="configurable"):
        await saver.aget_tuple({})  # type: ignore[typeddict-item]
    with pytest.raises(ValidationError, match="thread_id"):
        await saver.aget_tuple(thread(""))
    with pytest.raises(ValidationError, match="checkpoint_id"):
        await saver.aput_writes(thread("t"), [("ch", 1)], "task")
    with pytest.raises(ValidationError, match="run_ids"):
        await saver.adelete_for_runs("run-1")
    with pytest.raises(ValidationError, match="strategy"):
        await saver.aprune(["t"], strategy="everything")
    with pytest.raises(ValidationError, match="filter"):
        [t async for t in saver.alist(thread("t"), filter={"bad key!": 1})]
    with pytest.raises(ValidationError, match="limit"):
        [t async for t in saver.alist(thread("t"), limit=-1)]
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    checkpoint = {
        "v": 1,
        "id": "1",
        "ts": "",
        "channel_values": {"x": object()},
        "channel_versions": {"x": 1},
        "versions_seen": {},
        "updated_channels": None,
    }
    with pytest.raises(ValidationError, match="channel 'x'"):
        await saver.aput(config, checkpoint, {}, {"x": 1})  # type: ignore[arg-type]
    async with db.unit_of_work(read_only=True) as uow:
        assert await uow.sessions.get_by_key(agent, "t") is None


async def _graph_rows(db: Database, tenant: str) -> dict[str, int]:
    async with db.unit_of_work(tenant, read_only=True) as uow:
        return {
            table: int(
                await uow.session.scalar(
                    sa.text(f"SELECT count(*) FROM {table} WHERE tenant = :t"), {"t": tenant}
                )
                or 0
            )
            for table in ("graph_checkpoints", "graph_writes", "graph_blobs")
        }


async def test_delete_tenant_counts_the_graph_state_and_leaves_another_tenants_threads_whole(
    db: Database,
) -> None:
    acme, globex = db.for_tenant("acme"), db.for_tenant("globex")
    savers = {
        "acme": MemormSaver(acme, agent=await _agent(acme)),
        "globex": MemormSaver(globex, agent=await _agent(globex)),
    }
    for saver in savers.values():  # the same thread names in both: one finished, one waiting for a human
        await counter().compile(checkpointer=saver).ainvoke({"steps": [], "count": 1}, thread("done"))
        await approval().compile(checkpointer=saver).ainvoke({"steps": [], "count": 2}, thread("review"))
    acme_rows, globex_rows = await _graph_rows(db, "acme"), await _graph_rows(db, "globex")
    assert acme_rows == globex_rows
    assert all(acme_rows.values())  # checkpoints, writes (the interrupt's among them) and values
    globex_history = [t.checkpoint["id"] async for t in savers["globex"].alist(thread("review"))]

    counts = {"agents": 1, "embedding_models": 0, "sessions": 2, "messages": 0, "archival_passages": 0}
    counts |= {"graph_store_items": 0, "graph_store_vectors": 0}  # no LangGraph store here
    assert await db.delete_tenant("acme", dry_run=True) == {**counts, **acme_rows}
    assert await _graph_rows(db, "acme") == acme_rows  # a dry run deletes nothing
    assert await db.delete_tenant("acme", batch=2) == {**counts, **acme_rows}  # several batches a table
    assert await _graph_rows(db, "acme") == dict.fromkeys(acme_rows, 0)
    assert await db.delete_tenant("acme") == dict.fromkeys({**counts, **acme_rows}, 0)

    # globex's threads are whole: the same rows, history and state, and its waiting graph resumes.
    assert await _graph_rows(db, "globex") == globex_rows
    assert [t.checkpoint["id"] async for t in savers["globex"].alist(thread("review"))] == globex_history
    graph = approval().compile(checkpointer=savers["globex"])
    assert (await graph.aget_state(thread("review"))).next == ("ask",)
    done = await graph.ainvoke(Command(resume="yes"), thread("review"))
    assert done == {"steps": ["count", "asked:yes", "double"], "count": 6}
    finished = await counter().compile(checkpointer=savers["globex"]).aget_state(thread("done"))
    assert finished.values == {"steps": ["count", "double"], "count": 4}


async def test_a_known_threads_graph_step_commits_each_call_with_its_statement(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`aput` and `aput_writes` on a thread whose session is known: no BEGIN/COMMIT trips of their own.

    On SQLite each call's BEGIN, inserts and COMMIT go to aiosqlite's thread in one
    hop; on Postgres each call is one statement, atomic by itself (two inserts on
    Citus, each routed to the session's shard; under row-level security the tenant's
    setting needs a transaction).
    """
    saver = MemormSaver(db, agent=await _agent(db))
    config = await saver.aput(thread("step"), _checkpoint(1), {"step": 1}, {"count": "1"})
    hops = count_sqlite_hops(monkeypatch)
    with capture_statements(db) as sent:
        config = await saver.aput(config, _checkpoint(2), {"step": 2}, {"count": "2"})
        await saver.aput_writes(config, [("count", 3), ("steps", ["x"])], "task")
    monkeypatch.undo()
    kinds = [sql.split()[0].upper() for sql, _ in sent]
    if db.dialect == "sqlite":
        assert kinds == ["BEGIN", "INSERT", "INSERT", "COMMIT", "BEGIN", "INSERT", "COMMIT"]
        assert len(hops) == 2
    elif not db.bypasses_rls:  # each call in a transaction that sets the tenant
        assert kinds.count("BEGIN") == kinds.count("COMMIT") == 2
        assert [kind for kind in kinds if kind in ("WITH", "INSERT")] == ["WITH", "INSERT"]
    elif db.distributed:
        assert kinds == ["BEGIN", "INSERT", "INSERT", "COMMIT", "INSERT"]
    else:
        assert kinds == ["WITH", "INSERT"]  # the values' insert rides along the checkpoint's
    found = await saver.aget_tuple(config)
    assert found is not None
    assert found.checkpoint["channel_values"] == {"count": 2}
    assert sorted((channel, value) for _, channel, value in found.pending_writes or []) == [
        ("count", 3),
        ("steps", ["x"]),
    ]
    assert found.parent_config is not None
    assert found.parent_config["configurable"]["checkpoint_id"] == _checkpoint(1)["id"]


async def test_a_one_statement_unit_of_work_refuses_a_second_statement(db: Database) -> None:
    saver = MemormSaver(db, agent=await _agent(db))
    config = await saver.aput(thread("one"), _checkpoint(1), {}, {"count": "1"})
    found = await saver.aget_tuple(config)
    assert found is not None
    session = found.config["configurable"]["thread_id"]
    async with db.unit_of_work(read_only=True) as uow:
        chat = await uow.sessions.get_by_key(saver.agent_id, session)
    assert chat is not None
    key = CheckpointKey(chat.id, "", _checkpoint(1)["id"])
    write = StoredWrite("task", "count", ("json", b"1"), "", 0)
    async with UnitOfWork(db.backend, tenant=db.tenant, one_statement=True) as uow:
        await uow.checkpoints.put_writes(saver.agent_id, key, [write], replace=False)
        with pytest.raises(RuntimeError, match="second statement"):
            await uow.checkpoints.put_writes(saver.agent_id, key, [write._replace(idx=1)], replace=False)
    async with db.unit_of_work(read_only=True) as uow:
        rows = await uow.session.execute(sa.text("SELECT idx FROM graph_writes WHERE task_id = 'task'"))
        assert [row[0] for row in rows] == [0]


def _checkpoint(n: int) -> Any:
    checkpoint = empty_checkpoint()
    checkpoint["id"] = f"{n:08}"
    checkpoint["channel_values"] = {"count": n}
    checkpoint["channel_versions"] = {"count": str(n)}
    return checkpoint


async def test_aget_tuple_reads_a_checkpoint_its_values_and_writes_in_one_statement(db: Database) -> None:
    saver = MemormSaver(db, agent=await _agent(db))
    config = await saver.aput(thread("read"), _checkpoint(1), {"step": 1}, {"count": "1"})
    second = _checkpoint(2)
    second["channel_values"]["notes"] = ["kept from step 1"]
    second["channel_versions"] = {"count": "2", "notes": "1"}
    config = await saver.aput(config, second, {"step": 2}, {"count": "2", "notes": "1"})
    await saver.aput_writes(config, [("count", 3), ("notes", ["x"])], "task-b")
    await saver.aput_writes(config, [("count", 4)], "task-a")
    with capture_statements(db, "graph_") as sent:
        found = await saver.aget_tuple(thread("read"))
    assert len(sent) == 1
    assert found is not None
    assert found.checkpoint["channel_values"] == {"count": 2, "notes": ["kept from step 1"]}
    assert [(task, channel, value) for task, channel, value in found.pending_writes or []] == [
        ("task-a", "count", 4),
        ("task-b", "count", 3),
        ("task-b", "notes", ["x"]),
    ]
    # A checkpoint stored before revision 0014 has no channel_versions column value:
    # its values are read by a second statement, the same ones.
    async with db.unit_of_work() as uow:
        await uow.session.execute(sa.text("UPDATE graph_checkpoints SET channel_versions = NULL"))
    with capture_statements(db, "graph_") as sent:
        again = await saver.aget_tuple(thread("read"))
    assert len(sent) == 2
    assert again is not None
    assert again.checkpoint == found.checkpoint
    assert again.pending_writes == found.pending_writes
    empty = await saver.aget_tuple({"configurable": {**config["configurable"], "checkpoint_id": "none"}})
    assert empty is None


async def test_a_threads_listing_finds_its_session_by_key_in_the_listing_statement(db: Database) -> None:
    saver = MemormSaver(db, agent=await _agent(db))
    for thread_id, steps in (("a", 3), ("b", 2)):
        config = thread(thread_id)
        for step in range(1, steps + 1):
            config = await saver.aput(config, _checkpoint(step), {"step": step}, {"count": str(step)})
    with capture_statements(db) as sent:
        listed = [item async for item in saver.alist(thread("a"), limit=2)]
    assert [item.metadata["step"] for item in listed] == [3, 2]
    assert {item.config["configurable"]["thread_id"] for item in listed} == {"a"}
    assert not [sql for sql, _ in sent if re.search(r"\bFROM sessions\b", sql)]  # no statement of its own
    assert [item async for item in saver.alist(thread("none"))] == []
    async with db.unit_of_work(read_only=True) as uow:
        by_key = await uow.checkpoints.list(saver.agent_id, session_key="b")
        assert [stored.meta["step"] for stored in by_key] == [2, 1]
        assert await uow.checkpoints.list(saver.agent_id, session_key="none") == []
        with capture_statements(db) as refused, pytest.raises(ValidationError, match="session_key"):
            await uow.checkpoints.list(saver.agent_id, session_key="bad\x00key")
    assert refused == []


async def test_a_listing_past_one_statements_keys_gives_each_checkpoint_its_own_writes(db: Database) -> None:
    # 70 checkpoints on a page of 100: their writes are read 32 keys a statement (the last
    # statement's keys padded to a power of two), and each must come back to its checkpoint.
    saver = MemormSaver(db, agent=await _agent(db))
    config = thread("many")
    for step in range(1, 71):
        config = await saver.aput(
            config, _checkpoint(step), {"step": step, "odd": step % 2}, {"count": str(step)}
        )
        await saver.aput_writes(config, [("count", step * 10), ("steps", [f"s{step}"])], f"task-{step}")
    listed = [item async for item in saver.alist(thread("many"))]
    assert [item.metadata["step"] for item in listed] == list(range(70, 0, -1))
    for item in listed:
        step = item.metadata["step"]
        assert item.checkpoint["channel_values"] == {"count": step}
        assert item.pending_writes == [
            (f"task-{step}", "count", step * 10),
            (f"task-{step}", "steps", [f"s{step}"]),
        ]
    before = {"configurable": {"thread_id": "many", "checkpoint_id": _checkpoint(41)["id"]}}
    older = [item async for item in saver.alist(thread("many"), before=before, limit=33)]
    assert [item.metadata["step"] for item in older] == list(range(40, 7, -1))
    odd = [item async for item in saver.alist(thread("many"), filter={"odd": 1}, limit=3)]
    assert [item.metadata["step"] for item in odd] == [69, 67, 65]
    assert odd[0].pending_writes == [("task-69", "count", 690), ("task-69", "steps", ["s69"])]
