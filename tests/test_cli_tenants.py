"""``memorm tenant list|delete`` and ``memorm db create-role``, run in-process on both engines.

``main`` runs its own event loop, so these tests are plain functions that
build and read their data with ``asyncio.run``.  On Postgres each test gets a
throwaway database (a URL cannot carry a search_path); the tests of the
application role connect as one that `memorm db create-role` made, which
row-level security holds to one tenant.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest
import sqlalchemy as sa
from cli_run import drawn_progress, memorm, run, usage_error
from sqlalchemy.engine import make_url
from tenant_data import FILLED, NO_GRAPH, NO_LANGGRAPH, NO_STORE, TABLES, WORDS, fill, rows_of

from memorm import Database, metadata
from memorm.cli import tenant as tenant_cli
from memorm.tenants import DELETE_BATCH, scram_sha_256


async def _upgrade(url: str) -> None:
    async with Database(url) as db:
        await db.upgrade()


async def _fill(url: str, *tenants: str) -> None:
    async with Database(url) as db:
        for tenant in tenants:
            await fill(db, tenant)


async def _rows(url: str, *tenants: str) -> dict[str, dict[str, tuple[int, str]]]:
    async with Database(url) as db:
        return {tenant: await rows_of(db, tenant) for tenant in tenants}


@pytest.fixture
def url(plain_url: str) -> str:
    run(_upgrade(plain_url))
    return plain_url


@pytest.fixture
def tenants(url: str) -> str:
    """The database with the same rows (`FILLED`) in tenants acme and globex."""
    run(_fill(url, "acme", "globex"))
    return url


LISTED = [
    "tenant  agents  embedding_models  sessions  messages  archival_passages",
    "acme         2                 3         3         7                  4",
    "globex       2                 3         3         7                  4",
]


# -- memorm tenant list ------------------------------------------------------------


def test_tenant_list_shows_each_tenant_with_its_rows_per_table(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert memorm(capsys, "tenant", "list", "--url", url) == (
        0,
        "no tenants: the database holds no rows\n",
        "",
    )
    run(_fill(url, "globex", "acme"))
    code, out, err = memorm(capsys, "tenant", "list", "--url", url)
    assert (code, err) == (0, "")
    assert out.splitlines() == LISTED
    code, out, _ = memorm(capsys, "tenant", "list", "--json", "--url", url)
    assert code == 0
    assert json.loads(out) == {"acme": FILLED, "globex": FILLED}


# -- memorm tenant delete ----------------------------------------------------------

DELETED = [
    "deleted 2 agents",
    "deleted 3 embedding_models",
    "deleted 3 sessions",
    "deleted 7 messages",
    "deleted 4 archival_passages",
    "deleted 0 graph_checkpoints",
    "deleted 0 graph_writes",
    "deleted 0 graph_blobs",
    "deleted 0 graph_store_items",
    "deleted 0 graph_store_vectors",
]

# What `memorm db scrub` vacuums on Postgres: every table a purge, `forget` or delete_tenant deletes from.
SCRUBBED = (
    "agent_names, agents, embedding_models, sessions, messages, archival_passages, graph_checkpoints, "
    "graph_writes, graph_blobs, graph_store_items, graph_store_vectors"
)


def _fts(url: str, word: str) -> int:
    async def count() -> int:
        async with Database(url) as db, db.engine.connect() as connection:
            query = "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH :w"
            return int(await connection.scalar(sa.text(query), {"w": word}) or 0)

    return run(count())


def test_tenant_delete_dry_run_counts_and_changes_nothing(
    tenants: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = run(_rows(tenants, "acme", "globex"))
    code, out, err = memorm(capsys, "tenant", "delete", "acme", "--dry-run", "--url", tenants)
    assert (code, err) == (0, "")
    assert out.splitlines() == [line.replace("deleted", "would delete") for line in DELETED]
    assert run(_rows(tenants, "acme", "globex")) == before


def test_tenant_delete_removes_every_row_of_the_tenant_and_nothing_of_another(
    tenants: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run(_fill(tenants, "default"))
    before = run(_rows(tenants, "globex", "default"))
    sqlite = tenants.startswith("sqlite")
    if sqlite:
        assert _fts(tenants, WORDS["acme"]) == 7
    code, out, err = memorm(capsys, "tenant", "delete", "acme", "--batch-size", "2", "--url", tenants)
    assert (code, err) == (0, "")
    assert out.splitlines() == DELETED
    assert run(_rows(tenants, "acme"))["acme"] == run(_rows(tenants, "nobody"))["nobody"]  # empty tables
    assert run(_rows(tenants, "globex", "default")) == before
    if sqlite:  # the full-text index itself holds none of acme's words, and all of the others'
        assert _fts(tenants, WORDS["acme"]) == 0
        assert _fts(tenants, WORDS["globex"]) == 7
    listed = memorm(capsys, "tenant", "list", "--url", tenants)[1].splitlines()
    assert [line.split() for line in listed[1:]] == [
        ["default", "2", "3", "3", "7", "4"],
        ["globex", "2", "3", "3", "7", "4"],
    ]
    code, out, _ = memorm(capsys, "tenant", "delete", "acme", "--url", tenants)  # again: nothing there
    assert (code, out) == (0, "tenant 'acme' has no rows: nothing to delete\n")


def test_tenant_delete_reports_progress_per_table(
    tenants: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bars = drawn_progress(monkeypatch)
    assert memorm(capsys, "tenant", "delete", "globex", "--batch-size", "1", "--url", tenants)[0] == 0
    assert {task.description: (task.completed, task.total) for task in bars[0].tasks} == {
        table: (count, count) for table, count in {**FILLED, **NO_LANGGRAPH}.items()
    }


async def _graph_state(url: str, *tenants: str) -> dict[str, dict[str, int]]:
    """Each tenant's graph-state rows, after a LangGraph graph ran in two threads (in one if globex)."""
    from langgraph.graph import START, MessagesState, StateGraph

    from memorm.compat.langgraph import MemormSaver

    builder = StateGraph(MessagesState)
    builder.add_node("reply", lambda state: {"messages": [("ai", "hello")]})
    builder.add_edge(START, "reply")
    async with Database(url) as db:
        counts = {}
        for tenant in tenants:
            view = db.for_tenant(tenant)
            async with view.unit_of_work() as uow:
                agent = await uow.agents.get_by_name("sam")
            assert agent is not None
            graph = builder.compile(checkpointer=MemormSaver(view, agent=agent.id))
            for name in ("t-1", "t-2")[: 1 if tenant == "globex" else 2]:
                await graph.ainvoke({"messages": [("user", "hi")]}, {"configurable": {"thread_id": name}})
            async with view.unit_of_work(read_only=True) as uow:
                counts[tenant] = await _graph_rows(uow, tenant)
        return counts


