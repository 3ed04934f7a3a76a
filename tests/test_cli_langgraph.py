"""``memorm import-langgraph``: a real langgraph-checkpoint-sqlite database into memorm, on both engines.

The source is made here by LangGraph's own ``SqliteSaver`` running real graphs
(one thread finished, one stopped at an interrupt, so there are pending
writes); the target is a SQLite file or a throwaway Postgres database.  A
langgraph-checkpoint-postgres source is made by LangGraph's ``PostgresSaver``
in a throwaway database, and goes through the same ``copy_checkpoints``.
"""

from __future__ import annotations

import operator
import re
import sqlite3
import sys
import uuid
from pathlib import Path
from typing import Annotated, Any

import pytest
import sqlalchemy as sa
from cli_run import drawn_progress, memorm, run, usage_error
from conftest import throwaway_postgres
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt
from pydantic import BaseModel
from typing_extensions import TypedDict

from memorm import Database
from memorm.cli.langgraph_source import POSTGRES_PACKAGES
from memorm.compat.langgraph import MemormSaver, copy_checkpoints
from memorm.errors import UnsafeValueError


class State(TypedDict):
    steps: Annotated[list[str], operator.add]
    count: int


def _count(state: State) -> dict[str, Any]:
    return {"steps": ["count"], "count": state.get("count", 0) + 1}


def _ask(state: State) -> dict[str, Any]:
    return {"steps": [f"asked:{interrupt('approve?')}"]}


def _graph(*, ask: bool) -> StateGraph[State]:
    builder = StateGraph(State)
    builder.add_node("count", _count)
    builder.add_edge(START, "count")
    if ask:
        builder.add_node("ask", _ask)
        builder.add_edge("count", "ask")
        builder.add_edge("ask", END)
    else:
        builder.add_edge("count", END)
    return builder


