"""`delete_tenant` keeps every agent's name with its agent, batch by batch.

Names live in `agent_names` (unique per tenant).  Each batch of agents goes
with its names in one transaction, so a deletion cut short, or an agent
created while it runs, never leaves a name without its agent (taken by no
one: `get_by_name` finds nothing, `create` conflicts) nor an agent without
its name (a second agent of the same name could then be created).  These
run as the application role too: `delete_tenant` works in the tenant's own
units of work.
"""

from __future__ import annotations

import asyncio
import threading
import uuid

import anyio
import pytest
import sqlalchemy as sa

from memorm import ConflictError, Database
from memorm.ids import uuid7
from memorm.models import AGENT_NAMES, AGENTS
from memorm.tenants import delete_tenant

pytestmark = pytest.mark.anyio


async def _agents(db: Database, tenant: str, names: list[str]) -> None:
    async with db.unit_of_work(tenant) as uow:
        for name in names:
            await uow.agents.create(name)


async def _names_and_agents(db: Database, tenant: str) -> tuple[dict[str, uuid.UUID], dict[str, uuid.UUID]]:
    """The tenant's name rows (name -> agent id) and its agents (name -> id), read raw."""
    async with db.unit_of_work(tenant, read_only=True) as uow:
        names = await uow.session.execute(
            sa.select(AGENT_NAMES.c.name, AGENT_NAMES.c.agent_id).where(AGENT_NAMES.c.tenant == tenant)
        )
        agents = await uow.session.execute(
            sa.select(AGENTS.c.name, AGENTS.c.id).where(AGENTS.c.tenant == tenant)
        )
        return {name: key for name, key in names}, {name: key for name, key in agents}


def _in_another_thread(db: Database, tenant: str, name: str) -> uuid.UUID:
    """Create an agent from another thread (its own event loop), while this loop waits for it."""
    made: list[uuid.UUID] = []

    async def create() -> None:
        async with db.unit_of_work(tenant) as uow:
            made.append((await uow.agents.create(name)).id)

    worker = threading.Thread(target=asyncio.run, args=(create(),))
    worker.start()
    worker.join(timeout=30)
    assert made, "the agent was not created"
    return made[0]


async def test_an_agent_created_as_delete_tenant_ends_keeps_its_name(db: Database) -> None:
    """The last batch of agents has committed; before the old code deleted the names, an agent came."""
    await _agents(db, "acme", [f"a{n}" for n in range(5)])
    late: list[uuid.UUID] = []

    class CreateAfterTheLastBatch:
        def start(self, task: str, total: int) -> None:
            pass

        def advance(self, task: str, rows: int) -> None:
            if task == "agents" and rows < 2 and not late:  # the last batch: the agents are gone
                late.append(_in_another_thread(db, "acme", "late"))

    deleted = await delete_tenant(db, "acme", batch=2, reporter=CreateAfterTheLastBatch())
    assert deleted["agents"] == 5
    assert await _names_and_agents(db, "acme") == ({"late": late[0]}, {"late": late[0]})
    async with db.unit_of_work("acme") as uow:
        found = await uow.agents.get_by_name("late")
        assert found is not None
        assert found.id == late[0]
        with pytest.raises(ConflictError):
            await uow.agents.create("late")  # one agent per name, still


async def test_an_agent_created_between_batches_goes_with_its_name(db: Database) -> None:
    await _agents(db, "acme", [f"a{n}" for n in range(5)])
    made: list[uuid.UUID] = []

    class CreateAfterTheFirstBatch:
        def start(self, task: str, total: int) -> None:
            pass

        def advance(self, task: str, rows: int) -> None:
            if task == "agents" and not made:
                made.append(_in_another_thread(db, "acme", "midway"))

    deleted = await delete_tenant(db, "acme", batch=2, reporter=CreateAfterTheFirstBatch())
    assert deleted["agents"] == 6  # a later batch took it
    assert await _names_and_agents(db, "acme") == ({}, {})
    async with db.unit_of_work("acme") as uow:
        assert (await uow.agents.create("midway")).name == "midway"  # the name is free


async def test_a_delete_tenant_cut_short_leaves_each_agent_its_name_and_no_name_without_one(
    db: Database,
) -> None:
    names = [f"a{n}" for n in range(5)]
    await _agents(db, "acme", names)
    with anyio.CancelScope() as scope:

        class CancelAfterTheFirstBatch:
            def start(self, task: str, total: int) -> None:
                pass

            def advance(self, task: str, rows: int) -> None:
                if task == "agents":
                    scope.cancel()  # as a deploy's SIGTERM or a timeout would, mid-way

        await delete_tenant(db, "acme", batch=2, reporter=CancelAfterTheFirstBatch())
    assert scope.cancelled_caught
    named, agents = await _names_and_agents(db, "acme")
    assert named == agents  # every name with its agent, every agent with its name
    assert len(agents) == 3  # the first batch (2 agents) went
    async with db.unit_of_work("acme") as uow:
        for name in names:
            if name in agents:
                found = await uow.agents.get_by_name(name)
                assert found is not None
                assert found.id == agents[name]
            else:
                assert await uow.agents.get_by_name(name) is None
                assert (await uow.agents.create(name)).name == name  # free again, not a ConflictError
    await delete_tenant(db, "acme")  # run again: the rest goes
    assert await _names_and_agents(db, "acme") == ({}, {})


async def test_delete_tenant_frees_the_names_an_earlier_deletion_left_without_their_agent(
    db: Database,
) -> None:
    await _agents(db, "acme", ["kept"])
    await _agents(db, "globex", ["ghost"])
    async with db.unit_of_work("acme") as uow:  # as a deletion of an older memorm, cut short, left it
        await uow.session.execute(
            sa.insert(AGENT_NAMES).values(tenant="acme", name="ghost", agent_id=uuid.uuid4())
        )
    await delete_tenant(db, "acme", batch=1)
    assert await _names_and_agents(db, "acme") == ({}, {})
    async with db.unit_of_work("acme") as uow:
        assert (await uow.agents.create("ghost")).name == "ghost"
    named, agents = await _names_and_agents(db, "globex")  # another tenant's names are untouched
    assert named == agents
    assert list(agents) == ["ghost"]


async def test_a_name_without_its_agent_minted_moments_ago_is_an_orphan_on_one_server_only(
    db: Database,
) -> None:
    # On a distributed database the name (a reference table) and its agent (a shard) commit node
    # by node: a name whose agent is younger than a minute may be one still being made.
    async with db.unit_of_work("acme") as uow:
        await uow.session.execute(
            sa.insert(AGENT_NAMES).values(tenant="acme", name="young", agent_id=uuid7())
        )
    await db.check_schema()  # learns whether the tables are distributed
    await delete_tenant(db, "acme", batch=1)
    named, _ = await _names_and_agents(db, "acme")
    assert list(named) == (["young"] if db.distributed else [])


async def test_agents_created_throughout_a_deletion_each_keep_their_name_or_go_with_it(db: Database) -> None:
    await _agents(db, "acme", [f"a{n}" for n in range(20)])
    done = anyio.Event()

    async def keep_creating() -> None:
        n = 0
        while not done.is_set():
            await _agents(db, "acme", [f"new{n}"])
            n += 1

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(keep_creating)
        await delete_tenant(db, "acme", batch=1)
        done.set()
    named, agents = await _names_and_agents(db, "acme")
    assert named == agents
    async with db.unit_of_work("acme") as uow:
        for name in agents:
            with pytest.raises(ConflictError):
                await uow.agents.create(name)
