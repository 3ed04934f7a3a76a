"""memorm on a Citus cluster (distributed Postgres): a coordinator and two workers.

The cluster comes from ../shared/recipes/citus-cluster (`.ci/run` starts it);
each test gets a database of its own on every node (`citus-cluster newdb`,
the `citus_url` fixture of tests/citus_kit.py).  Without a cluster these
tests skip, and fail instead under MEMORM_REQUIRE_CITUS=1 (as in `.ci/run`).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np
import pytest
import sqlalchemy as sa

from memorm import ConflictError, Database, DatabaseError, Message, ValidationError
from memorm.compat.langgraph import MemormStore
from memorm.schema_state import DISTRIBUTION, is_distributed
from memorm.testing import capture_statements
from tests import citus_kit
from tests.conftest import throwaway_postgres

pytestmark = [pytest.mark.anyio, pytest.mark.citus]

citus_url = citus_kit.citus_url  # a fresh database on the cluster
cluster = citus_kit.cluster  # a Database on it, upgraded and distributed


async def test_distribute_is_idempotent_and_puts_every_table_in_place(citus_url: str) -> None:
    async with Database(citus_url) as db:
        await db.upgrade()
        assert not await is_distributed(db)
        done = await db.distribute()
        assert done == [
            f"{table.name}: reference table" if column is None else f"{table.name}: distributed by {column}"
            for table, column in DISTRIBUTION
        ]
        assert await db.distribute() == []
        assert await is_distributed(db)
        async with db.engine.connect() as connection:
            rows = await connection.execute(
                sa.text(
                    "SELECT logicalrelid::regclass::text, partmethod, "
                    "column_to_column_name(logicalrelid, partkey), colocationid FROM pg_dist_partition"
                )
            )
            found = {name: (method, column, group) for name, method, column, group in rows}
    groups = {found[table.name][2] for table, column in DISTRIBUTION if column is not None}
    assert len(groups) == 1  # colocated: an agent's rows of every table on one shard
    assert found["agent_names"][0] in ("n", b"n")  # a reference table ("char" comes back as bytes)
    assert {name: column for name, (_, column, _) in found.items() if name != "agent_names"} == {
        "agents": "id",
        "embedding_models": "agent_id",
        "sessions": "agent_id",
        "messages": "agent_id",
        "archival_passages": "agent_id",
        "graph_checkpoints": "agent_id",
        "graph_writes": "agent_id",
        "graph_blobs": "agent_id",
        "graph_store_items": "agent_id",
        "graph_store_vectors": "agent_id",
    }


@pytest.mark.postgres
def test_distribute_refuses_a_database_without_citus() -> None:
    async def refused(url: str) -> None:
        async with Database(url) as db:
            await db.upgrade()
            with pytest.raises(ValidationError, match="no Citus"):
                await db.distribute()

    with throwaway_postgres("memorm_nocitus") as url:  # plain Postgres, upgraded
        asyncio.run(refused(url))


async def test_the_chat_path_and_archival_memory_work_on_the_cluster(cluster: Database) -> None:
    async with cluster.unit_of_work() as uow:
        agent = await uow.agents.create("sam", core_memory={"persona": "terse"})
        chat = await uow.sessions.create(agent.id, key="chat")
        await uow.messages.append(chat.id, {"role": "system", "content": "You are Sam."})
        await uow.messages.append(
            chat.id, [{"role": "user", "content": f"note {i} about cycling"} for i in range(100)]
        )
        await uow.passages.add_many(
            agent.id, [{"text": f"fact {i} about tea", "embedding": [1.0, float(i), 0.5]} for i in range(70)]
        )
    async with cluster.unit_of_work() as uow:
        await uow.agents.update_core_memory(agent.id, "human", "Ada")
        assert await uow.messages.trim(chat.id, keep_last=50) == 50
        popped = await uow.messages.pop(chat.id)
        assert popped is not None
        assert popped.content == "note 99 about cycling"
    async with cluster.unit_of_work(read_only=True) as uow:
        window = await uow.messages.window(chat.id, limit=3)
        assert [m.content for m in window] == [f"note {i} about cycling" for i in (96, 97, 98)]
        context = await uow.messages.context(chat.id, max_tokens=60)
        assert context[0].role == "system"
        assert (await uow.messages.search(agent.id, "cycling")).total == 49
        assert (await uow.passages.search_text(agent.id, "tea")).total == 70
        [best] = await uow.passages.search(agent.id, [1.0, 3.0, 0.5], k=1, metric="l2")
        assert best.passage.text == "fact 3 about tea"
        hybrid = await uow.passages.hybrid_search(agent.id, "fact 5", [1.0, 5.0, 0.5], k=1)
        assert hybrid[0].passage.text == "fact 5 about tea"
        assert (await uow.agents.get_by_name("sam")) is not None
        assert (await uow.agents.get(agent.id)).core_memory == {"persona": "terse", "human": "Ada"}
    assert (await cluster.delete_tenant("default"))["messages"] == 50


async def test_sixty_agents_spread_over_both_workers(cluster: Database) -> None:
    agents = []
    for n in range(60):
        async with cluster.unit_of_work() as uow:
            agent = await uow.agents.create(f"agent-{n}")
            chat = await uow.sessions.create(agent.id)
            await uow.messages.append(chat.id, [{"role": "user", "content": f"hello {n}"}])
            agents.append(agent.id)
    connection = await asyncpg.connect(
        cluster.url.set(drivername="postgresql").render_as_string(hide_password=False)
    )
    try:
        ports = await connection.fetch(
            """
            SELECT n.nodeport, count(*) FROM unnest($1::uuid[]) AS a(id)
            JOIN pg_dist_placement p ON p.shardid = get_shard_id_for_distribution_column('messages', a.id)
            JOIN pg_dist_node n ON n.groupid = p.groupid
            GROUP BY n.nodeport
            """,
            agents,
        )
    finally:
        await connection.close()
    spread = {port: count for port, count in ports}
    assert set(spread) == {5434, 5435}  # both workers hold agents' rows
    assert sum(spread.values()) == 60
    assert min(spread.values()) >= 10


def test_the_distribute_command_prints_what_it_did_and_is_safe_to_rerun(
    citus_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from memorm.cli import main

    assert main(["db", "upgrade", "--url", citus_url]) == 0
    capsys.readouterr()
    assert main(["db", "distribute", "--url", citus_url]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "agent_names: reference table",
        "agents: distributed by id",
        "embedding_models: distributed by agent_id",
        "sessions: distributed by agent_id",
        "messages: distributed by agent_id",
        "archival_passages: distributed by agent_id",
        "graph_checkpoints: distributed by agent_id",
        "graph_writes: distributed by agent_id",
        "graph_blobs: distributed by agent_id",
        "graph_store_items: distributed by agent_id",
        "graph_store_vectors: distributed by agent_id",
    ]
    assert main(["db", "distribute", "--url", citus_url]) == 0
    assert capsys.readouterr().out == "already distributed: nothing to do\n"
    sqlite = f"sqlite:///{tmp_path / 'x.db'}"
    assert main(["db", "upgrade", "--url", sqlite]) == 0
    capsys.readouterr()
    assert main(["db", "distribute", "--url", sqlite]) == 1
    assert (
        capsys.readouterr().err
        == "memorm: error: distribute is for Citus (distributed Postgres): this is SQLite\n"
    )


async def test_every_per_agent_call_runs_on_one_shard(cluster: Database, citus_url: str) -> None:
    """With citus.multi_task_query_log_level = 'error', any statement that asks several shards fails."""
    async with cluster.unit_of_work() as uow:  # agent creation writes agent_names on every node
        agent = await uow.agents.create("sam", core_memory={"persona": "terse"})
    name = cluster.url.database
    admin = await asyncpg.connect(
        cluster.url.set(drivername="postgresql").render_as_string(hide_password=False)
    )
    try:
        await admin.execute(f"ALTER DATABASE \"{name}\" SET citus.multi_task_query_log_level = 'error'")
    finally:
        await admin.close()
    async with Database(citus_url) as db:  # new connections, a cold session cache
        async with db.unit_of_work() as uow:
            chat = await uow.sessions.create(agent.id, key="chat")
            await uow.messages.append(chat.id, {"role": "system", "content": "You are Sam."})
            await uow.messages.append(
                chat.id, [{"role": "user", "content": f"turn {i} cycling"} for i in range(80)]
            )
            await uow.messages.append(chat.id, Message(role="user", content="memorm's id: no check"))
            await uow.messages.prepend(chat.id, {"role": "assistant", "content": "summary"})
            await uow.messages.replace_system(chat.id, "You are Sam, v2.")
            await uow.agents.update_core_memory(agent.id, "human", "Ada")
            await uow.passages.add_many(
                agent.id,
                [{"text": f"fact {i} about tea", "embedding": [1.0, float(i), 0.5]} for i in range(70)],
            )
        async with db.unit_of_work() as uow:
            assert await uow.messages.trim(chat.id, keep_last=60) > 0
            assert await uow.messages.delete_after(chat.id, 70) > 0
            assert await uow.messages.pop(chat.id) is not None
            await uow.sessions.touch(chat.id, ttl=3600)
        async with db.unit_of_work(read_only=True) as uow:
            assert (await uow.sessions.get(chat.id)).key == "chat"
            assert await uow.sessions.get_by_key(agent.id, "chat") is not None
            assert len(await uow.messages.window(chat.id, limit=10)) == 10
            assert (await uow.messages.context(chat.id, max_tokens=200))[0].content == "You are Sam, v2."
            assert await uow.messages.count(chat.id) > 0
            assert (await uow.messages.search(agent.id, "cycling")).total > 0
            assert (await uow.messages.search(agent.id, "cycling", session_id=chat.id)).total > 0
            assert (await uow.agents.get(agent.id)).core_memory["human"] == "Ada"
            assert (await uow.passages.search(agent.id, [1.0, 3.0, 0.5], k=3))[
                0
            ].passage.text == "fact 3 about tea"
            assert (await uow.passages.search_text(agent.id, "tea")).total == 70
            assert await uow.passages.hybrid_search(agent.id, "fact 5", [1.0, 5.0, 0.5], k=2)
        # LangGraph's long-term store: every call of an agent's store stays on its shard too.
        index = {"dims": 2, "embed": lambda texts: [[1.0, float(len(t))] for t in texts], "fields": ["text"]}
        store = MemormStore(db, agent=agent.id, index=index, ttl={"default_ttl": 60})
        await store.aput(("notes", "a"), "k1", {"text": "tea", "n": 1})
        await store.aput(("notes", "b"), "k2", {"text": "coffee", "n": 2})
        found = await store.aget(("notes", "a"), "k1")
        assert found is not None
        assert found.value == {"text": "tea", "n": 1}
        assert [i.key for i in await store.asearch(("notes",), filter={"n": {"$gt": 1}})] == ["k2"]
        assert [i.key for i in await store.asearch(("notes",), query="tea")] == ["k1", "k2"]
        async with Database(citus_url) as owner:  # its HNSW index: DDL on every shard
            await MemormStore(owner, agent=agent.id, index=index).asetup()
        indexed = MemormStore(db, agent=agent.id, index=index)  # a search through the index
        assert [i.key for i in await indexed.asearch(("notes",), query="tea")] == ["k1", "k2"]
        assert await store.alist_namespaces(prefix=("notes",)) == [("notes", "a"), ("notes", "b")]
        assert await store.alist_namespaces(max_depth=1) == [("notes",)]
        await store.adelete(("notes", "a"), "k1")
        assert await store.asweep_ttl() == 0
    async with Database(citus_url) as cold, cold.unit_of_work(read_only=True) as uow:
        with pytest.raises(DatabaseError, match="multi-task query"):
            await uow.messages.window(chat.id)  # unknown session: its lookup asks every shard


async def test_row_level_security_holds_on_the_shards(cluster: Database, citus_url: str) -> None:
    """The application role on the cluster: each tenant's setting reaches the workers (SET LOCAL)."""
    from memorm.tenants import create_role

    role = f"memorm_app_{uuid.uuid4().hex[:8]}"
    await create_role(cluster, role)
    tenants = ("acme", "o'brien \\\\ co")  # a quote and backslashes: the name is a literal in SET LOCAL
    app = Database(cluster.url.set(username=role))
    warnings: list[object] = []  # notices and warnings, the workers' relayed too

    def listen(dbapi_connection: Any, _record: object) -> None:
        dbapi_connection.driver_connection.add_log_listener(lambda _c, message: warnings.append(message))

    sa.event.listen(app.engine.sync_engine, "connect", listen)
    try:
        chats = {}
        for tenant in tenants:
            async with app.unit_of_work(tenant) as uow:
                agent = await uow.agents.create("sam")
                chat = await uow.sessions.create(agent.id, key="chat")
                await uow.messages.append(chat.id, [{"role": "user", "content": f"hi from {tenant}"}] * 70)
                chats[tenant] = chat.id
        assert not app.bypasses_rls
        assert app.distributed
        for tenant in tenants:
            async with app.unit_of_work(tenant, read_only=True) as uow:
                window = await uow.messages.window(chats[tenant], limit=100)
                assert {m.content for m in window} == {f"hi from {tenant}"}
                seen = set((await uow.session.execute(sa.text("SELECT tenant FROM messages"))).scalars())
                assert seen == {tenant}  # raw SQL on the shards: this tenant's rows only
        async with app.unit_of_work("nobody", read_only=True) as uow:
            assert (await uow.session.execute(sa.text("SELECT count(*) FROM agents"))).scalar() == 0
        assert warnings == []  # e.g. a BEGIN replayed inside a worker's transaction
    finally:
        await app.dispose()
        admin = await asyncpg.connect(citus_url)
        try:  # roles live in the cluster, not the database: drop this one
            await admin.execute(f'DROP OWNED BY "{role}"; DROP ROLE IF EXISTS "{role}"')
        finally:
            await admin.close()


