"""Tenants: naming one, views, the default tenant, and what an all-tenants unit of work refuses."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from memorm import Database, NotFoundError, ValidationError
from memorm.models import AGENTS

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("tenant", "said"),
    [
        ("", "must not be empty"),
        ("x" * 129, "129 characters, more than the 128"),
        ("a\x00b", "NUL"),
        ("\ud800", "lone surrogate"),
        (7, "expected a string, got int"),
        (None, "expected a string, got NoneType"),
    ],
)
async def test_a_bad_tenant_is_refused_before_any_statement(db: Database, tenant: object, said: str) -> None:
    with pytest.raises(ValidationError, match=said):
        db.for_tenant(tenant)  # type: ignore[arg-type]
    if tenant is not None:
        with pytest.raises(ValidationError, match=said):
            db.unit_of_work(tenant)  # type: ignore[arg-type]


async def test_the_longest_tenant_name_works(db: Database) -> None:
    name = "t" * 128
    async with db.for_tenant(name).unit_of_work() as uow:
        await uow.agents.create("sam")
    async with db.unit_of_work(name, read_only=True) as uow:
        assert [agent.tenant for agent in (await uow.agents.list()).items] == [name]


async def test_code_that_names_no_tenant_works_in_the_default_tenant(db: Database) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("sam")
    assert agent.tenant == "default"
    async with db.unit_of_work("default", read_only=True) as uow:
        assert (await uow.agents.get(agent.id)).name == "sam"
    async with db.for_tenant("other").unit_of_work(read_only=True) as uow:
        with pytest.raises(NotFoundError, match=f"no agent {agent.id}"):
            await uow.agents.get(agent.id)


async def test_a_view_shares_the_pool_and_names_its_tenant(db: Database) -> None:
    acme = db.for_tenant("acme")
    assert acme.tenant == "acme"
    assert db.tenant == "default"
    assert acme.engines is db.engines
    assert acme.vector_cache is db.vector_cache
    assert "tenant='acme'" in repr(acme)
    assert "tenant" not in repr(db)
    assert acme.clone().tenant == "acme"
    async with acme.unit_of_work() as uow:
        agent = await uow.agents.create("sam")
    assert agent.tenant == "acme"
    async with acme.unit_of_work("globex", read_only=True) as uow:  # an explicit tenant wins
        assert (await uow.agents.list()).total == 0


async def test_the_same_names_and_keys_live_in_two_tenants(db: Database) -> None:
    for tenant in ("a", "b"):
        async with db.unit_of_work(tenant) as uow:
            agent = await uow.agents.create("sam")
            chat = await uow.sessions.create(agent.id, key="chat")
            await uow.messages.append(chat.id, {"role": "user", "content": f"hi from {tenant}"})
    for tenant in ("a", "b"):
        async with db.unit_of_work(tenant, read_only=True) as uow:
            found = await uow.agents.get_by_name("sam")
            assert found is not None
            chat = await uow.sessions.get_by_key(found.id, "chat")
            assert chat is not None
            assert [m.content for m in await uow.messages.window(chat.id)] == [f"hi from {tenant}"]


@pytest.mark.owner  # all_tenants needs a role exempt from row-level security
async def test_all_tenants_refuses_what_needs_a_tenant_and_a_tenant_beside_it(db: Database) -> None:
    with pytest.raises(ValidationError, match="not both"):
        db.unit_of_work("a", all_tenants=True)
    with pytest.raises(ValidationError, match="all_tenants"):
        db.unit_of_work(all_tenants="yes")  # type: ignore[arg-type]
    async with db.unit_of_work("a") as uow:
        agent = await uow.agents.create("sam")
    async with db.unit_of_work(all_tenants=True) as uow:
        for call in (
            lambda: uow.agents.create("x"),
            lambda: uow.agents.get(agent.id),
            lambda: uow.agents.list(),
            lambda: uow.sessions.create(agent.id),
            lambda: uow.passages.count(agent.id),
        ):
            with pytest.raises(ValidationError, match="only runs maintenance"):
                await call()
        assert (await uow.sessions.purge_expired(dry_run=True)).sessions == 0
        assert (await uow.agents.forget({"user": "nobody"}, dry_run=True)).total == 0
        seen = set((await uow.session.execute(sa.select(AGENTS.c.tenant))).scalars())
    assert seen == {"a"}


@pytest.mark.owner  # all_tenants needs a role exempt from row-level security
async def test_forget_and_purge_across_tenants_reach_every_tenant(db: Database) -> None:
    for tenant in ("a", "b"):
        async with db.unit_of_work(tenant) as uow:
            agent = await uow.agents.create("sam", meta={"user": "u1"})
            chat = await uow.sessions.create(agent.id, ttl=1)
            await uow.messages.append(chat.id, {"role": "user", "content": "bye"})
    async with db.unit_of_work("a") as uow:  # one tenant's purge leaves the other's
        removed = await uow.sessions.purge_expired(now=chat.created_at.replace(year=2999))
    assert (removed.sessions, removed.messages) == (1, 1)
    async with db.unit_of_work(all_tenants=True) as uow:
        removed = await uow.sessions.purge_expired(now=chat.created_at.replace(year=2999))
        assert (removed.sessions, removed.messages) == (1, 1)
        forgotten = await uow.agents.forget({"user": "u1"})
    assert forgotten.agents == 2
    for tenant in ("a", "b"):
        async with db.unit_of_work(tenant, read_only=True) as uow:
            assert (await uow.agents.list()).total == 0


@pytest.mark.owner  # all_tenants needs a role exempt from row-level security
async def test_delete_tenant_removes_its_rows_and_no_others(db: Database) -> None:
    for tenant in ("a", "b"):
        async with db.unit_of_work(tenant) as uow:
            agent = await uow.agents.create("sam")
            chat = await uow.sessions.create(agent.id)
            await uow.messages.append(chat.id, [{"role": "user", "content": f"m{i}"} for i in range(7)])
            await uow.passages.add(agent.id, "fact", [1.0, 0.0])
    expected = {"agents": 1, "embedding_models": 1, "sessions": 1, "messages": 7, "archival_passages": 1}
    graph = {  # no LangGraph state here
        "graph_checkpoints": 0,
        "graph_writes": 0,
        "graph_blobs": 0,
        "graph_store_items": 0,
        "graph_store_vectors": 0,
    }
    assert await db.delete_tenant("a", dry_run=True) == {**expected, **graph}
    assert await db.delete_tenant("a", batch=3) == {**expected, **graph}
    assert await db.delete_tenant("a") == dict.fromkeys({**expected, **graph}, 0)
    async with db.unit_of_work(all_tenants=True, read_only=True) as uow:
        for table in ("agents", "sessions", "messages", "archival_passages", "embedding_models"):
            left = (
                await uow.session.execute(sa.text(f"SELECT tenant, count(*) FROM {table} GROUP BY tenant"))
            ).all()
            assert [tuple(row) for row in left] == [("b", expected[table])]
    with pytest.raises(ValidationError):
        await db.delete_tenant("")
