"""Retention of graph state: a thread's old checkpoints purged, never what a kept one needs.

The rules (`plan_purge`) are checked against a plain reference on random
checkpoint trees; the purge itself on real LangGraph graphs (a `DeltaChannel`
rebuilt from its parents, forks, subgraphs) on both engines, by comparing
every kept checkpoint's state before and after.  Then the saver's
`retention=` option, `purge_checkpoints` across agents and tenants, and
`memorm purge --checkpoints`.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Annotated, Any

import pytest
import sqlalchemy as sa
from cli_run import memorm, run, usage_error
from hypothesis import given
from hypothesis import strategies as st
from langgraph.channels.delta import DeltaChannel
from langgraph.graph import END, START, StateGraph
from test_compat_langgraph_graph import counter, thread, with_subgraph
from typing_extensions import TypedDict

from memorm import Database, ValidationError
from memorm.compat.langgraph import CheckpointRetention, MemormSaver
from memorm.models import CHECKPOINT_BLOBS, CHECKPOINT_WRITES, CHECKPOINTS
from memorm.repositories.checkpoint_retention import RetainedRow, plan_purge
from memorm.retention import Removed, purge_checkpoints

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


# -- the rules, on random trees ------------------------------------------------------------


@st.composite
def trees(draw: st.DrawFn) -> list[RetainedRow]:
    """Checkpoints of one or two namespaces: each one's parent an earlier one of its namespace (forks
    included), made a minute apart, some holding no snapshot of delta channels "a" or "b"."""
    rows: list[RetainedRow] = []
    for ns in draw(st.sampled_from([[""], ["", "child:1"]])):
        for number in range(draw(st.integers(1, 12))):
            parent = draw(st.none() | st.integers(0, number - 1)) if number else None
            delta = draw(st.sets(st.sampled_from("ab")))
            meta = {"counters_since_delta_snapshot": {c: [1, 1] for c in delta}} if delta else {}
            versions = draw(st.none() | st.just({"x": f"v{number // 3}", "y": "v0"}))
            rows.append(
                RetainedRow(
                    ns,
                    f"{number:04d}",
                    None if parent is None else f"{parent:04d}",
                    T0 + timedelta(minutes=number),
                    meta,
                    versions,
                )
            )
    return rows


def reference_kept(rows: list[RetainedRow], keep_last: int, before: datetime | None) -> set[tuple[str, str]]:
    """What stays, by the rules read plainly: each kept one walks its whole chain, channel by channel."""
    by_key = {(r.checkpoint_ns, r.checkpoint_id): r for r in rows}
    kept = set()
    for ns in {r.checkpoint_ns for r in rows}:
        newest = sorted((r for r in rows if r.checkpoint_ns == ns), key=lambda r: r.checkpoint_id)[::-1]
        kept |= {(ns, r.checkpoint_id) for i, r in enumerate(newest) if i < keep_last}
        kept |= {(ns, r.checkpoint_id) for r in newest if before is not None and r.created_at >= before}
    for ns, key in list(kept):
        for channel in by_key[ns, key].unsnapshotted:
            row = by_key[ns, key]
            while row.parent_checkpoint_id is not None:  # back to the channel's snapshot
                row = by_key[ns, row.parent_checkpoint_id]
                kept.add((ns, row.checkpoint_id))
                if channel not in row.unsnapshotted:
                    break
    return kept


@given(trees(), st.integers(1, 5), st.none() | st.integers(0, 12))
def test_a_plan_keeps_the_newest_the_young_and_every_delta_chain_and_nothing_else(
    rows: list[RetainedRow], keep_last: int, young: int | None
) -> None:
    before = None if young is None else T0 + timedelta(minutes=young)
    plan = plan_purge(rows, keep_last=keep_last, before=before)
    everything = {(r.checkpoint_ns, r.checkpoint_id) for r in rows}
    kept = everything - set(plan.removed)
    assert kept == reference_kept(rows, keep_last, before)
    assert plan.removed == sorted(set(plan.removed))
    by_key = {(r.checkpoint_ns, r.checkpoint_id): r for r in rows}
    assert set(plan.orphaned) == {
        key
        for key in kept
        if (parent := by_key[key].parent_checkpoint_id) is not None and (key[0], parent) not in kept
    }
    for ns in {r.checkpoint_ns for r in rows}:
        mine = [by_key[key] for key in kept if key[0] == ns]
        assert max(r.checkpoint_id for r in mine) == max(
            r.checkpoint_id for r in rows if r.checkpoint_ns == ns
        )
        if any(r.channel_versions is None for r in mine):
            assert plan.values_kept[ns] is None
        else:
            assert plan.values_kept[ns] == {pair for r in mine for pair in (r.channel_versions or {}).items()}


@pytest.mark.parametrize(
    ("keep_last", "before", "message"),
    [
        (None, None, "give keep_last, before, or both"),
        (0, None, "keep_last: expected a whole number from 1"),
        (True, None, "keep_last: expected a whole number"),
        ("3", None, "keep_last: expected a whole number"),
        (None, datetime(2026, 1, 1), "before: naive datetime"),
        (None, "2026-01-01", "before: expected a datetime"),
    ],
)
async def test_bad_retention_is_refused_before_any_statement(
    db: Database, keep_last: Any, before: Any, message: str
) -> None:
    agent, session, _ = await _graph_thread(db, counter(), runs=2)
    rows = await _rows(db)
    async with db.unit_of_work() as uow:
        with pytest.raises(ValidationError, match=message):
            await uow.checkpoints.purge(agent, session, keep_last=keep_last, before=before)
    with pytest.raises(ValidationError, match=message):
        await purge_checkpoints(db, keep_last=keep_last, before=before)
    if before is None:  # the saver's policy: the same checks
        with pytest.raises(ValidationError, match=message):
            CheckpointRetention(keep_last=keep_last)
    assert await _rows(db) == rows


# -- on real graphs ------------------------------------------------------------------------


def _extend(state: list[str], writes: list[list[str]]) -> list[str]:
    return [*state, *(item for write in writes for item in write)]


class Log(TypedDict):
    log: Annotated[list[str], DeltaChannel(_extend, snapshot_frequency=4)]
    n: int


def _step(state: Log) -> dict[str, Any]:
    return {"log": [f"step{state.get('n', 0)}"], "n": state.get("n", 0) + 1}


def delta_graph() -> StateGraph[Log]:
    """START -> step -> END, its log a DeltaChannel that snapshots every 4th update."""
    builder = StateGraph(Log)
    builder.add_node("step", _step)
    builder.add_edge(START, "step")
    builder.add_edge("step", END)
    return builder


def _inputs(builder: StateGraph[Any], run: int) -> dict[str, Any]:
    if builder.state_schema is Log:
        return {"log": [f"in{run}"], "n": run} if run else {"log": ["start"], "n": 0}
    return {"steps": [], "count": run}


async def _graph_thread(
    db: Database, builder: StateGraph[Any], *, runs: int, name: str = "t", saver: MemormSaver | None = None
) -> tuple[uuid.UUID, uuid.UUID, Any]:
    if saver is None:
        async with db.unit_of_work() as uow:
            agent = (await uow.agents.create(f"graph-{uuid.uuid4().hex[:8]}")).id
        saver = MemormSaver(db, agent=agent)
    graph = builder.compile(checkpointer=saver)
    for number in range(runs):
        await graph.ainvoke(_inputs(builder, number), thread(name))
    async with db.unit_of_work(read_only=True) as uow:
        chat = await uow.sessions.get_by_key(saver.agent_id, name)
    assert chat is not None
    return saver.agent_id, chat.id, graph


async def _states(graph: Any, name: str = "t") -> dict[tuple[str, str], Any]:
    """Every checkpoint's state, of the thread and its subgraphs: (namespace, id) -> values, next."""
    found = {}
    async for snapshot in graph.aget_state_history(thread(name)):
        config = snapshot.config["configurable"]
        found[config["checkpoint_ns"], config["checkpoint_id"]] = (snapshot.values, snapshot.next)
    saver = graph.checkpointer
    async for item in saver.alist(None):
        config = item.config["configurable"]
        if config["checkpoint_ns"]:
            state = await graph.aget_state(item.config, subgraphs=True)
            found[config["checkpoint_ns"], config["checkpoint_id"]] = (state.values, state.next)
    return found