async def test_migrations_run_on_the_distributed_tables(cluster: Database, citus_url: str) -> None:
    """Down across 0010 and up again on a distributed database: every shard follows, no row is lost."""
    from datetime import timedelta

    from memorm.types import utcnow

    async with cluster.unit_of_work() as uow:
        chats = []
        for n in range(12):
            agent = await uow.agents.create(f"agent-{n}")
            chat = await uow.sessions.create(agent.id, ttl=3600 if n % 2 else None)
            await uow.messages.append(chat.id, [{"role": "user", "content": f"hi {n}"}] * 3)
            chats.append(chat.id)

    async def shard_indexes() -> list[str]:
        found: list[str] = []
        for port in (5434, 5435):
            url = cluster.url.set(drivername="postgresql", port=port)
            worker = await asyncpg.connect(url.render_as_string())
            try:  # a worker hides its shards from catalog queries unless told not to
                await worker.execute("SET citus.override_table_visibility = off")
                found += (
                    await worker.fetchval(
                        "SELECT array_agg(indexdef) FROM pg_indexes "
                        "WHERE indexname LIKE 'ix_sessions_expires_at_%'"
                    )
                    or []
                )
            finally:
                await worker.close()
        return found

    shards = await shard_indexes()
    assert shards
    assert all(index.endswith("WHERE (expires_at IS NOT NULL)") for index in shards)
    await cluster.downgrade("0009")
    assert await is_distributed(cluster)
    assert [index for index in await shard_indexes() if "WHERE" in index] == []
    assert len(await shard_indexes()) == len(shards)
    await cluster.upgrade()
    assert sorted(await shard_indexes()) == sorted(shards)
    assert await is_distributed(cluster)  # 0012's tables too, made distributed by the migration
    async with Database(citus_url) as db:  # a new Database checks the schema: at head
        async with db.unit_of_work(read_only=True) as uow:
            assert [await uow.messages.count(chat) for chat in chats] == [3] * 12
        async with db.unit_of_work(all_tenants=True) as uow:
            purged = await uow.sessions.purge_expired(now=utcnow() + timedelta(hours=2))
        assert (purged.sessions, purged.messages) == (6, 18)


