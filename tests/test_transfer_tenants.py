"""Copies, exports and imports of several tenants whose rows share ids, and of one tenant alone.

The source holds tenants "B" and "a" with the very same rows (ids included;
copied with raw Core inserts), told apart by their tenant and a `meta`
entry.  "B" comes before "a" in code point order, which SQLite and
Postgres' "C" collation follow, and after it in most others (ICU's "en"):
copies between engines must still verify, and exports still import.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from memorm import Database, ValidationError
from memorm.cli import main
from memorm.compat.langgraph import MemormSaver
from memorm.models import fields
from memorm.transfer import TABLES, copy_database, digest_database, export_jsonl, import_jsonl
from memorm.transfer.rows import key_columns
from tests import test_tenancy_rls
from tests.conftest import POSTGRES_URL, admin_execute
from tests.test_cli_transfer import _execute, _populate, _rewrite_rows, _url, postgres_urls  # noqa: F401
from tests.test_tenancy_rls import Roles

pytestmark = pytest.mark.anyio

roles = test_tenancy_rls.roles  # a superuser and an application role on one schema

TENANTS = ("B", "a")  # code point order; ICU's "en" says a < B
Dump = dict[str, list[dict[str, Any]]]
ENGINES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


async def _two_tenants_async(url: str) -> None:
    """`_populate`'s rows (22) under each of TENANTS, ids and all, and nothing in the default tenant."""
    await _populate(url)
    async with Database(url) as database:
        async with database.unit_of_work(all_tenants=True) as uow:
            for table in TABLES:
                found = await uow.session.execute(sa.select(*fields(table)))
                originals = [dict(row._mapping) for row in found]
                for tenant in TENANTS if originals else ():
                    copies = [
                        {**row, "tenant": tenant, "meta": {**row["meta"], "owner": tenant}}
                        for row in originals
                    ]
                    await uow.session.execute(sa.insert(table), copies)
        await database.delete_tenant("default")


def two_tenants(url: str) -> None:
    asyncio.run(_two_tenants_async(url))


def rows(url: str, tenant: str | None = None) -> Dump:
    """Every row of every table (of `tenant`), in (tenant, id) order."""

    async def read() -> Dump:
        async with Database(url) as database, database.unit_of_work(read_only=True, all_tenants=True) as uow:
            found: Dump = {}
            for table in TABLES:
                query = sa.select(*fields(table))
                if tenant is not None:
                    query = query.where(table.c.tenant == tenant)
                got = [dict(row._mapping) for row in await uow.session.execute(query)]
                key = ["tenant", *(column.name for column in key_columns(table))]
                found[table.name] = sorted(got, key=lambda row: tuple(row[name] for name in key))
            return found

    return asyncio.run(read())