async def _graph_rows(uow: Any, tenant: str) -> dict[str, int]:
    query = "SELECT count(*) FROM {} WHERE tenant = :tenant"  # raw SQL: every tenant's rows but for the WHERE
    return {
        table: int(await uow.session.scalar(sa.text(query.format(table)), {"tenant": tenant}) or 0)
        for table in NO_GRAPH
    }


def test_tenant_delete_prints_the_graph_state_it_deletes(
    tenants: str, capsys: pytest.CaptureFixture[str]
) -> None:
    graph = run(_graph_state(tenants, "acme", "globex"))
    assert all(graph["acme"].values())
    assert graph["acme"]["graph_checkpoints"] == 2 * graph["globex"]["graph_checkpoints"]
    globex = run(_rows(tenants, "globex"))
    counted = {**FILLED, "sessions": FILLED["sessions"] + 2, **graph["acme"], **NO_STORE}
    code, out, err = memorm(capsys, "tenant", "delete", "acme", "--dry-run", "--url", tenants)
    assert (code, err) == (0, "")
    assert out.splitlines() == [f"would delete {n} {table}" for table, n in counted.items()]
    code, out, err = memorm(capsys, "tenant", "delete", "acme", "--batch-size", "3", "--url", tenants)
    assert (code, err) == (0, "")
    assert out.splitlines() == [f"deleted {n} {table}" for table, n in counted.items()]

    async def left(tenant: str) -> dict[str, int]:
        async with Database(tenants) as db, db.unit_of_work(tenant, read_only=True) as uow:
            return await _graph_rows(uow, tenant)

    assert run(left("acme")) == NO_GRAPH
    assert run(left("globex")) == graph["globex"]
    after = run(_rows(tenants, "globex"))
    assert after["globex"]["sessions"][0] == globex["globex"]["sessions"][0]