async def _rows(db: Database) -> dict[str, int]:
    """The graph-state rows of `db`'s tenant, table by table."""
    async with db.unit_of_work(read_only=True) as uow:
        return {
            table.name: (
                await uow.link.session.execute(
                    sa.select(sa.func.count()).select_from(table).where(table.c.tenant == db.tenant)
                )
            ).scalar_one()
            for table in (CHECKPOINTS, CHECKPOINT_WRITES, CHECKPOINT_BLOBS)
        }


async def _purge(db: Database, agent: uuid.UUID, session: uuid.UUID, **keep: Any) -> int:
    async with db.unit_of_work() as uow:
        return await uow.checkpoints.purge(agent, session, **keep)


async def test_a_purge_keeps_the_newest_and_every_kept_state_reads_the_same(db: Database) -> None:
    agent, session, graph = await _graph_thread(db, counter(), runs=10)
    states, rows = await _states(graph), await _rows(db)
    assert len(states) == 40  # each run: input, count, double, and the loop's start
    assert await _purge(db, agent, session, keep_last=5, dry_run=True) == 35
    assert await _rows(db) == rows
    assert await _purge(db, agent, session, keep_last=5) == 35
    after = await _states(graph)
    assert list(after) == list(states)[:5]
    assert all(after[key] == states[key] for key in after)
    left = await _rows(db)
    assert left["graph_checkpoints"] == 5
    assert left["graph_blobs"] < rows["graph_blobs"]
    oldest = [snapshot async for snapshot in graph.aget_state_history(thread("t"))][-1]
    assert oldest.parent_config is None  # its parent went: it is a root now
    assert await _purge(db, agent, session, keep_last=5) == 0
    # The graph goes on from its state.
    assert (await graph.ainvoke({"steps": [], "count": 1}, thread("t")))["count"] == 4


