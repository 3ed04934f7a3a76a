"""LangGraph's constructors on memorm: `from_conn_string`, `setup()` and a saver's default agent."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest
from probes import aiosqlite_threads
from test_compat_langgraph_graph import counter, thread

from memorm import Database, NotFoundError
from memorm.compat.langgraph import AsyncMemormStore, MemormSaver, MemormStore

pytestmark = pytest.mark.anyio


async def _agents(url: str, tenant: str | None = None) -> list[str]:
    async with Database(url) as db:
        view = db if tenant is None else db.for_tenant(tenant)
        async with view.unit_of_work(read_only=True) as uow:
            return sorted(agent.name for agent in await uow.agents.list())


async def test_a_saver_from_a_url_sets_up_the_schema_and_keeps_threads_in_a_default_agent(
    plain_url: str,
) -> None:
    async with MemormSaver.from_conn_string(plain_url) as saver:
        await saver.asetup()
        await saver.asetup()  # idempotent
        # No agent given: reads find nothing and make nothing...
        assert await saver.aget_tuple(thread("first")) is None
        assert [item async for item in saver.alist(None)] == []
        await saver.adelete_thread("first")
        await saver.acopy_thread("first", "second")
        await saver.aprune(["first"])
        with pytest.raises(NotFoundError, match="first write makes it"):
            _ = saver.agent_id
        assert await _agents(plain_url) == []
        # ...and the first write makes the agent named "langgraph".
        graph = counter().compile(checkpointer=saver)
        assert await graph.ainvoke({"steps": [], "count": 1}, thread("first")) == {
            "steps": ["count", "double"],
            "count": 4,
        }
        made = saver.agent_id
    assert await _agents(plain_url) == ["langgraph"]
    async with MemormSaver.from_conn_string(plain_url) as again:  # another process, later
        state = await counter().compile(checkpointer=again).aget_state(thread("first"))
        assert state.values == {"steps": ["count", "double"], "count": 4}
        assert again.agent_id == made


async def test_savers_making_the_default_agent_at_once_share_it(plain_url: str) -> None:
    async with Database(plain_url) as db:
        await db.upgrade()
        savers = [MemormSaver(db) for _ in range(4)]
        graphs = [counter().compile(checkpointer=saver) for saver in savers]
        await asyncio.gather(
            *(graph.ainvoke({"steps": [], "count": n}, thread(f"t{n}")) for n, graph in enumerate(graphs))
        )
        assert len({saver.agent_id for saver in savers}) == 1
        # A tenant's view has a default agent of its own.
        acme = MemormSaver(db.for_tenant("acme"))
        await counter().compile(checkpointer=acme).ainvoke({"steps": [], "count": 1}, thread("t1"))
        assert acme.agent_id != savers[0].agent_id
        assert [item async for item in acme.alist(None)] != []
    assert await _agents(plain_url) == ["langgraph"]
    assert await _agents(plain_url, "acme") == ["langgraph"]


async def test_the_sync_block_runs_a_graph_and_closes_its_connections(plain_url: str) -> None:
    def run() -> Any:
        with MemormSaver.from_conn_string(plain_url) as saver:
            saver.setup()
            graph = counter().compile(checkpointer=saver)
            graph.invoke({"steps": [], "count": 2}, thread("sync"))
            return graph.get_state(thread("sync")).values

    before = aiosqlite_threads()
    assert await anyio.to_thread.run_sync(run) == {"steps": ["count", "double"], "count": 6}
    with anyio.fail_after(10):
        while aiosqlite_threads() > before:  # noqa: ASYNC110 (a closed connection's thread ends soon after)
            await anyio.sleep(0.02)


async def test_a_store_from_a_url_is_the_store_on_a_database_of_its_own(plain_url: str) -> None:
    async with Database(plain_url) as db:
        await db.upgrade()
        async with db.unit_of_work() as uow:
            agent = (await uow.agents.create("memories")).id
    async with AsyncMemormStore.from_conn_string(plain_url, agent=agent, ttl={"default_ttl": 60}) as store:
        assert isinstance(store, AsyncMemormStore)
        await store.setup()
        await store.aput(("notes",), "n1", {"text": "hello"})
        sweeper = await store.start_ttl_sweeper()
        assert await store.stop_ttl_sweeper()
        assert sweeper.done()

    def read() -> Any:
        with MemormStore.from_conn_string(plain_url, agent=agent) as store:
            return store.get(("notes",), "n1")

    item = await anyio.to_thread.run_sync(read)
    assert item is not None
    assert item.value == {"text": "hello"}


async def test_a_store_without_an_agent_keeps_its_items_in_the_default_agent(plain_url: str) -> None:
    async with Database(plain_url) as db:
        await db.upgrade()
        store = MemormStore(db)
        # No agent yet: reads find nothing and make nothing, and a sweep has nothing to do.
        assert await store.aget(("notes",), "n1") is None
        assert await store.asearch(("notes",)) == []
        assert await store.alist_namespaces() == []
        assert await store.asweep_ttl() == 0
        with pytest.raises(NotFoundError, match="first write makes it"):
            _ = store.agent_id
        assert await _agents(plain_url) == []
        # The first write makes the agent named "langgraph", the saver's default too.
        await store.aput(("notes",), "n1", {"text": "hello"})
        saver = MemormSaver(db)
        await counter().compile(checkpointer=saver).ainvoke({"steps": [], "count": 1}, thread("t"))
        assert saver.agent_id == store.agent_id
        again = MemormStore(db)  # another process, later
        item = await again.aget(("notes",), "n1")
        assert item is not None
        assert item.value == {"text": "hello"}
        assert repr(again) == f"MemormStore(agent={store.agent_id})"
    assert await _agents(plain_url) == ["langgraph"]