def test_tenant_delete_refuses_bad_names_and_batch_sizes(
    tenants: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = run(_rows(tenants, "acme"))
    assert "argument NAME: must not be empty" in usage_error(capsys, "tenant", "delete", "", "--url", tenants)
    assert "more than the 128" in usage_error(capsys, "tenant", "delete", "x" * 129, "--url", tenants)
    for size in ("0", "1000001", "ten", "-1", "1.5"):
        err = usage_error(capsys, "tenant", "delete", "acme", f"--batch-size={size}", "--url", tenants)
        assert "argument --batch-size: expected a whole number from 1 to 1,000,000" in err, size
    assert "ACTION" in usage_error(capsys, "tenant", "--url", tenants)
    assert run(_rows(tenants, "acme")) == before


def test_the_tenant_command_states_the_batch_size_delete_tenant_uses() -> None:
    assert tenant_cli.DEFAULT_BATCH == DELETE_BATCH


def test_db_scrub_prints_what_it_cleaned(tenants: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = memorm(capsys, "db", "scrub", "--url", tenants)
    assert (code, err) == (0, "")
    if tenants.startswith("sqlite"):
        assert out.splitlines() == [
            "merged messages_fts, archival_passages_fts",
            "truncated the write-ahead log",
        ]
    else:
        assert out.splitlines() == [f"vacuumed {SCRUBBED}"]


# -- memorm db create-role and the application role (Postgres) -----------------------


def _admin_fetch(url: str, query: str, *args: Any) -> Any:
    async def fetch() -> Any:
        dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        connection = await asyncpg.connect(dsn)
        try:
            return await connection.fetchrow(query, *args)
        finally:
            await connection.close()

    return run(fetch())


@pytest.fixture
def role(url: str) -> Iterator[str]:
    """A role name, dropped (with its grants in the test's database) afterwards."""
    name = f"memorm_app_{uuid.uuid4().hex[:10]}"
    yield name

    async def drop() -> None:
        dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        connection = await asyncpg.connect(dsn)
        try:
            if await connection.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", name):
                await connection.execute(f'DROP OWNED BY "{name}"')
                await connection.execute(f'DROP ROLE "{name}"')
        finally:
            await connection.close()

    run(drop())


def _as(url: str, role: str) -> str:
    return make_url(url).set(username=role).render_as_string(hide_password=False)


async def _tenants_seen(url: str, tenant: str) -> set[str]:
    async with Database(url) as db, db.unit_of_work(tenant, read_only=True) as uow:
        seen: set[str] = set()
        for table in TABLES:
            seen |= set((await uow.session.execute(sa.select(table.c.tenant).distinct())).scalars())
        return seen


@pytest.mark.postgres
@pytest.mark.parametrize("engine", ["postgres"], indirect=True)
def test_create_role_makes_a_role_row_level_security_holds_to_one_tenant(
    tenants: str, role: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = memorm(capsys, "db", "create-role", role, "--url", tenants)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    database = make_url(tenants).database
    attributes = "LOGIN NOSUPERUSER NOBYPASSRLS NOREPLICATION NOCREATEROLE NOCREATEDB"
    assert lines == [
        f"role {role} created: {attributes}",
        f"granted CONNECT on database {database}",
        "granted USAGE on schema public",
        *(f"granted SELECT, INSERT, UPDATE, DELETE on {table}" for table in metadata.tables),  # each one
        "granted SELECT on alembic_version",
        "granted SELECT, INSERT, UPDATE, DELETE on the tables root creates later in schema public "
        "(default privileges)",
    ]
    code, out, err = memorm(capsys, "db", "create-role", role, "--url", tenants)  # again: fine
    assert (code, err) == (0, "")
    assert out.splitlines() == [f"role {role} updated: {attributes}", *lines[1:]]
    flags = _admin_fetch(
        tenants,
        "SELECT rolsuper, rolbypassrls, rolcanlogin, rolpassword FROM pg_authid WHERE rolname = $1",
        role,
    )
    assert tuple(flags) == (False, False, True, None)
    app = _as(tenants, role)
    assert run(_tenants_seen(app, "acme")) == {"acme"}  # raw SQL, yet one tenant
    assert run(_tenants_seen(app, "globex")) == {"globex"}
    assert run(_tenants_seen(tenants, "acme")) == {"acme", "globex"}  # the superuser sees all


@pytest.mark.postgres
@pytest.mark.parametrize("engine", ["postgres"], indirect=True)
def test_create_role_takes_its_password_from_the_environment_only(
    url: str, role: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "s3cret-" + uuid.uuid4().hex
    monkeypatch.delenv("MEMORM_TEST_APP_PASSWORD", raising=False)
    argv = ["db", "create-role", role, "--password-env", "MEMORM_TEST_APP_PASSWORD", "--url", url]
    code, out, err = memorm(capsys, *argv)
    assert (code, out) == (1, "")
    assert (
        err == "memorm: error: --password-env: the environment variable MEMORM_TEST_APP_PASSWORD is not set\n"
    )
    monkeypatch.setenv("MEMORM_TEST_APP_PASSWORD", "")
    assert "is empty" in memorm(capsys, *argv)[2]
    assert _admin_fetch(url, "SELECT 1 FROM pg_roles WHERE rolname = $1", role) is None  # nothing made

    monkeypatch.setenv("MEMORM_TEST_APP_PASSWORD", secret)
    code, out, err = memorm(capsys, *argv)
    assert (code, err) == (0, "")
    assert "password set (sent as a SCRAM-SHA-256 verifier)" in out.splitlines()
    assert secret not in out
    found = _admin_fetch(url, "SELECT rolpassword FROM pg_authid WHERE rolname = $1", role)
    stored = found["rolpassword"]
    assert secret not in stored  # stored hashed
    # The verifier Postgres keeps is the one memorm computed: the password itself never went to the server.
    salt = base64.b64decode(stored.split("$")[1].split(":")[1])
    assert stored == scram_sha_256(secret, salt=salt)
    assert "--url" in usage_error(capsys, "db", "create-role", role)  # the admin URL is required


def test_create_role_on_sqlite_is_one_line(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    run(_upgrade(url))
    code, out, err = memorm(capsys, "db", "create-role", "app", "--url", url)
    assert (code, out) == (1, "")
    assert err == "memorm: error: create-role is for Postgres: SQLite has no roles\n"


@pytest.mark.postgres
@pytest.mark.parametrize("engine", ["postgres"], indirect=True)
def test_the_application_role_runs_one_tenant_and_is_told_so_for_every_tenant(
    tenants: str, role: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert memorm(capsys, "db", "create-role", role, "--url", tenants)[0] == 0
    app = _as(tenants, role)
    for argv in (
        ["tenant", "list"],
        ["stats"],
        ["purge", "--expired"],
        ["purge", "--older-than", "1d", "--dry-run"],
        ["forget", "--meta", "tenant=acme"],
    ):
        code, out, err = memorm(capsys, *argv, "--url", app)
        assert (code, out) == (1, ""), argv
        assert err.startswith(f"memorm: error: `memorm {argv[0]}"), err
        assert "row-level security" in err
        assert err.endswith("" if argv[0] == "tenant" else "or give --tenant NAME\n"), err
        assert len(err.splitlines()) == 1
    # In one tenant the application role does it all.
    code, out, err = memorm(capsys, "forget", "--meta", "tenant=acme", "--tenant", "acme", "--url", app)
    assert code == 0
    assert out.splitlines()[0] == "removed 1 agents"
    # Only the tables' owner may VACUUM them: the scrub says it skipped them, never that it cleaned them.
    assert err == (
        f"memorm: warning: scrub skipped {SCRUBBED}: "
        "only their owner (or a superuser) may VACUUM a table or rebuild its indexes, so deleted rows' "
        "old versions stay in the files until a scrub runs as the owner (`memorm db scrub --url OWNER_URL`, "
        "or `await db.scrub()`)\n"
    )
    code, out, err = memorm(capsys, "db", "scrub", "--url", app)  # a scrub and nothing else: exit 1
    assert (code, out) == (1, "")
    assert err.startswith(f"memorm: warning: scrub skipped {SCRUBBED}:")
    code, out, err = memorm(capsys, "db", "scrub", "--reindex", "--url", tenants)  # the owner's: all of it
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"vacuumed {SCRUBBED}",
        "rebuilt ix_messages_search_words_fts, ix_archival_passages_search_words_fts",
    ]
    code, out, _ = memorm(capsys, "stats", "--tenant", "globex", "--url", app)
    assert code == 0
    assert "tenant 'globex'" in out
    code, out, err = memorm(capsys, "tenant", "delete", "globex", "--url", app)
    assert (code, err) == (0, "")
    assert out.splitlines() == DELETED
    assert memorm(capsys, "tenant", "list", "--url", tenants)[1].splitlines() == [
        "tenant  agents  embedding_models  sessions  messages  archival_passages",
        "acme         1                 1         1         2                  2",
    ]
