"""``memorm copy|export|import``: whole databases move between engines, row for row.

The commands run in-process through ``memorm.cli.main`` (which calls
``asyncio.run``), so these tests are plain functions that set up and inspect
their databases with ``asyncio.run`` too.  Postgres databases are throwaway
ones (a URL cannot carry a search_path), created and dropped per test.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from memorm import Database, __version__
from memorm.cli import main
from memorm.migrate import head_revision
from memorm.transfer import TABLES
from memorm.transfer.rows import key_columns
from tests.conftest import REQUIRE_POSTGRES, postgres_unavailable, throwaway_postgres

Dump = dict[str, list[dict[str, Any]]]


@pytest.fixture
def postgres_urls() -> Iterator[Any]:
    """Hands out URLs of fresh Postgres databases, all dropped afterwards."""
    reason = postgres_unavailable()
    if reason is not None:
        if REQUIRE_POSTGRES:
            pytest.fail(reason)
        pytest.skip(reason)
    with ExitStack() as stack:

        class Urls:
            def new(self) -> str:
                return stack.enter_context(throwaway_postgres("memorm_transfer"))

        yield Urls()


def _url(engine: str, tmp_path: Path, postgres_urls: Any, name: str) -> str:
    return f"sqlite:///{tmp_path / name}.db" if engine == "sqlite" else postgres_urls.new()


async def _populate(url: str) -> None:
    """Two agents, each with a session of four messages (tool calls, unicode, meta).

    Each agent has passages of two models, one of them float16.
    """
    async with Database(url) as db:
        await db.upgrade()
        async with db.unit_of_work() as uow:
            for n in range(2):
                agent = await uow.agents.create(
                    f"agent-{n}",
                    system="Tu es Ξ, 🧠 d'un agent",
                    core_memory={"human": "Zoë, 日本語"},
                    meta={"zz": "jsonb sorts keys", "n": n, "nested": {"b": [1, 2.5, None], "a": {}}},
                )
                chat = await uow.sessions.create(agent.id, title="héllo", key=f"key-{n}", meta={"x": "y"})
                call = {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "find", "arguments": '{"q":1}'},
                }
                await uow.messages.append(
                    chat.id,
                    [
                        {"role": "system", "content": "be brief"},
                        {"role": "user", "content": "naïve ✓ 日本語\nline two", "meta": {"lang": "ja"}},
                        {"role": "assistant", "content": None, "tool_calls": [call], "token_count": 7},
                        {"role": "tool", "content": "found", "tool_call_id": "call_1", "name": "find"},
                    ],
                )
                await uow.passages.define_model(agent.id, "half", 4, precision="float16")
                await uow.passages.add_many(
                    agent.id,
                    [
                        {"text": "fact one", "embedding": [0.1, -0.2, 0.3]},
                        {
                            "text": "fait deux ü",
                            "embedding": [0.5, 0.25, -1.5, 3.1],
                            "embedding_model": "half",
                        },
                    ],
                )
                await uow.passages.add(agent.id, "third", [1.0, 2.0, 3.0], meta={"source": "📄"})


async def _dump(url: str) -> Dump:
    """Every row of every table in key order (id, or a graph-state row's key), read with Core selects."""
    async with Database(url) as db, db.unit_of_work(read_only=True) as uow:
        found: Dump = {}
        for table in TABLES:
            key = [column.name for column in key_columns(table)]
            got = [dict(row._mapping) for row in await uow.session.execute(sa.select(*table.c))]
            found[table.name] = sorted(got, key=lambda row: tuple(row[name] for name in key))
        return found


def dump(url: str) -> Dump:
    return asyncio.run(_dump(url))


def _execute(url: str, sql: str) -> None:
    async def run() -> None:
        async with Database(url) as db, db.engine.begin() as connection:
            await connection.exec_driver_sql(sql)

    asyncio.run(run())


def _search_totals(url: str, query: str) -> list[tuple[int, int]]:
    """How many messages and passages of each agent a full-text search for ``query`` finds."""

    async def run() -> list[tuple[int, int]]:
        async with Database(url) as db, db.unit_of_work(read_only=True) as uow:
            agents = (await uow.agents.list()).items
            return [
                (
                    (await uow.messages.search(agent.id, query)).total,
                    (await uow.passages.search_text(agent.id, query)).total,
                )
                for agent in agents
            ]

    return asyncio.run(run())


def _analyzed(url: str) -> set[str]:
    """The tables of a Postgres database that an `ANALYZE` (not autovacuum's) has analyzed."""

    async def run() -> set[str]:
        async with Database(url) as db, db.engine.connect() as connection:
            found = await connection.exec_driver_sql(
                "SELECT relname FROM pg_stat_user_tables WHERE last_analyze IS NOT NULL"
            )
            return set(found.scalars())

    return asyncio.run(run())


LOADED = ["agents", "embedding_models", "sessions", "messages", "archival_passages"]


def _check_populated(rows: Dump) -> None:
    """The fixture data really has what the copy must carry (so equality means something)."""
    assert [len(rows[t.name]) for t in TABLES] == [2, 4, 2, 8, 6, 0, 0, 0, 0, 0]  # no LangGraph tables
    assert [row["next_seq"] for row in rows["sessions"]] == [5, 5]
    assert [row["archive_version"] for row in rows["agents"]] == [2, 2]
    assert [row["content"] for row in rows["messages"]].count(None) == 2  # the tool-call messages


@pytest.mark.postgres
@pytest.mark.parametrize("direction", ["sqlite-to-postgres", "postgres-to-sqlite"])
def test_copy_moves_every_row_and_a_second_run_adds_nothing(
    direction: str, tmp_path: Path, postgres_urls: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = direction.split("-to-")
    source = _url(first, tmp_path, postgres_urls, "source")
    destination = _url(second, tmp_path, postgres_urls, "destination")
    asyncio.run(_populate(source))
    expected = dump(source)

    assert main(["copy", source, destination]) == 0
    out = capsys.readouterr().out
    assert "copied 8 messages" in out
    assert "verified: 22 rows in 10 tables match" in out
    # Postgres's planner statistics of the tables the copy filled are fresh (SQLite keeps none).
    if second == "postgres":
        assert f"analyzed 5 tables (Postgres planner statistics): {', '.join(LOADED)}\n" in out
        assert _analyzed(destination) == set(LOADED)
    else:
        assert "analyzed" not in out
    copied = dump(destination)
    assert copied == expected
    _check_populated(copied)
    # float16 stays float16 (3.1 is stored as 3.099609375 on both engines, bit for bit).
    half = [row for row in copied["archival_passages"] if row["embedding_model"] == "half"]
    assert half[0]["embedding"] is None
    assert half[0]["embedding_half"] == [0.5, 0.25, -1.5, 3.099609375]
    # The destination computed its own search words, and finds the same.
    assert _search_totals(destination, "NAÏVE 日本語") == [(1, 0), (1, 0)]
    assert _search_totals(destination, "FAIT DEUX Ü") == [(0, 1), (0, 1)]

    assert main(["copy", source, destination]) == 0
    out = capsys.readouterr().out
    assert "copied 0 messages (8 already there)" in out
    assert "verified" in out
    assert "analyzed" not in out  # nothing written, nothing to analyze
    assert dump(destination) == expected


@pytest.mark.parametrize("engine", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_copy_names_the_agent_name_the_destination_holds_under_another_id(
    engine: str, tmp_path: Path, postgres_urls: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    source = f"sqlite:///{tmp_path / 'source.db'}"
    destination = _url(engine, tmp_path, postgres_urls, "destination")
    asyncio.run(_populate(source))

    async def same_name_other_id() -> None:
        async with Database(destination) as db:
            await db.upgrade()
            async with db.unit_of_work() as uow:
                await uow.agents.create("agent-1")

    asyncio.run(same_name_other_id())
    assert main(["copy", source, destination]) != 0
    error = capsys.readouterr().err
    assert "an agent named 'agent-1' exists in the destination, under another id" in error
    assert "constraint" not in error
    assert [row["name"] for row in dump(destination)["agents"]] == ["agent-1"]


async def _negative_zeros(url: str) -> None:
    """Rows whose JSON holds -0.0, nested too: through the API, and as raw text an older memorm wrote."""
    doc = {"z": -0.0, "nested": [-0.0, {"deep": -0.0}], "kept": -0.5}
    async with Database(url) as db:
        await db.upgrade()
        async with db.unit_of_work() as uow:
            agent = await uow.agents.create("zero", meta=doc, llm_config=doc)
            chat = await uow.sessions.create(agent.id, meta=doc)
            await uow.messages.append(chat.id, [{"role": "user", "content": "hi", "meta": doc}])
            await uow.passages.add(agent.id, "p", [-0.0, 1.0], meta=doc)
        async with db.engine.begin() as connection:
            await connection.exec_driver_sql(
                """UPDATE messages SET meta = '{"z":-0.0,"nested":[-0.0,{"deep":-0.0}]}'"""
            )


@pytest.mark.postgres
def test_copy_of_json_negative_zero_from_sqlite_to_postgres_verifies(
    tmp_path: Path, postgres_urls: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    source, destination = f"sqlite:///{tmp_path / 'a.db'}", postgres_urls.new()
    asyncio.run(_negative_zeros(source))
    assert main(["copy", source, destination]) == 0
    assert "verified: 5 rows in 10 tables match" in capsys.readouterr().out
    assert main(["copy", "--verify-only", source, destination]) == 0
    # Both engines read every zero back unsigned, the raw -0.0 text included.
    for url in (source, destination):
        rows = dump(url)
        [message] = rows["messages"]
        assert json.dumps(message["meta"]) == '{"z": 0.0, "nested": [0.0, {"deep": 0.0}]}'
        [agent] = rows["agents"]
        assert json.dumps(agent["meta"], sort_keys=True) == (
            '{"kept": -0.5, "nested": [0.0, {"deep": 0.0}], "z": 0.0}'
        )


def test_copy_verification_names_the_table_that_differs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, destination = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    asyncio.run(_populate(source))
    assert main(["copy", source, destination]) == 0
    assert main(["copy", "--verify-only", source, destination]) == 0
    capsys.readouterr()

    _execute(destination, "UPDATE messages SET content = 'tampered' WHERE role = 'tool'")
    assert main(["copy", "--verify-only", source, destination]) == 1
    err = capsys.readouterr().err
    assert "verification failed" in err
    assert "messages: the same 8 rows, but their ids or contents differ" in err
    assert "agents" not in err
    # A re-run skips the rows already there, so it cannot hide the difference either.
    assert main(["copy", source, destination]) == 1
    assert "messages:" in capsys.readouterr().err

    _execute(destination, "UPDATE messages SET content = 'found' WHERE role = 'tool'")
    _execute(
        destination,
        "INSERT INTO agents (id, created_at, updated_at, meta, name, system, core_memory, llm_config, "
        "version, archive_version) VALUES ('ffffffffffff7fff8fffffffffffffff', '2030-01-01 00:00:00.000000', "
        "'2030-01-01 00:00:00.000000', '{}', 'extra', '', '{}', '{}', 1, 0)",
    )
    assert main(["copy", "--verify-only", source, destination]) == 1
    err = capsys.readouterr().err
    assert "agents: 2 rows in the source, 3 in the destination" in err
    assert "messages" not in err


@pytest.mark.parametrize("engine", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_export_then_import_round_trips_every_row(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    urls = request.getfixturevalue("postgres_urls") if engine == "postgres" else None
    source = _url(engine, tmp_path, urls, "source")
    destination = _url(engine, tmp_path, urls, "destination")
    asyncio.run(_populate(source))
    file = tmp_path / "memory.jsonl"

    assert main(["export", source, str(file)]) == 0
    assert "exported 8 messages" in capsys.readouterr().out
    lines = file.read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    assert header == {
        "memorm": __version__,
        "revision": head_revision(),
        "tenant": None,  # every tenant
        "tables": {
            "agents": 2,
            "embedding_models": 4,
            "sessions": 2,
            "messages": 8,
            "archival_passages": 6,
            "graph_checkpoints": 0,
            "graph_writes": 0,
            "graph_blobs": 0,
            "graph_store_items": 0,
            "graph_store_vectors": 0,
        },
    }
    first = json.loads(lines[1])
    assert first["table"] == "agents"
    assert first["row"]["name"] == "agent-0"
    assert first["row"]["tenant"] == "default"
    assert uuid.UUID(first["row"]["id"])
    assert first["row"]["created_at"].endswith("+00:00")
    assert json.loads(lines[-1]) == {"end": True, "tables": header["tables"]}
    assert "search_words" not in file.read_text(encoding="utf-8")  # derived, so not exported

    assert main(["db", "upgrade", "--url", destination]) == 0
    assert main(["import", destination, str(file)]) == 0
    out = capsys.readouterr().out
    assert "imported 8 messages" in out
    assert ("analyzed 5 tables" in out) == (engine == "postgres")
    if engine == "postgres":
        assert _analyzed(destination) == set(LOADED)
    assert dump(destination) == dump(source)
    assert _search_totals(destination, "naive") == [(0, 0), (0, 0)]
    assert _search_totals(destination, "naïve") == [(1, 0), (1, 0)]
    assert main(["import", destination, str(file)]) == 0
    assert "imported 0 messages (8 already there)" in capsys.readouterr().out
    _check_populated(dump(destination))


def test_gzip_exports_round_trip(tmp_path: Path) -> None:
    source, destination = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    asyncio.run(_populate(source))
    file = tmp_path / "memory.jsonl.gz"
    assert main(["export", "--batch-size", "3", source, str(file)]) == 0
    with gzip.open(file, "rt", encoding="utf-8") as lines:
        assert json.loads(lines.readline())["tables"]["messages"] == 8
    assert main(["db", "upgrade", "--url", destination]) == 0
    assert main(["import", "--batch-size", "3", destination, str(file)]) == 0
    assert dump(destination) == dump(source)


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.startswith("memorm: error: "), err
    assert err.count("\n") == 1, err
    return err


def test_import_refuses_a_file_from_a_newer_schema(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    destination = f"sqlite:///{tmp_path / 'b.db'}"
    assert main(["db", "upgrade", "--url", destination]) == 0
    file = tmp_path / "future.jsonl"
    row = {"table": "agents", "row": {"name": "from-the-future"}}
    header = {"memorm": "9.0.0", "revision": "0099_future", "tables": {"agents": 1}}
    file.write_text(f"{json.dumps(header)}\n{json.dumps(row)}\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["import", destination, str(file)]) == 1
    err = _one_line_error(capsys)
    assert "'0099_future'" in err
    assert "upgrade memorm" in err
    assert dump(destination)["agents"] == []


def _rewrite_rows(file: Path, revision: str, drop: dict[str, set[str]]) -> None:
    """Make ``file`` look like an export from ``revision``, its rows lacking ``drop``'s columns."""
    lines = [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines()]
    lines[0]["revision"] = revision
    for line in lines[1:-1]:
        for column in drop.get(line["table"], set()):
            del line["row"][column]
    file.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")


def test_an_export_from_an_older_revision_imports_with_the_new_columns_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, destination = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    asyncio.run(_populate(source))
    file = tmp_path / "old.jsonl"
    assert main(["export", source, str(file)]) == 0
    # Revision 0005 added sessions.expires_at and agents.retention.
    _rewrite_rows(file, "0004", {"sessions": {"expires_at"}, "agents": {"retention"}})
    assert main(["db", "upgrade", "--url", destination]) == 0
    assert main(["import", destination, str(file)]) == 0
    assert "imported 8 messages" in capsys.readouterr().out
    assert dump(destination) == dump(source)  # the columns it lacked are NULL on both sides

    # At the head revision every column must be there: a missing one is an error, not a NULL.
    assert main(["export", "--force", source, str(file)]) == 0
    _rewrite_rows(file, head_revision(), {"sessions": {"title"}})
    fresh = f"sqlite:///{tmp_path / 'c.db'}"
    assert main(["db", "upgrade", "--url", fresh]) == 0
    capsys.readouterr()
    assert main(["import", fresh, str(file)]) == 1
    assert "missing columns ['title']" in _one_line_error(capsys)


def test_import_refuses_a_truncated_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source, destination = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    asyncio.run(_populate(source))
    file = tmp_path / "memory.jsonl"
    assert main(["export", source, str(file)]) == 0
    assert main(["db", "upgrade", "--url", destination]) == 0
    truncated = tmp_path / "truncated.jsonl"
    truncated.write_text("".join(file.read_text(encoding="utf-8").splitlines(keepends=True)[:-1]))
    capsys.readouterr()
    assert main(["import", destination, str(truncated)]) == 1
    assert "ends early" in _one_line_error(capsys)


@pytest.mark.parametrize(
    "argv",
    [
        ["copy", "nosuch://x", "sqlite:///{tmp}/b.db"],
        ["copy", "sqlite:///{tmp}/a.db", "mysql://root@localhost/x"],
        ["export", "not a url", "{tmp}/out.jsonl"],
        ["import", "oracle://x", "{tmp}/in.jsonl"],
    ],
)
def test_bad_urls_fail_with_one_line(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([arg.format(tmp=tmp_path) for arg in argv]) == 1
    err = _one_line_error(capsys)
    assert "database" in err or "URL" in err


async def _many_messages(url: str, count: int) -> None:
    async with Database(url) as db:
        await db.upgrade()
        async with db.unit_of_work() as uow:
            agent = await uow.agents.create("busy")
            chat = await uow.sessions.create(agent.id)
            for start in range(0, count, 5_000):
                await uow.messages.append(
                    chat.id,
                    [{"role": "user", "content": f"message {n}"} for n in range(start, start + 5_000)],
                )


@pytest.mark.postgres
def test_copy_of_20000_messages_runs_in_batches(
    tmp_path: Path,
    postgres_urls: Any,
    capsys: pytest.CaptureFixture[str],
    record_property: Callable[[str, object], None],
) -> None:
    source, destination = f"sqlite:///{tmp_path / 'a.db'}", postgres_urls.new()
    asyncio.run(_many_messages(source, 20_000))
    started = time.perf_counter()
    assert main(["copy", "--batch-size", "3000", source, destination]) == 0
    # How long it took is reported, not asserted: speed lives in the benchmarks.
    record_property("copy_seconds", round(time.perf_counter() - started, 2))
    assert "copied 20,000 messages" in capsys.readouterr().out
    rows = dump(destination)["messages"]
    assert [row["seq"] for row in rows] == list(range(1, 20_001))