@contextmanager
def icu_postgres() -> Iterator[str]:
    """The URL of a new Postgres database whose collation is ICU's "en" (a < B), dropped afterwards."""
    name = f"memorm_icu_{uuid.uuid4().hex[:12]}"
    icu = "TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en'"
    asyncio.run(admin_execute(f'CREATE DATABASE "{name}" {icu}'))
    try:
        yield make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        asyncio.run(admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def _check_two_tenants(found: Dump) -> None:
    """Both tenants' rows are there, with the same ids."""
    for table in TABLES:
        ids = {
            tenant: [row["id"] for row in found[table.name] if row["tenant"] == tenant] for tenant in TENANTS
        }
        assert ids["B"] == ids["a"], table.name
    assert [len(found[table.name]) for table in TABLES] == [4, 8, 4, 16, 12, 0, 0, 0, 0, 0]


@pytest.fixture(params=ENGINES)
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """A source holding both TENANTS' rows and an empty destination, on one engine."""
    engine = request.param
    urls = request.getfixturevalue("postgres_urls") if engine == "postgres" else None
    source, destination = (_url(engine, tmp_path, urls, name) for name in ("source", "destination"))
    two_tenants(source)
    return source, destination


@pytest.mark.postgres
@pytest.mark.parametrize("direction", ["sqlite-to-postgres", "postgres-to-sqlite"])
def test_a_copy_of_every_tenant_carries_rows_that_share_ids_and_verifies_across_collations(
    direction: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with icu_postgres() as postgres:
        sqlite = f"sqlite:///{tmp_path / 'memorm.db'}"
        source, destination = (sqlite, postgres) if direction == "sqlite-to-postgres" else (postgres, sqlite)
        two_tenants(source)
        expected = rows(source)
        _check_two_tenants(expected)

        assert main(["copy", source, destination]) == 0
        out = capsys.readouterr().out
        assert "copied 16 messages\n" in out
        assert "verified: 44 rows in 10 tables match" in out
        assert rows(destination) == expected
        assert main(["copy", source, destination]) == 0
        assert "copied 0 messages (16 already there)" in capsys.readouterr().out

        # The export of the ICU database imports too: its rows come in code point order.
        file = tmp_path / "memory.jsonl"
        assert main(["export", postgres, str(file)]) == 0
        agents = [json.loads(line)["row"]["tenant"] for line in file.read_text().splitlines()[1:5]]
        assert agents == ["B", "B", "a", "a"]
        fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
        assert main(["import", fresh, str(file)]) == 0
        assert rows(fresh) == expected


def test_an_export_of_every_tenant_imports_both_tenants_rows_with_the_same_ids(
    pair: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, destination = pair
    file = tmp_path / "memory.jsonl"

    assert main(["export", source, str(file)]) == 0
    records = [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines()]
    assert records[0]["tenant"] is None
    assert records[0]["tables"] == {
        "agents": 4,
        "embedding_models": 8,
        "sessions": 4,
        "messages": 16,
        "archival_passages": 12,
        "graph_checkpoints": 0,
        "graph_writes": 0,
        "graph_blobs": 0,
        "graph_store_items": 0,
        "graph_store_vectors": 0,
    }
    assert {record["row"]["tenant"] for record in records[1:-1]} == set(TENANTS)
    assert main(["import", destination, str(file)]) == 0
    assert "imported 16 messages\n" in capsys.readouterr().out
    assert rows(destination) == rows(source)
    _check_two_tenants(rows(destination))
    assert main(["import", destination, str(file)]) == 0
    assert "imported 0 messages (16 already there)" in capsys.readouterr().out


def test_one_tenant_is_copied_alone_into_a_database_holding_another_with_the_same_ids(
    pair: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    source, destination = pair
    assert main(["copy", "--tenant", "B", source, destination]) == 0
    assert "verified: 22 rows of tenant 'B' in 10 tables match" in capsys.readouterr().out
    assert rows(destination) == rows(source, "B")
    _execute(destination, "UPDATE agents SET system = 'changed in the destination'")

    assert main(["copy", "--tenant", "a", source, destination]) == 0
    out = capsys.readouterr().out
    assert "copied 16 messages" not in out
    assert "copied 8 messages\n" in out  # none skipped: B's rows with these ids are another tenant's
    assert "verified: 22 rows of tenant 'a' in 10 tables match" in out
    assert rows(destination, "a") == rows(source, "a")
    assert {row["system"] for row in rows(destination, "B")["agents"]} == {"changed in the destination"}
    # Verification compares the tenant named, and only it.
    assert main(["copy", "--verify-only", "--tenant", "a", source, destination]) == 0
    capsys.readouterr()
    assert main(["copy", "--verify-only", "--tenant", "B", source, destination]) == 1
    err = capsys.readouterr().err
    assert "agents: the same 2 rows, but their ids or contents differ" in err
    assert "messages" not in err


def test_one_tenant_is_exported_alone_and_imports_only_as_that_tenant(
    pair: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, destination = pair
    assert main(["copy", "--tenant", "B", source, destination]) == 0
    file = tmp_path / "a.jsonl"

    assert main(["export", "--tenant", "a", source, str(file)]) == 0
    records = [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines()]
    assert records[0]["tenant"] == "a"
    assert sum(records[0]["tables"].values()) == 22
    assert {record["row"]["tenant"] for record in records[1:-1]} == {"a"}
    before = rows(destination)
    capsys.readouterr()

    assert main(["import", "--tenant", "B", destination, str(file)]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"memorm: error: {file}:2: agents.tenant: a row of tenant 'a', but the import is of tenant 'B'\n"
    )
    assert rows(destination) == before
    assert main(["import", "--tenant", "a", destination, str(file)]) == 0
    assert "imported 8 messages\n" in capsys.readouterr().out
    assert rows(destination, "a") == rows(source, "a")
    assert rows(destination, "B") == before  # the other tenant is untouched


@pytest.mark.parametrize("engine", ENGINES)
def test_an_export_from_before_tenants_imports_into_the_default_tenant(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    urls = request.getfixturevalue("postgres_urls") if engine == "postgres" else None
    source = f"sqlite:///{tmp_path / 'source.db'}"
    destination = _url(engine, tmp_path, urls, "destination")
    asyncio.run(_populate(source))  # the default tenant's
    file = tmp_path / "old.jsonl"
    assert main(["export", source, str(file)]) == 0
    # Revision 0007's export: no tenant in the header or in any row.
    _rewrite_rows(file, "0007", {table.name: {"tenant"} for table in TABLES})
    lines = file.read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    del header["tenant"]
    file.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n", encoding="utf-8")
    assert '"tenant"' not in file.read_text(encoding="utf-8")

    assert main(["import", destination, str(file)]) == 0
    assert "imported 8 messages" in capsys.readouterr().out
    found = rows(destination)
    assert found == rows(source)
    assert {row["tenant"] for table in TABLES for row in found[table.name]} == {"default"}


def _records(file: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines()]


def _write(file: Path, records: list[dict[str, Any]]) -> Path:
    file.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return file


@pytest.fixture(scope="module")
def tenant_a(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The records of tenant "a"'s export (header first, end record last)."""
    folder = tmp_path_factory.mktemp("tenant_a")
    url, file = f"sqlite:///{folder / 'source.db'}", folder / "a.jsonl"
    two_tenants(url)
    assert main(["export", "--tenant", "a", url, str(file)]) == 0
    return _records(file)


@pytest.mark.owner  # an import of every tenant needs a role exempt from row-level security
async def test_import_checks_refuse_rows_that_reference_another_tenants_agent(
    db: Database, tenant_a: list[dict[str, Any]], tmp_path: Path
) -> None:
    # In the file: tenant "c"'s models, sessions, messages and passages name agents of tenant "a".
    records = json.loads(json.dumps(tenant_a))
    for record in records[1:-1]:
        if record["table"] != "agents":
            record["row"]["tenant"] = "c"
    mixed = _write(tmp_path / "mixed.jsonl", records)
    before = await digest_database(db)
    with pytest.raises(ValidationError) as refused:
        await import_jsonl(db, mixed)
    first = next(i for i, record in enumerate(records) if record.get("table") == "embedding_models")
    agent = records[first]["row"]["agent_id"]
    assert str(refused.value) == (
        f"{mixed}:{first + 1}: embedding_models.agent_id: no agent {agent} of tenant 'c' "
        "earlier in the file or in the database"
    )
    assert await digest_database(db) == before

    # In the database: its agents are tenant "a"'s; the file's rows of tenant "c" name them.
    report = await import_jsonl(db, _write(tmp_path / "a.jsonl", tenant_a), tenant="a")
    assert report.inserted["messages"] == 8
    without_agents = [record for record in records if record.get("table") != "agents"]
    without_agents[-1]["tables"]["agents"] = 0
    orphans = _write(tmp_path / "orphans.jsonl", without_agents)
    before = await digest_database(db)
    for tenant in ("c", None):
        with pytest.raises(ValidationError, match=f"^{orphans}:2: embedding_models.agent_id: no agent"):
            await import_jsonl(db, orphans, tenant=tenant)
    # A message of "c" in a session only "a" has is refused the same way.
    message = next(record for record in without_agents if record.get("table") == "messages")
    counts = {table.name: int(table.name == "messages") for table in TABLES}
    lone = _write(
        tmp_path / "lone.jsonl",
        [{**without_agents[0], "tables": counts}, message, {"end": True, "tables": counts}],
    )
    with pytest.raises(ValidationError, match=f"^{lone}:2: messages.session_id: no session .* of tenant 'c'"):
        await import_jsonl(db, lone)
    assert await digest_database(db) == before


async def test_a_bad_tenant_is_refused_before_anything_is_read_or_written(
    db: Database, tmp_path: Path
) -> None:
    for bad in ("", "x" * 129, "nul\x00", 5):
        with pytest.raises(ValidationError, match="tenant"):
            await export_jsonl(db, tmp_path / "out.jsonl", tenant=bad)  # type: ignore[arg-type]
        with pytest.raises(ValidationError, match="tenant"):
            await copy_database(db, Database(f"sqlite:///{tmp_path / 'copy.db'}"), tenant=bad)  # type: ignore[arg-type]
        with pytest.raises(ValidationError, match="tenant"):
            await digest_database(db, tenant=bad)  # type: ignore[arg-type]
    assert not await anyio.Path(tmp_path / "out.jsonl").exists()
    assert not await anyio.Path(tmp_path / "copy.db").exists()


def test_the_cli_refuses_a_bad_tenant_in_one_line_creating_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = f"sqlite:///{tmp_path / 'source.db'}"
    asyncio.run(_populate(source))
    capsys.readouterr()
    for argv in (
        ["copy", "--tenant", "", source, f"sqlite:///{tmp_path / 'copy.db'}"],
        ["export", "--tenant", "", source, str(tmp_path / "out.jsonl")],
        ["import", "--tenant", "", f"sqlite:///{tmp_path / 'import.db'}", str(tmp_path / "nofile.jsonl")],
    ):
        assert main(argv) == 1
        assert capsys.readouterr().err == "memorm: error: tenant: must not be empty\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["source.db"]


@pytest.mark.postgres
class TestApplicationRole:
    """A role under row-level security moves its own tenant, and is refused every tenant."""

    @pytest.fixture
    def engine(self) -> str:
        return "postgres"

    async def test_the_application_role_exports_copies_and_imports_its_own_tenant(
        self, roles: Roles, tmp_path: Path
    ) -> None:
        for tenant in ("a", "b"):
            async with roles.app.unit_of_work(tenant) as uow:
                agent = await uow.agents.create("sam")
                chat = await uow.sessions.create(agent.id)
                # 70 messages: past the batch size at which the bulk path would COPY.
                await uow.messages.append(
                    chat.id, [{"role": "user", "content": f"{tenant} {n}"} for n in range(70)]
                )
            # Graph state too, whose tables row-level security covers as well.
            from tests.test_transfer_graph import _graph as graph  # it imports this module

            saver = MemormSaver(roles.app.for_tenant(tenant), agent=agent.id)
            await (
                graph(ask=True)
                .compile(checkpointer=saver)
                .ainvoke({"Alpha": 1, "beta": [], "Zed": ""}, {"configurable": {"thread_id": "t"}})
            )
        expected = await digest_database(roles.owner, tenant="a")
        assert expected["graph_writes"].count > 0
        with pytest.raises(ValidationError, match=r"bypasses row-level security.*--tenant NAME"):
            await export_jsonl(roles.app, tmp_path / "all.jsonl")
        assert not (tmp_path / "all.jsonl").exists()

        file = tmp_path / "a.jsonl"
        written = await export_jsonl(roles.app, file, tenant="a")
        assert written["messages"] == 70
        assert written["graph_checkpoints"] == expected["graph_checkpoints"].count
        async with Database(f"sqlite:///{tmp_path / 'copy.db'}") as copy:
            report = await copy_database(roles.app, copy, tenant="a")
            assert not report.problems
            assert await digest_database(copy) == expected

        await roles.app.delete_tenant("a")
        report = await import_jsonl(roles.app, file, tenant="a")
        assert report.inserted["messages"] == 70
        assert report.analyzed == []  # not the tables' owner: their statistics are autovacuum's
        assert report.inserted["graph_blobs"] == expected["graph_blobs"].count
        assert await digest_database(roles.owner, tenant="a") == expected
        assert (await digest_database(roles.owner, tenant="b"))["messages"].count == 70
