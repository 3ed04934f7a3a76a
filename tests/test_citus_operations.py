"""Operations on a whole database, run against a distributed one (the local Citus cluster).

Copies (Postgres -> Citus -> Postgres and SQLite), exports and imports,
`stats`, the purges, `forget` and `delete_tenant`, through the CLI as the
other CLI tests run them (``main`` runs its own event loop, so these are
plain functions), or through the Python API.  The data and the expected
results are those of the single-engine tests (tests/test_cli_retention.py,
tests/test_cli_transfer.py, tests/test_transfer_tenants.py): a distributed
database must give the same answers.  Statements that cross agents fan
out over the shards; the few that Citus runs only on one shard (row locks,
recursive queries, correlated subqueries not joined on `agent_id`) were
rewritten, for every engine.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
from cli_run import memorm, run
from tenant_data import FILLED, NO_LANGGRAPH, WORDS, fill, rows_of

from memorm import Database, DatabaseError, MemormError
from memorm.models import metadata
from memorm.retention import Removed, purge_expired, purge_older_than
from memorm.schema_state import is_distributed
from memorm.types import utcnow
from tests import citus_kit, test_cli_transfer
from tests.conftest import count_rows
from tests.test_cli_retention import (
    HISTORY,
    PEOPLE,
    PURGES,
    _history,
    _people,
    _refill,
    counts,
    doubled,
    snapshot,
)
from tests.test_cli_transfer import _check_populated, _populate, dump
from tests.test_transfer_graph import DONE, RESUMED
from tests.test_transfer_graph import _resume as graph_resume
from tests.test_transfer_graph import fill as graph_fill
from tests.test_transfer_store import _same as same_store
from tests.test_transfer_store import fill as store_fill
from tests.test_transfer_store import seen as store_seen
from tests.test_transfer_tenants import _check_two_tenants, rows, two_tenants

# Whole-database operations and a rebalance under load: with the long runs (-m long).
pytestmark = [pytest.mark.citus, pytest.mark.long]

citus_url = citus_kit.citus_url
cluster = citus_kit.cluster
cluster_url = citus_kit.cluster_url
cluster_urls = citus_kit.cluster_urls
postgres_urls = test_cli_transfer.postgres_urls


def _distributed(url: str) -> bool:
    async def check() -> bool:
        async with Database(url) as db:
            return await is_distributed(db)

    return run(check())


def _found_by_search(url: str, tenant: str, query: str) -> list[int]:
    """How many messages each agent of `tenant` finds for `query` (full-text, on its shard)."""

    async def search() -> list[int]:
        async with Database(url) as db, db.unit_of_work(tenant, read_only=True) as uow:
            agents = (await uow.agents.list()).items
            return [(await uow.messages.search(agent.id, query)).total for agent in agents]

    return run(search())


# -- copy ------------------------------------------------------------------------


@pytest.mark.postgres
def test_copy_moves_two_tenants_from_postgres_onto_the_cluster_and_back_to_postgres_and_sqlite(
    cluster_url: str, postgres_urls: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = postgres_urls.new()
    two_tenants(source)  # the same rows, ids and all, in tenants "B" and "a"
    expected = rows(source)
    _check_two_tenants(expected)

    code, out, err = memorm(capsys, "copy", source, cluster_url)
    assert (code, err) == (0, "")
    assert "copied 16 messages" in out
    assert "verified: 44 rows in 10 tables match" in out
    assert rows(cluster_url) == expected
    assert _distributed(cluster_url)  # the rows went into the distributed tables
    # The shards computed the search words, and each agent's search runs on its shard.
    assert _found_by_search(cluster_url, "a", "NAÏVE 日本語") == [1, 1]
    code, out, _ = memorm(capsys, "copy", source, cluster_url)  # re-run: nothing new
    assert code == 0
    assert "copied 0 messages (16 already there)" in out

    for destination in (postgres_urls.new(), f"sqlite:///{tmp_path / 'from-citus.db'}"):
        code, out, err = memorm(capsys, "copy", cluster_url, destination)
        assert (code, err) == (0, ""), destination
        assert "verified: 44 rows in 10 tables match" in out
        assert rows(destination) == expected
        assert memorm(capsys, "copy", "--verify-only", cluster_url, destination)[0] == 0
        code, out, err = memorm(capsys, "copy", "--tenant", "a", cluster_url, destination)
        assert (code, err) == (0, "")
        assert "verified: 22 rows of tenant 'a' in 10 tables match" in out


def test_copy_carries_the_graph_state_onto_the_cluster_and_the_graph_resumes_there(
    cluster_urls: citus_kit.ClusterUrls, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, target = f"sqlite:///{tmp_path / 'graphs.db'}", cluster_urls.new()
    graph_fill(source)
    expected = dump(source)
    code, out, err = memorm(capsys, "copy", source, target, "--batch-size", "2")
    assert (code, err) == (0, "")
    assert f"copied {len(expected['graph_writes'])} graph_writes\n" in out
    assert "in 10 tables match" in out
    assert dump(target) == expected
    assert _distributed(target)
    assert graph_resume(target) == (DONE, RESUMED)


def test_copy_and_export_carry_the_store_onto_the_cluster_and_back(
    cluster_urls: citus_kit.ClusterUrls, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, target = f"sqlite:///{tmp_path / 'store.db'}", cluster_urls.new()
    store_fill(source, "acme", "globex")
    expected, found = dump(source), store_seen(source, "acme")
    code, out, err = memorm(capsys, "copy", source, target, "--batch-size", "2")
    assert (code, err) == (0, "")
    assert "copied 10 graph_store_items\n" in out
    assert "in 10 tables match" in out
    assert dump(target) == expected
    assert _distributed(target)
    same_store(store_seen(target, "acme"), found)  # the store's calls run on the agent's shard
    code, out, err = memorm(capsys, "copy", source, target)
    assert "copied 0 graph_store_vectors (12 already there)\n" in out
    file = tmp_path / "acme.jsonl"
    assert memorm(capsys, "export", "--tenant", "acme", target, str(file))[0] == 0
    back = f"sqlite:///{tmp_path / 'back.db'}"
    assert memorm(capsys, "import", back, str(file))[0] == 0
    assert dump(back) == {name: [r for r in rows if r["tenant"] == "acme"] for name, rows in expected.items()}
    same_store(store_seen(back, "acme"), found)


# -- export / import ---------------------------------------------------------------


def test_an_export_of_the_cluster_imports_into_sqlite_and_into_another_cluster(
    cluster_urls: citus_kit.ClusterUrls, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = cluster_urls.new()
    run(_populate(source))  # 22 rows in the default tenant, float16 vectors among them

    async def acme() -> None:
        async with Database(source) as db:
            await fill(db, "acme")

    run(acme())
    expected = rows(source)
    _check_populated(
        {name: [r for r in found if r["tenant"] == "default"] for name, found in expected.items()}
    )
    file = tmp_path / "cluster.jsonl.gz"
    code, out, err = memorm(capsys, "export", source, str(file))
    assert (code, err) == (0, "")
    assert "exported 15 messages" in out  # 8 + acme's 7

    lite = f"sqlite:///{tmp_path / 'imported.db'}"
    target = cluster_urls.new()
    for destination in (lite, target):
        code, out, err = memorm(capsys, "import", destination, str(file))
        assert (code, err) == (0, ""), destination
        assert "imported 15 messages" in out
        assert rows(destination) == expected
        code, out, _ = memorm(capsys, "import", destination, str(file))  # again: every row is there
        assert "imported 0 messages (15 already there)" in out
    assert _distributed(target)
    assert dump(target) == dump(source)

    one = tmp_path / "acme.jsonl"
    assert memorm(capsys, "export", "--tenant", "acme", source, str(one))[0] == 0
    header = json.loads(one.read_text().splitlines()[0])
    assert (header["tenant"], header["tables"]) == ("acme", {**FILLED, **NO_LANGGRAPH})
    alone = cluster_urls.new()
    assert memorm(capsys, "import", "--tenant", "acme", alone, str(one))[0] == 0
    assert rows(alone) == rows(source, "acme")


# -- stats -------------------------------------------------------------------------


async def _placed_bytes(url: str) -> int:
    """What memorm's tables take on the workers and the coordinator, shard by shard (citus_shards)."""
    connection = await asyncpg.connect(citus_kit.asyncpg_url(url))
    try:
        names = [table.name for table in metadata.sorted_tables]  # every table of memorm's, as stats
        return int(
            await connection.fetchval(
                "SELECT sum(shard_size) FROM citus_shards WHERE table_name::text = ANY($1::text[])", names
            )
        )
    finally:
        await connection.close()