THREADS = ("finished", "waiting")


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A langgraph-checkpoint-sqlite file: thread "finished" ran to its end, "waiting" waits on a human."""
    path = tmp_path / "checkpoints.db"
    with SqliteSaver.from_conn_string(str(path)) as saver:
        _graph(ask=False).compile(checkpointer=saver).invoke(
            {"steps": [], "count": 1}, {"configurable": {"thread_id": "finished"}}
        )
        paused = _graph(ask=True).compile(checkpointer=saver)
        paused.invoke({"steps": [], "count": 5}, {"configurable": {"thread_id": "waiting"}})
    return path


def _source_rows(path: Path) -> tuple[int, int]:
    with sqlite3.connect(path) as connection:
        return (
            connection.execute("SELECT count(*) FROM checkpoints").fetchone()[0],
            connection.execute("SELECT count(*) FROM writes").fetchone()[0],
        )


@pytest.fixture
def target(plain_url: str) -> str:
    """A memorm database at head with an agent "mover" in the default tenant."""

    async def make() -> None:
        async with Database(plain_url) as db:
            await db.upgrade()
            async with db.unit_of_work() as uow:
                await uow.agents.create("mover")

    run(make())
    return plain_url


def _shape(item: Any) -> tuple[Any, ...]:
    """What a checkpoint tuple holds, comparable across savers."""
    configurable = item.config["configurable"]
    parent = (item.parent_config or {}).get("configurable", {}).get("checkpoint_id")
    return (
        str(configurable["thread_id"]),
        configurable["checkpoint_ns"],
        configurable["checkpoint_id"],
        parent,
        item.checkpoint["channel_values"],
        {k: v for k, v in item.metadata.items()},
        sorted((task, channel, repr(value)) for task, channel, value in item.pending_writes or ()),
    )


def _listed_in_source(path: Path) -> list[tuple[Any, ...]]:
    async def listed() -> list[tuple[Any, ...]]:
        async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
            return sorted([_shape(item) async for item in saver.alist(None)])

    return run(listed())


def _listed_in_memorm(url: str, agent: str = "mover", tenant: str = "default") -> list[tuple[Any, ...]]:
    async def listed() -> list[tuple[Any, ...]]:
        async with Database(url) as db:
            view = db.for_tenant(tenant)
            async with view.unit_of_work(read_only=True) as uow:
                found = await uow.agents.get_by_name(agent)
            if found is None:
                return []
            saver = MemormSaver(view, agent=found.id)
            return sorted([_shape(item) async for item in saver.alist(None)])

    return run(listed())


def _graph_rows(url: str) -> dict[str, int]:
    async def count() -> dict[str, int]:
        async with Database(url) as db, db.unit_of_work(read_only=True) as uow:
            return {
                table: int(await uow.session.scalar(sa.text(f"SELECT count(*) FROM {table}")) or 0)
                for table in ("graph_checkpoints", "graph_writes", "graph_blobs")
            }

    return run(count())


def test_import_langgraph_copies_every_thread_and_again_stores_nothing_new(
    source: Path, target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoints, writes = _source_rows(source)
    assert writes > 0  # the interrupted thread has pending writes
    code, out, err = memorm(capsys, "import-langgraph", str(source), "--agent", "mover", "--url", target)
    assert (code, err) == (0, "")
    summary = (
        f"copied {checkpoints} checkpoints ({writes} pending writes) of 2 threads "
        "into agent 'mover' of tenant 'default'\n"
    )
    assert out == summary
    assert _listed_in_memorm(target) == _listed_in_source(source)
    rows = _graph_rows(target)
    assert rows["graph_checkpoints"] == checkpoints
    assert rows["graph_writes"] == writes

    # A graph on memorm takes the threads up where LangGraph's saver left them.
    async def resume() -> tuple[dict[str, Any], dict[str, Any]]:
        from langgraph.types import Command

        async with Database(target) as db:
            async with db.unit_of_work(read_only=True) as uow:
                agent = await uow.agents.get_by_name("mover")
            assert agent is not None
            saver = MemormSaver(db, agent=agent.id)
            done = (
                await _graph(ask=True)
                .compile(checkpointer=saver)
                .ainvoke(Command(resume="yes"), {"configurable": {"thread_id": "waiting"}})
            )
            finished = (
                await _graph(ask=False)
                .compile(checkpointer=saver)
                .aget_state({"configurable": {"thread_id": "finished"}})
            )
            return done, finished.values

    done, finished = run(resume())
    assert done == {"steps": ["count", "asked:yes"], "count": 6}
    assert finished == {"steps": ["count"], "count": 2}

    # Again (into the resumed copy): the same summary, and no row added but the resumed thread's.
    before = _graph_rows(target)
    code, out, err = memorm(capsys, "import-langgraph", str(source), "--agent", "mover", "--url", target)
    assert (code, out, err) == (0, summary, "")
    assert _graph_rows(target) == before


def test_import_langgraph_draws_progress_for_checkpoints_and_writes(
    source: Path, target: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bars = drawn_progress(monkeypatch)
    checkpoints, writes = _source_rows(source)
    assert memorm(capsys, "import-langgraph", str(source), "--agent", "mover", "--url", target)[0] == 0
    assert {task.description: (task.completed, task.total) for task in bars[0].tasks} == {
        "checkpoints": (checkpoints, checkpoints),
        "writes": (writes, writes),
    }


def test_import_langgraph_takes_an_agent_id_a_tenant_and_creates_the_agent_when_told(
    source: Path, target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["import-langgraph", f"sqlite:///{source}", "--tenant", "acme", "--url", target]
    code, out, err = memorm(capsys, *argv, "--agent", "mover")
    assert (code, out) == (1, "")  # "mover" is the default tenant's, not acme's
    assert err == "memorm: error: no agent named 'mover' in tenant 'acme' (give --create to make it)\n"
    code, out, err = memorm(capsys, *argv, "--agent", "mover", "--create")
    assert (code, err) == (0, "")
    assert out.endswith("into agent 'mover' of tenant 'acme'\n")
    assert _listed_in_memorm(target, tenant="acme") == _listed_in_source(source)
    assert _listed_in_memorm(target) == []  # the default tenant's mover got nothing

    async def mover_id() -> uuid.UUID:
        async with Database(target) as db, db.unit_of_work("acme", read_only=True) as uow:
            agent = await uow.agents.get_by_name("mover")
            assert agent is not None
            return agent.id

    by_id = memorm(capsys, *argv, "--agent", str(run(mover_id())))
    assert by_id[0] == 0
    assert by_id[1].endswith("into agent 'mover' of tenant 'acme'\n")


def test_import_langgraph_refuses_in_one_line_and_writes_nothing(
    source: Path, target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def refused(*argv: str) -> str:
        code, out, err = memorm(capsys, "import-langgraph", *argv)
        assert (code, out) == (1, ""), argv
        assert err.startswith("memorm: error: "), err
        assert len(err.splitlines()) == 1, err  # one line, no traceback
        return err.removeprefix("memorm: error: ").rstrip("\n")

    missing = tmp_path / "nowhere.db"
    assert refused(str(missing), "--agent", "mover", "--url", target) == (
        f"no LangGraph SQLite database at {missing}: no such file"
    )
    assert not missing.exists()  # not created

    # A SQLite file that is not LangGraph's: memorm's own target (on SQLite), or an empty one.
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    error = refused(str(empty), "--agent", "mover", "--url", target)
    assert error == (
        f"{empty} is not a langgraph-checkpoint-sqlite database: it has no checkpoints, writes "
        "(is it the file or database your LangGraph app's checkpointer writes?)"
    )
    old = tmp_path / "old.db"
    with sqlite3.connect(old) as connection:  # a checkpoints table of another shape
        connection.execute("CREATE TABLE checkpoints (thread_id TEXT, checkpoint BLOB)")
        connection.execute("CREATE TABLE writes (thread_id TEXT)")
    assert "it has no checkpoints.checkpoint_id, checkpoints.checkpoint_ns" in refused(
        str(old), "--agent", "mover", "--url", target
    )
    text = tmp_path / "notes.txt"
    text.write_text("not a database at all, " * 100)
    assert refused(str(text), "--agent", "mover", "--url", target) == (
        f"{text} cannot be read as a SQLite database: file is not a database"
    )
    # The agent, by name and by id.
    assert refused(str(source), "--agent", "nobody", "--url", target) == (
        "no agent named 'nobody' in tenant 'default' (give --create to make it)"
    )
    stranger = uuid.uuid4()
    assert refused(str(source), "--agent", str(stranger), "--url", target) == (
        f"no agent with id {stranger} in tenant 'default'"
    )
    # A memorm database that is not there.
    nothing = tmp_path / "memorm-missing.db"
    assert refused(str(source), "--agent", "mover", "--url", f"sqlite:///{nothing}").startswith(
        f"no SQLite database at {nothing}"
    )
    assert not nothing.exists()
    assert _graph_rows(target) == {"graph_checkpoints": 0, "graph_writes": 0, "graph_blobs": 0}
    assert "--agent" in usage_error(capsys, "import-langgraph", str(source), "--url", target)
    assert "--tenant" in usage_error(
        capsys, "import-langgraph", str(source), "--agent", "mover", "--tenant", "", "--url", target
    )


@pytest.mark.postgres
@pytest.mark.parametrize("engine", ["sqlite"], indirect=True)
def test_a_postgres_source_is_checked_for_langgraphs_tables_and_package(
    target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async def execute(url: str, *statements: str) -> None:
        import asyncpg

        connection = await asyncpg.connect(url)
        try:
            for statement in statements:
                await connection.execute(statement)
        finally:
            await connection.close()

    with throwaway_postgres("memorm_lg") as url:
        plain = url.replace("postgresql+asyncpg://", "postgresql://")
        code, out, err = memorm(capsys, "import-langgraph", plain, "--agent", "mover", "--url", target)
        assert (code, out) == (1, "")
        assert err.startswith("memorm: error: postgresql://"), err
        assert (
            "is not a langgraph-checkpoint-postgres database: "
            "it has no checkpoints, checkpoint_writes, checkpoint_blobs" in err
        ), err
        # LangGraph's tables (as its saver's migrations make them), empty.
        run(
            execute(
                plain,
                "CREATE TABLE checkpoints (thread_id text, checkpoint_ns text, checkpoint_id text, "
                "parent_checkpoint_id text, type text, checkpoint jsonb, metadata jsonb)",
                "CREATE TABLE checkpoint_blobs (thread_id text, checkpoint_ns text, channel text, "
                "version text, type text, blob bytea)",
                "CREATE TABLE checkpoint_writes (thread_id text, checkpoint_ns text, checkpoint_id text, "
                "task_id text, idx integer, channel text, type text, blob bytea, task_path text)",
            )
        )
        # Without LangGraph's Postgres saver installed: what to install, in one line.
        with pytest.MonkeyPatch.context() as patch:
            patch.setitem(sys.modules, "langgraph.checkpoint.postgres", None)
            patch.setitem(sys.modules, "langgraph.checkpoint.postgres.aio", None)
            code, out, err = memorm(capsys, "import-langgraph", url, "--agent", "mover", "--url", target)
        assert (code, out) == (1, "")
        assert err == (
            "memorm: error: reading a langgraph-checkpoint-postgres database takes LangGraph's "
            f"Postgres saver: {POSTGRES_PACKAGES}\n"
        )


@pytest.mark.postgres
@pytest.mark.parametrize("engine", ["sqlite", "postgres"], indirect=True)
def test_import_langgraph_copies_a_langgraph_postgres_database(
    target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    with throwaway_postgres("memorm_lg") as url:
        plain = url.replace("postgresql+asyncpg://", "postgresql://")
        with PostgresSaver.from_conn_string(plain) as saver:  # LangGraph's own, as a user ran it
            saver.setup()
            _graph(ask=False).compile(checkpointer=saver).invoke(
                {"steps": [], "count": 1}, {"configurable": {"thread_id": "finished"}}
            )
            paused = _graph(ask=True).compile(checkpointer=saver)
            paused.invoke({"steps": [], "count": 5}, {"configurable": {"thread_id": "waiting"}})

        async def listed() -> list[tuple[Any, ...]]:
            async with AsyncPostgresSaver.from_conn_string(plain) as theirs:
                return sorted([_shape(item) async for item in theirs.alist(None)])

        expected = run(listed())
        code, out, err = memorm(capsys, "import-langgraph", plain, "--agent", "mover", "--url", target)
    assert (code, err) == (0, "")
    writes = sum(len(shape[-1]) for shape in expected)
    assert writes > 0  # the interrupted thread has pending writes
    assert out == (
        f"copied {len(expected)} checkpoints ({writes} pending writes) of 2 threads "
        "into agent 'mover' of tenant 'default'\n"
    )
    assert _listed_in_memorm(target) == expected


def _mkdir(path: Path) -> bytes:
    """A value LangGraph's default reader loads by calling os.mkdir(path)."""
    import ormsgpack

    return ormsgpack.packb(ormsgpack.Ext(0, ormsgpack.packb(("os", "mkdir", str(path)))))


