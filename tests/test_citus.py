"""memorm on a Citus cluster (distributed Postgres): a coordinator and two workers.

The cluster comes from ../shared/recipes/citus-cluster (`.ci/run` starts it);
each test gets a database of its own on every node (`citus-cluster newdb`,
the `citus_url` fixture of tests/citus_kit.py).  Without a cluster these
tests skip, and fail instead under MEMORM_REQUIRE_CITUS=1 (as in `.ci/run`).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import asyncpg
import pytest
import sqlalchemy as sa

from memorm import Database, DatabaseError, ValidationError
from memorm.distribute import DISTRIBUTION, is_distributed
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
    finally:
        await app.dispose()
        admin = await asyncpg.connect(citus_url)
        try:  # roles live in the cluster, not the database: drop this one
            await admin.execute(f'DROP OWNED BY "{role}"; DROP ROLE IF EXISTS "{role}"')
        finally:
            await admin.close()
