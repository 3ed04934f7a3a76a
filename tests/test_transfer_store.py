"""The agents' long-term store (LangGraph's `BaseStore`: items, vectors) travels in copy, export and import.

Each tenant's agent "keeper" holds, through a real `MemormStore`, items in
two namespaces: some embedded (one by two fields, so an item has several
vectors), one stored without embeddings and one with a TTL.  Keys "Alpha",
"beta", "Zed" sort otherwise under Postgres' ICU collation than in SQLite
and Python, which the order-free digest of the store's tables must not
mind.  A copy or import is checked row for row, then by a `MemormStore` on
the copy: the same items by key, by filter and by meaning (same order).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from memorm import Database, ValidationError
from memorm.cli import main
from memorm.compat.langgraph import MemormStore
from memorm.transfer import TABLES, copy_database, digest_database, export_jsonl, import_jsonl
from tests import test_tenancy_rls
from tests.test_cli_transfer import _url, dump, postgres_urls  # noqa: F401
from tests.test_tenancy_rls import Roles
from tests.test_transfer_tenants import icu_postgres

STORE_TABLES = ("graph_store_items", "graph_store_vectors")
WORDS = ["tea", "coffee", "rain", "sun"]
ENGINES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
MEMORIES = ("users", "ann", "memories")
BOB = ("users", "bob")
KEYS = [(MEMORIES, key) for key in ("Alpha", "beta", "Zed", "plain")] + [(BOB, "diet")]

roles = test_tenancy_rls.roles  # a superuser and an application role on one schema


def embed(texts: list[str]) -> list[list[float]]:
    """A toy embedding: a count per word (distinct scores for the texts below)."""
    return [[float(text.lower().count(word)) + 0.1 for word in WORDS] for text in texts]


def _store(db: Database, agent: Any) -> MemormStore:
    return MemormStore(db, agent=agent, index={"dims": len(WORDS), "embed": embed, "fields": ["text"]})


async def _put(view: Database) -> None:
    """An agent "keeper" of `view`'s tenant and its store's items."""
    async with view.unit_of_work() as uow:
        agent = await uow.agents.create("keeper")
    store = _store(view, agent.id)
    await store.aput(MEMORIES, "Alpha", {"text": "ann likes tea", "since": 2019})
    await store.aput(
        MEMORIES,
        "beta",
        {"text": "tea and sun, sun", "tags": ["tea", "rain rain"], "since": 2021},
        index=["text", "tags[*]"],  # three vectors: text, tags[*].0, tags[*].1
    )
    await store.aput(MEMORIES, "Zed", {"text": "ann hates rain, rain", "since": 2023})
    await store.aput(MEMORIES, "plain", {"text": "coffee", "since": 2024}, index=False)  # no vectors
    await store.aput(BOB, "diet", {"text": "no coffee, ever", "since": 2000}, ttl=60)


async def _fill(url: str, tenants: tuple[str, ...]) -> None:
    async with Database(url) as db:
        await db.upgrade()
        for tenant in tenants:
            await _put(db.for_tenant(tenant))


def fill(url: str, *tenants: str) -> None:
    asyncio.run(_fill(url, tenants or ("default",)))


async def _seen(view: Database) -> dict[str, Any]:
    """What a `MemormStore` on `view`'s agent "keeper" returns: by key, by filter, by meaning."""
    async with view.unit_of_work(read_only=True) as uow:
        agent = await uow.agents.get_by_name("keeper")
    assert agent is not None
    store = _store(view, agent.id)
    got = {}
    for namespace, key in KEYS:
        item = await store.aget(namespace, key, refresh_ttl=False)
        assert item is not None, key
        got[key] = (item.namespace, item.value, item.created_at, item.updated_at)
    recent = await store.asearch(("users",), filter={"since": {"$gte": 2020}}, refresh_ttl=False)
    hits = await store.asearch(("users",), query="sun and tea", limit=10, refresh_ttl=False)
    return {
        "get": got,
        "filter": [item.key for item in recent],
        "search": [item.key for item in hits],
        "scores": [item.score for item in hits],
        "namespaces": await store.alist_namespaces(),
    }


def seen(url: str, tenant: str = "default") -> dict[str, Any]:
    async def read() -> dict[str, Any]:
        async with Database(url) as db:
            return await _seen(db.for_tenant(tenant))

    return asyncio.run(read())