async def test_ids_stay_unique_per_tenant_on_the_distributed_tables(cluster: Database) -> None:
    """Revision 0015 on a distributed database: no index (Citus cannot shard it), shared ids refused."""
    from memorm.migrate import check_drift

    async with cluster.unit_of_work() as uow:
        a = await uow.agents.create("a")
        b = await uow.agents.create("b")
        chat_a = await uow.sessions.create(a.id)
        chat_b = await uow.sessions.create(b.id)
        (taken,) = await uow.messages.append(chat_a.id, {"id": uuid.uuid4(), "role": "user", "content": "a"})
    async with cluster.unit_of_work() as uow:
        with pytest.raises(ConflictError, match=r"is stored in another session$"):
            await uow.messages.append(chat_b.id, {"id": taken.id, "role": "user", "content": "b"})
    indexes = (
        "SELECT count(*) FROM pg_indexes "
        "WHERE indexname IN ('ix_messages_tenant_id', 'ix_archival_passages_tenant_id')"
    )
    async with cluster.engine.connect() as connection:
        assert (await connection.execute(sa.text(indexes))).scalar() == 0
    assert await check_drift(cluster) == []  # the dropped indexes are no drift there
    await cluster.downgrade("0014")
    async with cluster.engine.begin() as connection:  # what a database could hold before 0015
        await connection.execute(
            sa.text(
                "INSERT INTO messages (tenant, id, session_id, agent_id, seq, role, content, search_words, "
                "created_at, updated_at, meta) SELECT tenant, id, :chat, :agent, 1, role, content, "
                "search_words, created_at, updated_at, meta FROM messages WHERE id = :id"
            ),
            {"chat": chat_b.id, "agent": b.id, "id": taken.id},
        )
    with pytest.raises(ConflictError, match=f"messages id {taken.id} .tenant 'default', agents "):
        await cluster.upgrade()
    assert await cluster.current_revision() == "0014"
    async with cluster.engine.begin() as connection:
        await connection.execute(
            sa.text("DELETE FROM messages WHERE id = :id AND agent_id = :agent"),
            {"id": taken.id, "agent": b.id},
        )
    await cluster.upgrade()
    assert await is_distributed(cluster)
    async with cluster.engine.connect() as connection:
        assert (await connection.execute(sa.text(indexes))).scalar() == 0
    assert await check_drift(cluster) == []