async def test_a_delta_channel_keeps_the_parents_it_is_rebuilt_from(db: Database) -> None:
    agent, session, graph = await _graph_thread(db, delta_graph(), runs=12)
    states = await _states(graph)
    newest = next(iter(states.values()))[0]
    assert newest["log"][-2:] == ["in11", "step11"]
    removed = await _purge(db, agent, session, keep_last=2)
    after = await _states(graph)
    assert 2 < len(after) < len(states)  # the two newest, and their parents back to a snapshot
    assert removed == len(states) - len(after)
    assert list(after)[:2] == list(states)[:2]
    assert all(after[key] == states[key] for key in after)  # each rebuilt as before the purge
    assert (await graph.ainvoke({"log": ["more"]}, thread("t")))["log"][-2:] == ["more", "step12"]


async def test_a_fork_keeps_its_branch_back_to_the_edit_it_is_rebuilt_from(db: Database) -> None:
    agent, session, graph = await _graph_thread(db, delta_graph(), runs=10)
    history = [snapshot async for snapshot in graph.aget_state_history(thread("t"))]
    old = history[-8]  # the third run's input: one log update past a snapshot
    assert old.metadata is not None
    assert old.metadata["counters_since_delta_snapshot"]["log"][0] == 1
    forked = await graph.aupdate_state(old.config, {"log": ["forked"]})
    await graph.ainvoke(None, forked)
    states = await _states(graph)
    head, edit = [snapshot async for snapshot in graph.aget_state_history(thread("t"), limit=2)]
    assert edit.parent_config is not None
    assert edit.parent_config["configurable"]["checkpoint_id"] == old.config["configurable"]["checkpoint_id"]
    # LangGraph writes the edit with the log's whole value (no counters: a snapshot), so the
    # branch needs nothing it forked from; the head holds one update past the edit, so its
    # log is rebuilt from the edit.
    assert head.metadata is not None
    assert edit.metadata is not None
    assert "counters_since_delta_snapshot" not in edit.metadata
    assert "log" in head.metadata["counters_since_delta_snapshot"]
    assert await _purge(db, agent, session, keep_last=1) == len(states) - 2
    after = await _states(graph)
    ids = [snapshot.config["configurable"]["checkpoint_id"] for snapshot in (head, edit)]
    assert list(after) == [("", checkpoint) for checkpoint in ids]
    assert all(after[key] == states[key] for key in after)
    assert after["", ids[0]][0]["log"][-3:] == ["in2", "forked", "step2"]


async def test_an_age_keeps_the_young_and_subgraphs_keep_their_newest(db: Database) -> None:
    agent, session, graph = await _graph_thread(db, with_subgraph(), runs=3)
    states = await _states(graph)
    namespaces = {ns for ns, _ in states}
    assert len(namespaces) > 1
    # Everything is younger than an hour: nothing goes.
    hour_ago = datetime.now(timezone.utc) - timedelta(hours=1)
    assert await _purge(db, agent, session, before=hour_ago) == 0
    # Everything is older than an hour from now: each namespace keeps its newest.
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    assert await _purge(db, agent, session, before=later) == len(states) - len(namespaces)
    after = await _states(graph)
    assert {ns for ns, _ in after} == namespaces
    assert all(after[key] == states[key] for key in after)