NO_GRAPH_ROWS = {"graph_checkpoints": 0, "graph_writes": 0, "graph_blobs": 0}


@pytest.mark.parametrize(("table", "column"), [("checkpoints", "checkpoint"), ("writes", "value")])
def test_import_langgraph_refuses_a_value_naming_a_callable_by_row_and_writes_nothing(
    source: Path, target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], table: str, column: str
) -> None:
    made = tmp_path / "made"
    with sqlite3.connect(source) as connection:  # what anyone who can write the file can do
        rowid, thread, checkpoint = connection.execute(
            f"SELECT rowid, thread_id, checkpoint_id FROM {table} ORDER BY rowid DESC LIMIT 1"
        ).fetchone()
        connection.execute(
            f"UPDATE {table} SET type = 'msgpack', {column} = ? WHERE rowid = ?",
            (_mkdir(made), rowid),
        )
    code, out, err = memorm(capsys, "import-langgraph", str(source), "--agent", "mover", "--url", target)
    assert (code, out) == (1, "")
    row = rf"{table} row \(thread_id '{thread}', checkpoint_ns '', checkpoint_id '{checkpoint}'[^)]*\)"
    assert re.fullmatch(
        rf"memorm: error: {re.escape(str(source))}: {row}: it names os\.mkdir, neither a type LangGraph's "
        r"graphs store nor one allowed, so memorm will not call it \(.*--allow-type MODULE\.NAME.*\)\n",
        err,
    ), err
    assert not made.exists()
    assert _graph_rows(target) == NO_GRAPH_ROWS