def _worker(port: int, action: str) -> None:
    """Stop or start one worker of the local cluster (its PostgreSQL cluster `citus<port>`)."""
    major = sorted(os.listdir("/usr/lib/postgresql"), key=int)[-1]
    command = ["pg_ctlcluster", "--skip-systemctl-redirect", major, f"citus{port}", action]
    subprocess.run(command + (["-m", "fast"] if action == "stop" else []), check=True, capture_output=True)


async def _workers_of(db: Database, agents: list[uuid.UUID]) -> dict[uuid.UUID, int]:
    """The port of the worker holding each agent's shard."""
    connection = await asyncpg.connect(db.url.set(drivername="postgresql").render_as_string())
    try:
        rows = await connection.fetch(
            """
            SELECT a.id, n.nodeport FROM unnest($1::uuid[]) AS a(id)
            JOIN pg_dist_placement p ON p.shardid = get_shard_id_for_distribution_column('messages', a.id)
            JOIN pg_dist_node n ON n.groupid = p.groupid
            """,
            agents,
        )
    finally:
        await connection.close()
    return {agent: port for agent, port in rows}


@pytest.mark.long
async def test_a_stopped_worker_fails_its_agents_promptly_and_spares_the_others(cluster: Database) -> None:
    """A worker stopped under load: its agents' units of work fail fast with a MemormError and
    commit nothing partial, the other worker's agents go on, and all works once it is back."""
    import anyio

    from memorm import MemormError

    chats: dict[uuid.UUID, uuid.UUID] = {}
    async with cluster.unit_of_work() as uow:
        for n in range(16):
            agent = await uow.agents.create(f"agent-{n}")
            chats[agent.id] = (await uow.sessions.create(agent.id)).id
    where = await _workers_of(cluster, list(chats))
    down, up = 5435, 5434
    assert {port for port in where.values()} == {down, up}
    acknowledged: dict[uuid.UUID, list[str]] = {chat: [] for chat in chats.values()}
    failures: list[tuple[int, float, BaseException]] = []
    outage = {"on": False, "up_acks": 0}
    stop = anyio.Event()

    async def load(agent: uuid.UUID, chat: uuid.UUID) -> None:
        turn = 0
        while not stop.is_set():
            pair = [f"{turn} question", f"{turn} answer"]  # one unit of work: both or neither
            started = time.monotonic()
            try:
                with anyio.fail_after(15):  # a hang fails the test
                    async with cluster.unit_of_work() as uow:
                        await uow.messages.append(chat, [{"role": "user", "content": text} for text in pair])
                acknowledged[chat] += pair
                if outage["on"] and where[agent] == up:
                    outage["up_acks"] += 1
            except MemormError as error:
                failures.append((where[agent], time.monotonic() - started, error))
                await anyio.sleep(0.05)
            turn += 1

    async with anyio.create_task_group() as tasks:
        for agent, chat in chats.items():
            tasks.start_soon(load, agent, chat)
        await anyio.sleep(1)
        assert failures == []
        await anyio.to_thread.run_sync(_worker, down, "stop")
        outage["on"] = True
        try:
            await anyio.sleep(3)
        finally:
            outage["on"] = False
            await anyio.to_thread.run_sync(_worker, down, "start")
        during = list(failures)
        with anyio.fail_after(60):  # the stopped worker's agents write again
            while True:
                before = len(failures)
                await anyio.sleep(1)
                if len(failures) == before:
                    break
        await anyio.sleep(1)
        stop.set()

    print(  # for docs/scaling.md
        f"failed during the outage: {len(during)}, slowest failure {max(e for _, e, _ in failures):.3f} s, "
        f"other worker's commits meanwhile {outage['up_acks']}, failures in all {len(failures)}; "
        f"first: {type(failures[0][2]).__name__}: {failures[0][2]}"
    )
    assert during, "no unit of work touched the stopped worker"
    assert {port for port, _, _ in during} == {down}  # the other worker's agents never failed
    assert outage["up_acks"] > 0  # ...and went on writing while it was down
    assert max(elapsed for _, elapsed, _ in failures) < 10  # promptly: no hang until a timeout
    history = sa.text(
        "SELECT seq, content FROM messages WHERE agent_id = :agent AND session_id = :chat ORDER BY seq"
    )
    async with cluster.unit_of_work(read_only=True) as uow:
        for agent, chat in chats.items():
            rows = (await uow.session.execute(history, {"agent": agent, "chat": chat})).all()
            stored = [content for _, content in rows]
            assert [seq for seq, _ in rows] == list(range(1, len(stored) + 1))
            # Every acknowledged pair is there; a failed one is there whole or not at all
            # (a commit cut off by the stop may have landed).
            assert set(acknowledged[chat]) <= set(stored)
            turns = [text.split()[0] for text in stored]
            assert all(turns.count(turn) == 2 for turn in turns), (agent, stored)
            assert len(stored) > 0