def _same(found: dict[str, Any], expected: dict[str, Any]) -> None:
    """The same items, filter results and search order; scores as close as float32 on both engines."""
    assert {**found, "scores": None} == {**expected, "scores": None}
    assert [score is None for score in found["scores"]] == [score is None for score in expected["scores"]]
    assert [s for s in found["scores"] if s is not None] == pytest.approx(
        [s for s in expected["scores"] if s is not None], abs=1e-5
    )


def _check_filled(url: str, tenant: str = "default") -> dict[str, Any]:
    """The store's content really is what the copy must carry (so equality means something)."""
    found = seen(url, tenant)
    assert found["filter"] == ["plain", "Zed", "beta"]  # newest first
    # By meaning, best first; the item without embeddings last, unscored.
    assert found["search"] == ["beta", "Alpha", "diet", "Zed", "plain"]
    assert found["scores"][-1] is None
    assert found["namespaces"] == [MEMORIES, BOB]
    rows = dump(url)
    assert [len([row for row in rows[name] if row["tenant"] == tenant]) for name in STORE_TABLES] == [5, 6]
    assert [row["ttl_minutes"] for row in rows["graph_store_items"] if row["tenant"] == tenant].count(60) == 1
    return found


def _counts(rows: dict[str, list[dict[str, Any]]], tenant: str | None = None) -> dict[str, int]:
    return {name: len([r for r in rows[name] if tenant in (None, r["tenant"])]) for name in STORE_TABLES}