class Memo(BaseModel):
    """A type of the graph's own."""

    text: str


class MemoState(TypedDict):
    memos: Annotated[list[Memo], operator.add]


def _memo(state: MemoState) -> dict[str, Any]:
    return {"memos": [Memo(text="hi")]}


def test_import_langgraph_admits_a_graphs_own_type_given_with_allow_type(
    tmp_path: Path, target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    builder = StateGraph(MemoState)
    builder.add_node("memo", _memo)
    builder.add_edge(START, "memo")
    path = tmp_path / "memos.db"
    with SqliteSaver.from_conn_string(str(path)) as saver:
        builder.compile(checkpointer=saver).invoke({"memos": []}, {"configurable": {"thread_id": "m"}})
    argv = ["import-langgraph", str(path), "--agent", "mover", "--url", target]
    code, out, err = memorm(capsys, *argv)
    assert (code, out) == (1, "")
    assert f"it names {Memo.__module__}.Memo, neither a type" in err, err
    assert _graph_rows(target) == NO_GRAPH_ROWS
    code, out, err = memorm(capsys, *argv, "--allow-type", f"{Memo.__module__}.Memo")
    assert (code, err) == (0, "")

    async def memos() -> list[Memo]:
        async with Database(target) as db:
            async with db.unit_of_work(read_only=True) as uow:
                agent = await uow.agents.get_by_name("mover")
            assert agent is not None
            saver = MemormSaver(db, agent=agent.id, allowed_types=[Memo])
            state = await builder.compile(checkpointer=saver).aget_state({"configurable": {"thread_id": "m"}})
            return list(state.values["memos"])

    assert run(memos()) == [Memo(text="hi")]


@pytest.mark.postgres
@pytest.mark.parametrize("engine", ["sqlite"], indirect=True)
def test_import_langgraph_refuses_a_postgres_sources_value_naming_a_callable(
    target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncpg
    from langgraph.checkpoint.postgres import PostgresSaver

    made = tmp_path / "made"
    with throwaway_postgres("memorm_lg") as url:
        plain = url.replace("postgresql+asyncpg://", "postgresql://")
        with PostgresSaver.from_conn_string(plain) as saver:
            saver.setup()
            _graph(ask=False).compile(checkpointer=saver).invoke(
                {"steps": [], "count": 1}, {"configurable": {"thread_id": "finished"}}
            )

        async def craft() -> None:
            connection = await asyncpg.connect(plain)
            try:
                await connection.execute(
                    "UPDATE checkpoint_blobs SET type = 'msgpack', blob = $1 WHERE channel = 'steps'",
                    _mkdir(made),
                )
            finally:
                await connection.close()

        run(craft())
        code, out, err = memorm(capsys, "import-langgraph", plain, "--agent", "mover", "--url", target)
    assert (code, out) == (1, "")
    assert re.fullmatch(
        r"memorm: error: postgresql://\S+: checkpoint_blobs row \(thread_id 'finished', checkpoint_ns '', "
        r"channel 'steps', version '[^']+'\): it names os\.mkdir, .*\n",
        err,
    ), err
    assert not made.exists()
    assert _graph_rows(target) == NO_GRAPH_ROWS


def test_copy_checkpoints_reads_langgraphs_saver_strictly(source: Path, target: str, tmp_path: Path) -> None:
    made = tmp_path / "made"
    with sqlite3.connect(source) as connection:
        connection.execute(
            "UPDATE writes SET type = 'msgpack', value = ? WHERE rowid = (SELECT max(rowid) FROM writes)",
            (_mkdir(made),),
        )

    async def copy() -> None:
        async with AsyncSqliteSaver.from_conn_string(str(source)) as theirs, Database(target) as db:
            async with db.unit_of_work(read_only=True) as uow:
                agent = await uow.agents.get_by_name("mover")
            assert agent is not None
            assert "JsonPlusSerializer" in type(theirs.serde).__name__  # LangGraph's, which would call it
            await copy_checkpoints(theirs, MemormSaver(db, agent=agent.id))

    with pytest.raises(UnsafeValueError, match=r"it names os\.mkdir, neither a type"):
        run(copy())
    assert not made.exists()
