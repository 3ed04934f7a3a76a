"""Graph state (checkpoints, writes, values) travels with its sessions in copy, export and import.

The state is made by real LangGraph graphs: thread "done" ran to its end,
thread "waiting" stopped at an interrupt (so it has pending writes).  Its
channels are named in both cases ("Alpha", "beta", "Zed"): Postgres with an
ICU collation sorts them otherwise than SQLite and Python do, which the
order-free digest of the graph-state tables must not mind.  A copy or import
is checked row for row, then by resuming the waiting graph in the
destination.
"""

from __future__ import annotations

import asyncio
import json
import operator
from pathlib import Path
from typing import Annotated, Any

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from typing_extensions import TypedDict

from memorm import Database
from memorm.cli import main
from memorm.compat.langgraph import MemormSaver
from memorm.transfer.rows import TABLES
from tests.test_cli_transfer import _url, dump, postgres_urls  # noqa: F401
from tests.test_transfer_tenants import icu_postgres

GRAPH_TABLES = ("graph_checkpoints", "graph_writes", "graph_blobs")


class State(TypedDict):
    Alpha: int
    beta: Annotated[list[str], operator.add]
    Zed: str


def _step(state: State) -> dict[str, Any]:
    return {"Alpha": state["Alpha"] + 1, "beta": ["step"], "Zed": "é" * state["Alpha"]}


def _ask(state: State) -> dict[str, Any]:
    return {"beta": [f"asked:{interrupt({'Alpha': state['Alpha']})}"]}


def _graph(*, ask: bool) -> Any:
    builder = StateGraph(State)
    builder.add_node("step", _step)
    builder.add_edge(START, "step")
    if ask:
        builder.add_node("ask", _ask)
        builder.add_edge("step", "ask")
        builder.add_edge("ask", END)
    else:
        builder.add_edge("step", END)
    return builder