def test_stats_count_every_shard_and_size_the_shards_not_the_coordinator(
    cluster_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async def fill_both() -> None:
        async with Database(cluster_url) as db:
            await fill(db, "acme")
            await fill(db, "globex")
            async with db.unit_of_work("acme") as uow:  # a long session, and one past its expiry
                agent = await uow.agents.create("talker")
                chat = await uow.sessions.create(agent.id, title="long", ttl=60)
                await uow.sessions.touch(chat.id, ttl=60, now=utcnow() - timedelta(hours=1))
                words = "x" * 2000
                await uow.messages.append(
                    chat.id, [{"role": "user", "content": f"{words} {n}"} for n in range(300)]
                )

    run(fill_both())
    code, out, err = memorm(capsys, "stats", "--url", cluster_url)
    assert (code, err) == (0, "")
    table = dict(re.findall(r"│ (\w+) +│ +(\d+) │", out))
    assert table == {
        "agent_names": "5",
        "agents": "5",
        "archival_passages": "8",
        "embedding_models": "6",
        "graph_blobs": "0",
        "graph_checkpoints": "0",
        "graph_store_items": "0",
        "graph_store_vectors": "0",
        "graph_writes": "0",
        "messages": "314",
        "sessions": "7",
    }
    assert "every tenant (2)" in out
    assert "awaiting `memorm purge --expired`: 1" in out
    largest = re.findall(r"│ (acme|globex) +│ (\w+) +│ ([^│]+?) +│ [0-9a-f-]{36} │ +(\d+) │", out)
    assert largest[:3] == [
        ("acme", "talker", "long", "300"),
        ("acme", "sam", "anvilrocket chat", "4"),
        ("globex", "sam", "hammockfern chat", "4"),
    ]
    size = int(re.search(r"size on disk \(memorm's tables and indexes\): .* \((\d+) bytes\)", out).group(1))
    placed = run(_placed_bytes(cluster_url))
    assert placed > 600_000  # the 300 long messages, on the workers
    assert 0.9 * placed <= size <= 1.1 * placed

    code, out, _ = memorm(capsys, "stats", "--tenant", "globex", "--url", cluster_url)
    assert code == 0
    assert dict(re.findall(r"│ (\w+) +│ +(\d+) │", out))["messages"] == "7"
    assert "awaiting" not in out


# -- purge and forget ----------------------------------------------------------------


def _history_in(url: str, *tenants: str) -> None:
    for tenant in tenants:
        run(_history(url, tenant))


def test_each_purge_removes_the_same_rows_on_the_cluster_in_one_tenant_or_every_tenant(
    cluster_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _history_in(cluster_url, "default", "acme")
    assert snapshot(cluster_url) == snapshot(cluster_url, "acme") == HISTORY
    for options, (lines, remaining) in PURGES.items():
        code, out, err = memorm(capsys, "purge", *options.split(), "--tenant", "acme", "--url", cluster_url)
        assert (code, err) == (0, ""), options
        assert out.splitlines() == lines, options
        assert snapshot(cluster_url, "acme") == remaining, options
        assert snapshot(cluster_url) == HISTORY, options
        run(_refill(cluster_url, "acme"))

        code, out, _ = memorm(capsys, "purge", *options.split(), "--dry-run", "--url", cluster_url)
        assert out.splitlines() == [line.replace("removed", "would remove") for line in doubled(lines)]
        code, out, err = memorm(capsys, "purge", *options.split(), "--batch", "1", "--url", cluster_url)
        assert (code, err) == (0, ""), options
        assert out.splitlines() == doubled(lines), options
        assert snapshot(cluster_url, "acme") == snapshot(cluster_url) == remaining, options
        run(_refill(cluster_url, "acme"))
        run(_refill(cluster_url))


def test_forget_erases_a_person_across_shards_in_one_tenant_or_every_tenant(
    cluster_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for tenant in ("default", "acme"):
        run(_people(cluster_url, tenant))
    assert snapshot(cluster_url) == snapshot(cluster_url, "acme") == PEOPLE
    lines = counts(agents=1, sessions=2, messages=6, passages=2)
    code, out, _ = memorm(capsys, "forget", "--meta", "user_id=u42", "--dry-run", "--url", cluster_url)
    assert (code, out.splitlines()) == (
        0,
        [line.replace("removed", "would remove") for line in doubled(lines)],
    )
    code, out, err = memorm(
        capsys, "forget", "--meta", "user_id=u42", "--tenant", "acme", "--url", cluster_url
    )
    assert (code, err) == (0, "")
    assert out.splitlines() == lines
    forgotten = {
        "shared/u7 chat": ["u7 speaks", "u7 in french", "u7 in english"],
        "shared passages": ["u7 fact", "int 42", "string 42", "vip true", "vip string"],
    }
    assert snapshot(cluster_url, "acme") == forgotten
    assert snapshot(cluster_url) == PEOPLE
    # Every tenant's u7, then the full-text indexes rebuilt on every shard (REINDEX CONCURRENTLY).
    code, out, err = memorm(capsys, "forget", "--meta", "user_id=u7", "--reindex", "--url", cluster_url)
    assert (code, err) == (0, "")
    assert out.splitlines() == counts(sessions=2, messages=3 + 4, passages=2)
    facts = ["int 42", "string 42", "vip true", "vip string"]
    assert snapshot(cluster_url, "acme") == {"shared passages": facts}
    assert snapshot(cluster_url) == {
        "u42-bot/bot chat": PEOPLE["u42-bot/bot chat"],
        "shared/u42 chat": PEOPLE["shared/u42 chat"],
        "shared passages": ["u42 fact", *facts],
        "u42-bot passages": PEOPLE["u42-bot passages"],
    }


@pytest.mark.anyio
async def test_an_agents_history_purge_runs_on_its_shard_alone(cluster: Database, citus_url: str) -> None:
    """With citus.multi_task_query_log_level = 'error', any statement that asks several shards fails.

    The purge of one agent's old messages (their tool answers with them, and
    leaving out sessions already expired) and old passages names the agent
    in every statement.
    """
    now = utcnow()
    call = {"id": "call_1", "type": "function", "function": {"name": "look", "arguments": "{}"}}
    async with cluster.unit_of_work() as uow:
        agent = await uow.agents.create("sam")
        chat = await uow.sessions.create(agent.id, ttl=3600)
        old, recent = now - timedelta(days=40), now - timedelta(days=1)
        await uow.messages.append(
            chat.id,
            [
                {"role": "user", "content": "old q", "created_at": old},
                {"role": "assistant", "content": "", "tool_calls": [call], "created_at": old},
                {"role": "tool", "content": "recent answer", "tool_call_id": "call_1", "created_at": recent},
                {"role": "user", "content": "recent q", "created_at": recent},
            ],
        )
        await uow.passages.add_many(
            agent.id,
            [
                {"text": f"fact {age.days}d", "embedding": [1.0, 0.0], "created_at": now - age}
                for age in (timedelta(days=40), timedelta(days=1))
            ],
        )
    admin = await asyncpg.connect(citus_kit.asyncpg_url(citus_url))
    try:
        await admin.execute(
            f"ALTER DATABASE \"{cluster.url.database}\" SET citus.multi_task_query_log_level = 'error'"
        )
    finally:
        await admin.close()
    async with Database(citus_url) as db:  # new connections
        cutoff = now - timedelta(days=30)
        expected = Removed(messages=3, passages=1)
        assert await purge_older_than(db, cutoff, agent=agent.id, after_expired=now, dry_run=True) == expected
        assert await purge_older_than(db, cutoff, agent=agent.id, batch=1) == expected
    async with cluster.unit_of_work(read_only=True) as uow:  # (a new Database would look the session up)
        assert [m.content for m in await uow.messages.window(chat.id)] == ["recent q"]
        assert [p.text for p in (await uow.passages.list(agent.id)).items] == ["fact 1d"]


@pytest.mark.anyio
async def test_a_purge_of_expired_sessions_spans_both_workers_and_skips_a_session_being_written(
    cluster: Database,
) -> None:
    """Forty agents' expired sessions, purged in batches of 7; the one an append holds is left for later."""
    earlier = utcnow() - timedelta(hours=1)
    agents, expired, live = [], [], []
    async with cluster.unit_of_work() as uow:
        for n in range(40):
            agent = await uow.agents.create(f"agent-{n}")
            gone = await uow.sessions.create(agent.id, title="gone", ttl=60)
            await uow.sessions.touch(gone.id, ttl=60, now=earlier - timedelta(seconds=n))
            await uow.messages.append(
                gone.id, [{"role": "user", "content": f"bye {n}.{i}"} for i in range(3)]
            )
            kept = await uow.sessions.create(agent.id, title="kept", ttl=3600)
            await uow.messages.append(kept.id, [{"role": "user", "content": f"hi {n}.{i}"} for i in range(2)])
            agents.append(agent.id)
            expired.append(gone.id)
            live.append(kept.id)
    spread = await citus_kit.shard_ports(str(cluster.url), "sessions", agents)
    assert set(spread) == set(citus_kit.WORKERS)  # the purge must reach both workers
    busy = expired[-1]  # the first to have expired: the first candidate of the first batch
    async with cluster.unit_of_work() as writer:
        await writer.messages.append(busy, {"role": "user", "content": "still here"})  # holds its row lock
        with anyio.fail_after(30):  # SKIP LOCKED: the purge does not wait for the writer
            removed = await purge_expired(cluster, batch=1)
        assert removed == Removed(sessions=39, messages=39 * 3)
    async with cluster.unit_of_work(read_only=True) as uow:
        for chat in live:
            assert await uow.messages.count(chat) == 2
        assert [m.content for m in await uow.messages.window(busy)][-1] == "still here"
    assert await count_rows(cluster, "sessions") == 41
    assert await purge_expired(cluster) == Removed(sessions=1, messages=4)


# -- delete_tenant -----------------------------------------------------------------


def test_delete_tenant_empties_one_tenant_on_every_shard_and_leaves_the_other(
    cluster_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async def fill_and_fingerprint() -> dict[str, tuple[int, str]]:
        async with Database(cluster_url) as db:
            for tenant in ("acme", "globex"):
                await fill(db, tenant)
            return await rows_of(db, "globex")

    globex = run(fill_and_fingerprint())
    code, out, _ = memorm(capsys, "tenant", "delete", "acme", "--dry-run", "--url", cluster_url)
    counted = {**FILLED, **NO_LANGGRAPH}
    assert (code, out.splitlines()) == (0, [f"would delete {n} {table}" for table, n in counted.items()])
    code, out, err = memorm(capsys, "tenant", "delete", "acme", "--batch-size", "2", "--url", cluster_url)
    assert (code, err) == (0, "")
    assert out.splitlines() == [f"deleted {n} {table}" for table, n in counted.items()]

    async def after() -> tuple[dict[str, tuple[int, str]], dict[str, tuple[int, str]], Any]:
        async with Database(cluster_url) as db:
            async with db.unit_of_work("acme", read_only=True) as uow:
                sam = await uow.agents.get_by_name("sam")  # its name went too (the reference table)
            return await rows_of(db, "acme"), await rows_of(db, "globex"), sam

    acme, left, sam = run(after())
    assert all(count == 0 for count, _ in acme.values())
    assert sam is None
    assert left == globex
    assert _found_by_search(cluster_url, "globex", WORDS["globex"]) == [5, 2]  # sam, ada
    code, out, _ = memorm(capsys, "tenant", "list", "--json", "--url", cluster_url)
    assert json.loads(out) == {"globex": FILLED}


# -- rebalancing with memorm running -------------------------------------------------


class _Load:
    """Units of work on several agents, round after round, until told to stop.

    Each round is an append (its own unit of work), then a window and a text
    search (a read-only one).  A unit of work that fails with a memorm
    error is recorded, with how long it took to fail, and the round tried
    again, as an application would; anything else ends the test.
    """

    def __init__(self, db: Database, chats: dict[uuid.UUID, uuid.UUID]) -> None:
        self.db = db
        self.chats = chats  # agent -> its session
        self.sent: dict[uuid.UUID, list[str]] = {chat: [] for chat in chats.values()}
        self.appends: list[tuple[float, float]] = []  # (started, seconds), committed ones
        self.reads: list[tuple[float, float]] = []
        self.failures: list[tuple[float, MemormError]] = []  # (seconds to fail, error)
        self.stop = anyio.Event()

    async def run(self) -> None:
        async with anyio.create_task_group() as tasks:
            for agent, chat in self.chats.items():
                tasks.start_soon(self._one, agent, chat)

    async def _one(self, agent: uuid.UUID, chat: uuid.UUID) -> None:
        while not self.stop.is_set():
            text = f"load {len(self.sent[chat])}"
            started = time.perf_counter()
            try:
                async with self.db.unit_of_work() as uow:
                    await uow.messages.append(chat, {"role": "user", "content": text})
                self.sent[chat].append(text)
                self.appends.append((started, time.perf_counter() - started))
                started = time.perf_counter()
                async with self.db.unit_of_work(read_only=True) as uow:
                    assert [m.content for m in await uow.messages.window(chat, limit=1)] == [text]
                    assert (await uow.messages.search(agent, "cycling", limit=1)).total == 20
                self.reads.append((started, time.perf_counter() - started))
            except MemormError as error:
                self.failures.append((time.perf_counter() - started, error))

    @staticmethod
    def slowest(timings: list[tuple[float, float]], start: float, end: float) -> float:
        """The longest call that started between `start` and `end`."""
        return max((took for began, took in timings if start <= began <= end), default=0.0)


async def _placements(connection: asyncpg.Connection, table: str) -> dict[int, int]:
    """How many shards of `table` each node holds, by port."""
    found = await connection.fetch(
        "SELECT nodeport, count(*) FROM citus_shards WHERE table_name = $1::regclass GROUP BY nodeport", table
    )
    return {port: count for port, count in found}


async def _two_agents_per_shard(db: Database, admin: asyncpg.Connection) -> dict[uuid.UUID, uuid.UUID]:
    """Eight agents, two on each of the four shards, each with a session of 20 messages."""
    chats: dict[uuid.UUID, uuid.UUID] = {}
    per_shard: dict[int, int] = {}
    for n in range(200):
        async with db.unit_of_work() as uow:
            agent = await uow.agents.create(f"agent-{n}")
        shard = await admin.fetchval(
            "SELECT get_shard_id_for_distribution_column('agents', $1::uuid)", agent.id
        )
        if per_shard.get(shard, 0) == 2:
            continue  # an agent more on a full shard: it stays, silent
        per_shard[shard] = per_shard.get(shard, 0) + 1
        async with db.unit_of_work() as uow:
            chat = await uow.sessions.create(agent.id)
            history = [{"role": "user", "content": f"turn {i} about cycling"} for i in range(20)]
            await uow.messages.append(chat.id, history)
        chats[agent.id] = chat.id
        if len(chats) == 8:
            return chats
    raise AssertionError("200 agents did not fill four shards")


async def _rebalance(admin: asyncpg.Connection, mode: str) -> str:
    """Move shards onto the worker that has too few, as `citus_rebalance_start` does; returns how it went.

    The rebalancer runs its moves in background workers, of which a node has
    `max_worker_processes` for every database on it; on a cluster shared by
    many test databases there may be none free for a while.  Then, after 15
    seconds without progress, the job is cancelled and the same moves run
    in this session (`rebalance_table_shards`): under the same load, which
    is what this test is about.
    """
    job = await admin.fetchval(
        "SELECT citus_rebalance_start(shard_transfer_mode => $1::citus.shard_transfer_mode)", mode
    )
    seen: list[str] = []
    changed = time.perf_counter()
    while True:
        state = await admin.fetchval("SELECT state FROM pg_dist_background_job WHERE job_id = $1", job)
        if state == "finished":
            return "citus_rebalance_start"
        assert state in ("scheduled", "running"), state
        tasks = await admin.fetch(
            "SELECT status FROM pg_dist_background_task WHERE job_id = $1 ORDER BY task_id", job
        )
        if [task["status"] for task in tasks] != seen:
            seen, changed = [task["status"] for task in tasks], time.perf_counter()
        elif time.perf_counter() - changed > 15:
            await admin.execute("SELECT citus_job_cancel($1)", job)
            await admin.execute(
                "SELECT rebalance_table_shards(shard_transfer_mode => $1::citus.shard_transfer_mode)", mode
            )
            return "rebalance_table_shards (no background worker was free)"
        await anyio.sleep(0.2)


@pytest.mark.anyio
@pytest.mark.parametrize("lock_timeout", [None, "50ms"], ids=["writes-wait", "lock-timeout"])
async def test_memorm_keeps_working_while_the_rebalancer_moves_shards_to_a_new_worker(
    citus_url: str, lock_timeout: str | None, record_property: Any
) -> None:
    """Shards move from one worker to the other while eight agents append, read and search.

    In this database the second worker starts out holding no shards (as a
    newly added worker does): four shards per table, all on the first.  Two
    agents per shard talk while `citus_rebalance_start` moves half of the
    shards (see `_rebalance`).  Writes to a shard being moved wait for the move
    ('block_writes': this cluster has wal_level 'replica', so no logical
    replication); reads go on.  Without a lock timeout no unit of work
    fails, the writes are only slow.  With one shorter than the move, as
    docs/production.md advises for the application role, the waiting
    writes fail promptly with memorm's lock-timeout `DatabaseError`, write
    nothing, and succeed when retried.  Either way, every message
    committed is there once, numbered without a gap.
    """
    admin = await asyncpg.connect(citus_kit.asyncpg_url(citus_url))
    settings = {} if lock_timeout is None else {"lock_timeout": lock_timeout}
    db = Database(citus_url, connect_args={"server_settings": settings})
    try:
        await admin.execute(
            f'ALTER DATABASE "{db.url.database}" SET citus.shard_count = 4'
        )  # new connections
        first, second = citus_kit.WORKERS
        await admin.execute(
            f"SELECT citus_set_node_property('127.0.0.1', {second}, 'shouldhaveshards', false)"
        )
        await db.upgrade()
        await db.distribute()
        assert await _placements(admin, "messages") == {first: 4}
        chats = await _two_agents_per_shard(db, admin)

        # A worker joins (here: the second one may now hold shards), and the rebalancer runs.
        await admin.execute(
            f"SELECT citus_set_node_property('127.0.0.1', {second}, 'shouldhaveshards', true)"
        )
        logical = await admin.fetchval("SHOW wal_level") == "logical"
        load = _Load(db, chats)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(load.run)
            await anyio.sleep(0.5)  # the load, before the move
            began = time.perf_counter()
            with anyio.fail_after(90):
                how = await _rebalance(admin, "auto" if logical else "block_writes")
            ended = time.perf_counter()
            await anyio.sleep(0.5)  # and after it
            load.stop.set()

        record_property("rebalanced_by", how)
        assert await _placements(admin, "messages") == {first: 2, second: 2}
        assert await citus_kit.shard_ports(citus_url, "messages", list(chats)) == {first: 4, second: 4}
        before = sorted(took for started, took in load.appends if started < began)
        record_property("median_append_before_seconds", round(before[len(before) // 2], 3))
        record_property("rebalance_seconds", round(ended - began, 2))
        record_property("longest_append_during_seconds", round(load.slowest(load.appends, began, ended), 2))
        record_property("longest_read_during_seconds", round(load.slowest(load.reads, began, ended), 2))
        record_property("appends_during", sum(began <= started <= ended for started, _ in load.appends))
        record_property("failed_units_of_work", len(load.failures))
        assert any(began <= started <= ended for started, _ in load.appends)  # writes during the move
        assert any(started > ended for started, _ in load.appends)  # and after it, on the moved shards
        if lock_timeout is None:
            assert load.failures == []  # writes to a moving shard wait, and then go on
        else:
            assert load.failures, "a write waited for a move longer than the lock timeout"
            for took, error in load.failures:
                assert isinstance(error, DatabaseError)
                assert "lock timeout" in str(error)
                assert took < 2  # promptly: the timeout, not the move

        async with db.unit_of_work(read_only=True) as uow:  # every message there once, seq 1..n, in order
            for chat in chats.values():
                sent = load.sent[chat]
                assert sent, "every agent appended"
                found = await uow.messages.window(chat, limit=1000)
                assert [m.seq for m in found] == list(range(1, 21 + len(sent)))
                assert [m.content for m in found[20:]] == sent
    finally:
        await db.dispose()
        await admin.close()