@pytest.mark.postgres
@pytest.mark.parametrize("direction", ["sqlite-to-postgres", "postgres-to-sqlite"])
def test_copy_carries_the_store_across_engines_and_collations(
    direction: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with icu_postgres() as postgres:
        sqlite = f"sqlite:///{tmp_path / 'memorm.db'}"
        source, destination = (sqlite, postgres) if direction == "sqlite-to-postgres" else (postgres, sqlite)
        fill(source)
        expected, rows = _check_filled(source), dump(source)
        # Two rows a batch: the store's tables are paged by their composite keys.
        assert main(["copy", source, destination, "--batch-size", "2"]) == 0
        out = capsys.readouterr().out
        assert "copied 5 graph_store_items\n" in out
        assert "copied 6 graph_store_vectors\n" in out
        total = sum(len(found) for found in rows.values())
        assert f"verified: {total} rows in {len(TABLES)} tables match" in out
        assert dump(destination) == rows
        _same(seen(destination), expected)
        assert main(["copy", source, destination, "--batch-size", "2"]) == 0  # again: nothing new
        out = capsys.readouterr().out
        assert "copied 0 graph_store_items (5 already there)\n" in out
        assert "copied 0 graph_store_vectors (6 already there)\n" in out
        assert dump(destination) == rows
        # A changed item in the destination is found by verification, naming the table.
        asyncio.run(_touch(destination))
        assert main(["copy", "--verify-only", source, destination]) == 1
        err = capsys.readouterr().err
        assert "graph_store_items: the same 5 rows, but their ids or contents differ" in err


async def _touch(url: str) -> None:
    async with Database(url) as db:
        async with db.unit_of_work(read_only=True) as uow:
            agent = await uow.agents.get_by_name("keeper")
        assert agent is not None
        await MemormStore(db, agent=agent.id).aput(MEMORIES, "plain", {"text": "tea now"}, index=False)


@pytest.mark.parametrize("engine", ENGINES)
def test_export_and_import_carry_the_store(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    urls = request.getfixturevalue("postgres_urls") if engine == "postgres" else None
    source, destination = (_url(engine, tmp_path, urls, name) for name in ("source", "destination"))
    fill(source)
    expected, rows = _check_filled(source), dump(source)
    file = tmp_path / "memory.jsonl.gz"
    assert main(["export", source, str(file), "--batch-size", "2"]) == 0
    assert "exported 6 graph_store_vectors\n" in capsys.readouterr().out
    assert main(["import", destination, str(file), "--batch-size", "2"]) == 0
    assert "imported 5 graph_store_items\n" in capsys.readouterr().out
    assert dump(destination) == rows
    _same(seen(destination), expected)
    assert main(["import", destination, str(file)]) == 0  # again: every row already there
    out = capsys.readouterr().out
    assert "imported 0 graph_store_vectors (6 already there)\n" in out
    assert dump(destination) == rows


def test_the_file_holds_values_as_json_and_embeddings_as_lists_of_floats(tmp_path: Path) -> None:
    source = f"sqlite:///{tmp_path / 'a.db'}"
    fill(source)
    file = tmp_path / "memory.jsonl"
    assert main(["export", source, str(file)]) == 0
    records = [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines()]
    assert {name: records[0]["tables"][name] for name in STORE_TABLES} == {
        "graph_store_items": 5,
        "graph_store_vectors": 6,
    }
    assert [record.get("table") for record in records[-12:-1]] == ["graph_store_items"] * 5 + [
        "graph_store_vectors"
    ] * 6  # last, items before their vectors
    diet = records[_line_of(records, "graph_store_items", "diet")]["row"]
    assert diet["namespace"] == "users.bob"
    assert diet["value"] == {"text": "no coffee, ever", "since": 2000}
    assert diet["ttl_minutes"] == 60
    assert diet["expires_at"] > diet["updated_at"]  # ISO 8601, both UTC
    vector = next(r["row"] for r in records if r.get("table") == "graph_store_vectors")
    assert vector["embedding"] == pytest.approx(embed(["ann likes tea"])[0])
    assert {r["row"]["field"] for r in records if r.get("table") == "graph_store_vectors"} == {
        "text",
        "tags[*].0",
        "tags[*].1",
    }


@pytest.mark.parametrize("engine", ENGINES)
def test_one_tenants_copy_and_export_carry_its_store_only(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    urls = request.getfixturevalue("postgres_urls") if engine == "postgres" else None
    source, copied, imported = (_url(engine, tmp_path, urls, n) for n in ("source", "copied", "imported"))
    fill(source, "acme", "globex")
    expected, every = _check_filled(source, "acme"), dump(source)
    assert _counts(every) == {"graph_store_items": 10, "graph_store_vectors": 12}

    assert main(["copy", "--tenant", "acme", source, copied, "--batch-size", "2"]) == 0
    assert "copied 5 graph_store_items\n" in capsys.readouterr().out
    found = dump(copied)
    assert {row["tenant"] for name in STORE_TABLES for row in found[name]} == {"acme"}
    assert _counts(found) == _counts(every, "acme")
    _same(seen(copied, "acme"), expected)
    assert main(["copy", "--tenant", "acme", source, copied]) == 0
    assert "copied 0 graph_store_vectors (6 already there)\n" in capsys.readouterr().out

    file = tmp_path / "acme.jsonl"
    assert main(["export", "--tenant", "acme", source, str(file)]) == 0
    header = json.loads(file.read_text(encoding="utf-8").splitlines()[0])
    assert header["tenant"] == "acme"
    assert {name: header["tables"][name] for name in STORE_TABLES} == _counts(every, "acme")
    assert main(["import", "--tenant", "acme", imported, str(file)]) == 0
    assert dump(imported) == found
    _same(seen(imported, "acme"), expected)


def _line_of(records: list[dict[str, Any]], table: str, key: str) -> int:
    """The index of the first record of `table` whose row has `key`."""
    return next(n for n, r in enumerate(records) if r.get("table") == table and r["row"]["key"] == key)


def _rewrite(file: Path, records: list[dict[str, Any]]) -> None:
    file.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")


def test_an_import_refuses_store_rows_without_their_agent_or_item_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, destination = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    fill(source)
    file = tmp_path / "memory.jsonl"
    assert main(["export", source, str(file)]) == 0
    records = [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines()]
    capsys.readouterr()

    def refused(kept: list[dict[str, Any]]) -> str:
        named = [record.get("table") for record in kept]
        kept[-1] = {"end": True, "tables": {table.name: named.count(table.name) for table in TABLES}}
        _rewrite(file, kept)
        assert main(["import", destination, str(file)]) == 1
        assert not (tmp_path / "b.db").exists()  # a refused import leaves no database behind
        return capsys.readouterr().err

    # Items without their agent (and nothing else of the agent's).
    kept = [r for r in records if r.get("table") not in ("agents", "embedding_models", "sessions")]
    err = refused(kept)
    first = next(n for n, r in enumerate(kept, start=1) if r.get("table") == "graph_store_items")
    assert err.startswith(f"memorm: error: {file}:{first}: graph_store_items.agent_id: no agent "), err
    assert err.rstrip().endswith("earlier in the file or in the database")

    # Vectors without their item: the first of "beta"'s names it.
    kept = [r for r in records if not (r.get("table") == "graph_store_items" and r["row"]["key"] == "beta")]
    err = refused(kept)
    first = _line_of(kept, "graph_store_vectors", "beta") + 1
    assert f"{file}:{first}: graph_store_vectors.key: agent " in err
    assert "no item 'beta' in namespace 'users.ann.memories' earlier in the file or in the database" in err

    # Rows the store's API would not have written, refused by line.
    at = _line_of(records, "graph_store_items", "diet")
    for change, said in [
        ({"ttl_minutes": -1}, "graph_store_items.ttl_minutes: expected a positive number of minutes"),
        ({"ttl_minutes": None}, "graph_store_items.expires_at: an item expires if and only if it has ttl_"),
        ({"namespace": "users..bob"}, "graph_store_items.namespace: labels are non-empty"),
        ({"value": [1, 2]}, "graph_store_items.value: expected a dict, got list"),
        ({"key": "k" * 1025}, "graph_store_items.key: at most 1024 bytes"),
    ]:
        broken = [dict(record) for record in records]
        broken[at] = {**broken[at], "row": {**broken[at]["row"], **change}}
        _rewrite(file, broken)
        assert main(["import", destination, str(file)]) == 1
        err = capsys.readouterr().err
        assert f"{file}:{at + 1}: {said}" in err, err
    vector = next(n for n, r in enumerate(records) if r.get("table") == "graph_store_vectors")
    broken = [dict(record) for record in records]
    broken[vector] = {**broken[vector], "row": {**broken[vector]["row"], "embedding": [1.0, "x"]}}
    _rewrite(file, broken)
    assert main(["import", destination, str(file)]) == 1
    assert f"{file}:{vector + 1}: graph_store_vectors.embedding: " in capsys.readouterr().err
    assert not (tmp_path / "b.db").exists()  # a refused import leaves no database behind


def test_an_export_from_before_the_store_tables_still_imports(tmp_path: Path) -> None:
    """A file of revision 0012 names no store table in its header or end record."""
    source, destination = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    asyncio.run(_plain(source))
    file = tmp_path / "old.jsonl"
    assert main(["export", source, str(file)]) == 0
    lines = [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines()]
    lines[0]["revision"] = "0012"
    for record in (lines[0], lines[-1]):
        for name in STORE_TABLES:
            del record["tables"][name]
    _rewrite(file, lines)
    assert main(["import", destination, str(file)]) == 0
    assert dump(destination) == dump(source)
    assert dump(destination)["messages"]


async def _plain(url: str) -> None:
    async with Database(url) as db:
        await db.upgrade()
        async with db.unit_of_work() as uow:
            agent = await uow.agents.create("plain")
            chat = await uow.sessions.create(agent.id, key="k")
            await uow.messages.append(chat.id, [{"role": "user", "content": "hi"}])


@pytest.mark.postgres
@pytest.mark.anyio
class TestApplicationRole:
    """A role under row-level security moves its own tenant's store, and only it."""

    @pytest.fixture
    def engine(self) -> str:
        return "postgres"

    async def test_the_application_role_exports_copies_and_imports_its_tenants_store(
        self, roles: Roles, tmp_path: Path
    ) -> None:
        for tenant in ("a", "b"):
            await _put(roles.app.for_tenant(tenant))
        expected = await digest_database(roles.owner, tenant="a")
        assert [expected[name].count for name in STORE_TABLES] == [5, 6]
        found = await _seen(roles.app.for_tenant("a"))
        with pytest.raises(ValidationError, match=r"bypasses row-level security"):
            await export_jsonl(roles.app, tmp_path / "all.jsonl")

        file = tmp_path / "a.jsonl"
        written = await export_jsonl(roles.app, file, tenant="a")
        assert [written[name] for name in STORE_TABLES] == [5, 6]
        async with Database(f"sqlite:///{tmp_path / 'copy.db'}") as copy:
            report = await copy_database(roles.app, copy, tenant="a")
            assert not report.problems
            assert await digest_database(copy) == expected
            _same(await _seen(copy.for_tenant("a")), found)

        await roles.app.delete_tenant("a")
        assert (await digest_database(roles.owner, tenant="a"))["graph_store_items"].count == 0
        report = await import_jsonl(roles.app, file, tenant="a")
        assert [report.inserted[name] for name in STORE_TABLES] == [5, 6]
        assert await digest_database(roles.owner, tenant="a") == expected
        assert (await digest_database(roles.owner, tenant="b"))["graph_store_vectors"].count == 6
        _same(await _seen(roles.app.for_tenant("a")), found)