async def test_the_saver_purges_a_thread_as_it_writes(db: Database) -> None:
    async with db.unit_of_work() as uow:
        agent = (await uow.agents.create("kept")).id
    saver = MemormSaver(db, agent=agent, retention=CheckpointRetention(keep_last=3))
    _, _, graph = await _graph_thread(db, counter(), runs=10, saver=saver)
    left = (await _rows(db))["graph_checkpoints"]
    assert 3 <= left <= 6  # at most keep_last + every between purges
    assert (await graph.aget_state(thread("t"))).values == {"steps": ["count", "double"] * 10, "count": 20}
    with pytest.raises(ValidationError, match="retention: expected a CheckpointRetention"):
        MemormSaver(db, agent=agent, retention={"keep_last": 3})  # type: ignore[arg-type]
    assert CheckpointRetention(max_age=60).interval == 100
    assert CheckpointRetention(keep_last=7).interval == 7
    assert CheckpointRetention(keep_last=7, every=2).age is None
    with pytest.raises(ValidationError, match="every: expected a whole number"):
        CheckpointRetention(keep_last=7, every=0)
    with pytest.raises(ValidationError, match="max_age: expected a positive"):
        CheckpointRetention(max_age=-1)


async def _three_threads(db: Database) -> uuid.UUID:
    """Two threads of two agents of the default tenant, one of acme's: 12 checkpoints each.

    Returns the first agent's id."""
    first, _, _ = await _graph_thread(db, counter(), runs=3, name="a")
    await _graph_thread(db, counter(), runs=3, name="b")
    await _graph_thread(db.for_tenant("acme"), counter(), runs=3, name="c")
    return first


async def test_purge_checkpoints_runs_over_every_thread_of_the_tenant(db: Database) -> None:
    first = await _three_threads(db)
    assert await purge_checkpoints(db, keep_last=6, agent=first) == Removed(checkpoints=6)
    assert (await _rows(db))["graph_checkpoints"] == 6 + 12
    events: list[tuple[str, str, int]] = []

    class Reporter:
        def start(self, task: str, total: int) -> None:
            events.append(("start", task, total))

        def advance(self, task: str, rows: int) -> None:
            events.append(("advance", task, rows))

    assert await purge_checkpoints(db, keep_last=2, dry_run=True) == Removed(checkpoints=14)
    assert await purge_checkpoints(db, keep_last=2, reporter=Reporter()) == Removed(checkpoints=14)
    assert events == [("start", "threads", 2), ("advance", "threads", 1), ("advance", "threads", 1)]
    assert (await _rows(db))["graph_checkpoints"] == 2 + 2
    assert (await _rows(db.for_tenant("acme")))["graph_checkpoints"] == 12
    acme = await purge_checkpoints(db.for_tenant("acme"), keep_last=4, agent=None)
    assert acme == Removed(checkpoints=8)


@pytest.mark.owner  # all_tenants: a role that bypasses row-level security
async def test_purge_checkpoints_runs_over_every_tenant(db: Database) -> None:
    await _three_threads(db)
    every = await purge_checkpoints(db, keep_last=1, all_tenants=True)
    assert every == Removed(checkpoints=11 + 11 + 11)
    assert every.total == 33
    assert (await _rows(db.for_tenant("acme")))["graph_checkpoints"] == 1


def test_memorm_purge_checkpoints(plain_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    async def build() -> None:
        async with Database(plain_url) as db:
            await db.upgrade()
            await _graph_thread(db, counter(), runs=3)

    run(build())
    code, out, _ = memorm(
        capsys, "purge", "--checkpoints", "--keep-last", "2", "--dry-run", "--url", plain_url
    )
    assert (code, out) == (0, "would remove 10 checkpoints\n")
    code, out, _ = memorm(capsys, "purge", "--checkpoints", "--keep-last", "2", "--url", plain_url)
    assert (code, out) == (0, "removed 10 checkpoints\n")
    code, out, _ = memorm(capsys, "purge", "--checkpoints", "--older-than", "1d", "--url", plain_url)
    assert (code, out) == (0, "removed 0 checkpoints\n")
    assert "--checkpoints needs --keep-last" in usage_error(
        capsys, "purge", "--checkpoints", "--url", plain_url
    )
    assert "--keep-last counts checkpoints" in usage_error(
        capsys, "purge", "--keep-last", "2", "--url", plain_url
    )
    assert "from 1 to 1,000,000" in usage_error(capsys, "purge", "--checkpoints", "--keep-last", "0")