async def _agents_on_one_shard(db: Database, count: int) -> tuple[uuid.UUID, ...]:
    """Two agents whose rows share a shard (more agents than shards: two must)."""
    async with db.unit_of_work() as uow:
        agents = [(await uow.agents.create(f"agent-{n}")).id for n in range(count)]
        rows = await uow.session.execute(
            sa.text(
                "SELECT id, get_shard_id_for_distribution_column('archival_passages', id) "
                "FROM unnest(CAST(:ids AS uuid[])) AS a(id)"
            ),
            {"ids": agents},
        )
        shards: dict[int, list[uuid.UUID]] = {}
        for agent, shard in rows:
            shards.setdefault(shard, []).append(agent)
    return next(tuple(together[:2]) for together in shards.values() if len(together) > 1)


_WORKER_SETTING = sa.text(
    # A query routed to the agent's shard runs whole on the worker: current_setting is the worker's.
    "SELECT current_setting(:name) FROM archival_passages WHERE agent_id = :agent LIMIT 1"
)


async def test_hnsw_on_the_shards_takes_the_search_settings_and_finds_k_for_a_small_agent(
    cluster: Database,
) -> None:
    """The HNSW settings reach the worker running the shard query (SET LOCAL, passed on by Citus).

    A small agent's passages lie far from the query, among a crowd of another
    agent's on the same shard, close to it: the shard's index yields the
    crowd first, and only pgvector's iterative scan, on the worker, goes on
    until the small agent's k are found.
    """
    dim, shards = 8, 32  # citus.shard_count's default: 33 agents put two on one shard
    crowd, small = await _agents_on_one_shard(cluster, shards + 1)
    noise = np.random.default_rng(15).normal(0.0, 0.1, (3_005, dim - 1))
    async with cluster.unit_of_work() as uow:
        await uow.passages.add_many(
            crowd, [{"text": f"crowd {i}", "embedding": [1.0, *noise[i]]} for i in range(3_000)]
        )
        await uow.passages.add_many(
            small, [{"text": f"mine {i}", "embedding": [-1.0, *noise[3_000 + i]]} for i in range(5)]
        )
        name = await uow.passages.ensure_index("default", dim, "cosine")
        # The build ran on the workers with the raised maintenance_work_mem.
        built = await uow.session.scalar(_WORKER_SETTING, {"name": "maintenance_work_mem", "agent": small})
        assert built == "512MB"
    query = [1.0] + [0.0] * (dim - 1)
    with capture_statements(cluster, "ORDER BY distance") as sent:
        for read_only, after_commit in ((True, False), (False, False), (False, True)):
            async with cluster.unit_of_work(read_only=read_only) as uow:
                driver = (await (await uow.session.connection()).get_raw_connection()).driver_connection
                if after_commit:  # the search's settings then begin the transaction
                    await uow.passages.search(small, query, k=1)
                    await uow.commit()
                warnings: list[object] = []  # the workers' are relayed too

                def listen(_connection: object, message: object, warnings: list[object] = warnings) -> None:
                    warnings.append(message)

                driver.add_log_listener(listen)
                try:
                    hits = await uow.passages.search(small, query, k=5, ef_search=17)
                finally:
                    driver.remove_log_listener(listen)
                assert not warnings  # e.g. a BEGIN replayed inside a worker's transaction
                assert sorted(hit.passage.text for hit in hits) == [f"mine {i}" for i in range(5)]
                for setting, value in (("hnsw.ef_search", "17"), ("hnsw.iterative_scan", "strict_order")):
                    found = await uow.session.scalar(_WORKER_SETTING, {"name": setting, "agent": small})
                    assert found == value
                statement, parameters = sent[-1]
                rows = await driver.fetch(
                    f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) {statement}", *parameters
                )
                plan = "\n".join(row[0] for row in rows)
                # The worker walked the shard's own copy of the index (name_<shard id>),
                # past the crowd, to the small agent's five.
                assert f"Index Scan using {name}_" in plan, plan
                assert "(actual rows=5 loops=1)" in plan.split(f"Index Scan using {name}_")[1], plan
    async with cluster.unit_of_work(read_only=True) as uow:  # every transaction above was ended
        left = await uow.session.scalar(
            sa.text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND state LIKE 'idle in transaction%'"
            )
        )
        assert left == 0