def _thread(name: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": name}}


async def _fill(url: str, tenant: str = "default") -> None:
    """An agent "graph" of `tenant` whose threads "done" and "waiting" hold graph state."""
    async with Database(url) as db:
        await db.upgrade()
        view = db.for_tenant(tenant)
        async with view.unit_of_work() as uow:
            agent = await uow.agents.create("graph")
        saver = MemormSaver(view, agent=agent.id)
        await (
            _graph(ask=False)
            .compile(checkpointer=saver)
            .ainvoke({"Alpha": 1, "beta": [], "Zed": ""}, _thread("done"))
        )
        paused = (
            await _graph(ask=True)
            .compile(checkpointer=saver)
            .ainvoke({"Alpha": 2, "beta": [], "Zed": ""}, _thread("waiting"))
        )
        assert paused["__interrupt__"][0].value == {"Alpha": 3}


def fill(url: str, tenant: str = "default") -> None:
    asyncio.run(_fill(url, tenant))


def _resume(url: str, tenant: str = "default") -> tuple[dict[str, Any], dict[str, Any]]:
    """The finished thread's state, and the waiting thread resumed in the database at `url`."""

    async def resume() -> tuple[dict[str, Any], dict[str, Any]]:
        async with Database(url) as db:
            view = db.for_tenant(tenant)
            async with view.unit_of_work(read_only=True) as uow:
                agent = await uow.agents.get_by_name("graph")
            assert agent is not None
            saver = MemormSaver(view, agent=agent.id)
            done = await _graph(ask=False).compile(checkpointer=saver).aget_state(_thread("done"))
            resumed = (
                await _graph(ask=True)
                .compile(checkpointer=saver)
                .ainvoke(Command(resume="yes"), _thread("waiting"))
            )
            return done.values, resumed

    return asyncio.run(resume())


DONE = {"Alpha": 2, "beta": ["step"], "Zed": "é"}
RESUMED = {"Alpha": 3, "beta": ["step", "asked:yes"], "Zed": "éé"}


def _graph_rows(rows: dict[str, list[dict[str, Any]]]) -> dict[str, int]:
    return {name: len(rows[name]) for name in GRAPH_TABLES}


@pytest.mark.postgres
@pytest.mark.parametrize("direction", ["sqlite-to-postgres", "postgres-to-sqlite"])
def test_copy_carries_the_graph_state_across_engines_and_collations(
    direction: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with icu_postgres() as postgres:
        sqlite = f"sqlite:///{tmp_path / 'memorm.db'}"
        source, destination = (sqlite, postgres) if direction == "sqlite-to-postgres" else (postgres, sqlite)
        fill(source)
        expected = dump(source)
        assert all(_graph_rows(expected).values())
        # Two rows a batch: the graph-state tables are paged by their composite keys.
        assert main(["copy", source, destination, "--batch-size", "2"]) == 0
        out = capsys.readouterr().out
        assert f"copied {len(expected['graph_checkpoints'])} graph_checkpoints\n" in out
        assert f"copied {len(expected['graph_blobs'])} graph_blobs\n" in out
        rows = sum(len(found) for found in expected.values())
        assert f"verified: {rows} rows in {len(TABLES)} tables match" in out
        assert dump(destination) == expected
        assert main(["copy", source, destination]) == 0  # again: nothing new
        out = capsys.readouterr().out
        assert f"copied 0 graph_writes ({len(expected['graph_writes'])} already there)\n" in out
        assert main(["copy", "--verify-only", source, destination]) == 0
        assert _resume(destination) == (DONE, RESUMED)
        # The resumed destination differs from its source now, and verification says where.
        assert main(["copy", "--verify-only", source, destination]) == 1
        err = capsys.readouterr().err
        assert "graph_checkpoints: " in err


@pytest.mark.parametrize("engine", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_export_and_import_carry_the_graph_state(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    urls = request.getfixturevalue("postgres_urls") if engine == "postgres" else None
    source, destination = (_url(engine, tmp_path, urls, name) for name in ("source", "destination"))
    fill(source)
    expected = dump(source)
    file = tmp_path / "memory.jsonl.gz"
    assert main(["export", source, str(file), "--batch-size", "2"]) == 0
    assert f"exported {len(expected['graph_blobs'])} graph_blobs\n" in capsys.readouterr().out
    assert main(["import", destination, str(file), "--batch-size", "2"]) == 0
    assert f"imported {len(expected['graph_checkpoints'])} graph_checkpoints\n" in capsys.readouterr().out
    assert dump(destination) == expected
    assert main(["import", destination, str(file)]) == 0  # again: every row already there
    out = capsys.readouterr().out
    assert f"imported 0 graph_blobs ({len(expected['graph_blobs'])} already there)\n" in out
    assert _resume(destination) == (DONE, RESUMED)


def test_an_import_refuses_graph_state_without_its_session_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, destination = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    fill(source)
    file = tmp_path / "memory.jsonl"
    assert main(["export", source, str(file)]) == 0
    lines = [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines()]
    kept = [line for line in lines if line.get("table") != "sessions"]
    kept[-1]["tables"]["sessions"] = 0
    file.write_text("".join(json.dumps(line) + "\n" for line in kept), encoding="utf-8")
    first = next(n for n, line in enumerate(kept, start=1) if line.get("table") == "graph_checkpoints")
    capsys.readouterr()
    assert main(["import", destination, str(file)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"memorm: error: {file}:{first}: graph_checkpoints.session_id: no session "), err
    assert err.rstrip().endswith("earlier in the file or in the database")
    assert not (tmp_path / "b.db").exists()  # a refused import leaves no database behind

    # A value that is not base64 is refused by line too.
    broken = [dict(line) for line in lines]
    at = next(n for n, line in enumerate(broken) if line.get("table") == "graph_blobs")
    broken[at] = {**broken[at], "row": {**broken[at]["row"], "value": "not base64!"}}
    file.write_text("".join(json.dumps(line) + "\n" for line in broken), encoding="utf-8")
    assert main(["import", destination, str(file)]) == 1
    assert f"{file}:{at + 1}: graph_blobs.value: not base64" in capsys.readouterr().err


@pytest.mark.parametrize("engine", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_tenants_copy_carries_its_graph_state_only(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    urls = request.getfixturevalue("postgres_urls") if engine == "postgres" else None
    source, destination = (_url(engine, tmp_path, urls, name) for name in ("source", "destination"))
    fill(source, "acme")
    fill(source, "globex")
    assert main(["copy", source, destination, "--tenant", "acme"]) == 0
    copied = dump(destination)
    assert {row["tenant"] for name in GRAPH_TABLES for row in copied[name]} == {"acme"}
    every = dump(source)
    assert _graph_rows(copied) == {
        name: len([row for row in every[name] if row["tenant"] == "acme"]) for name in GRAPH_TABLES
    }
    assert _resume(destination, "acme") == (DONE, RESUMED)


def test_an_export_from_before_the_graph_tables_still_imports(tmp_path: Path) -> None:
    """A file of revision 0011 names no graph-state table in its header or end record."""
    source, destination = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    asyncio.run(_plain(source))
    file = tmp_path / "old.jsonl"
    assert main(["export", source, str(file)]) == 0
    lines = [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines()]
    lines[0]["revision"] = "0011"
    for record in (lines[0], lines[-1]):
        for name in GRAPH_TABLES:
            del record["tables"][name]
    file.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    assert main(["import", destination, str(file)]) == 0
    assert dump(destination) == dump(source)


async def _plain(url: str) -> None:
    async with Database(url) as db:
        await db.upgrade()
        async with db.unit_of_work() as uow:
            agent = await uow.agents.create("plain")
            chat = await uow.sessions.create(agent.id, key="k")
            await uow.messages.append(chat.id, [{"role": "user", "content": "hi"}])
