"""The adapters on tenant views: `db.for_tenant("a")` and `db.for_tenant("b")` keep separate data.

Tenant B holds an agent and a session under the same ids as tenant A's (raw
inserts), so each adapter is handed the very same agent id, session id,
session key and document ids in both tenants: only the view tells them
apart.  Sync methods (memorm's sync bridge, called from a worker thread) are
checked beside the async ones.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import anyio
import pytest
import sqlalchemy as sa
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from test_compat_langchain_vectorstore import Hashing

from memorm import Database, HashingEmbedder
from memorm.compat.langchain import MemormChatMessageHistory, MemormVectorStore, adispose_sync
from memorm.compat.memgpt import ArchivalMemory, PersistenceManager, RecallMemory
from memorm.compat.openai_agents import MemormSession
from memorm.models import AGENTS, SESSIONS, fields

pytestmark = pytest.mark.anyio


@pytest.fixture
async def db(db: Database) -> AsyncIterator[Database]:
    """conftest's `db`; the sync bridge's connections to it close before it goes."""
    yield db
    await adispose_sync(db)


async def twins(db: Database) -> tuple[uuid.UUID, uuid.UUID]:
    """Agent "sam" with a session in tenant "a", and the same rows, same ids, in tenant "b"."""
    async with db.unit_of_work("a") as uow:
        agent = await uow.agents.create("sam", core_memory={"human": "nobody yet"})
        chat = await uow.sessions.create(agent.id, key="chat")
    async with db.unit_of_work("a", read_only=True) as uow:
        rows = {
            table: (await uow.session.execute(sa.select(*fields(table)))).mappings().all()
            for table in (AGENTS, SESSIONS)
        }
    async with db.unit_of_work("b") as uow:
        for table, found in rows.items():
            await uow.session.execute(sa.insert(table), [{**row, "tenant": "b"} for row in found])
    return agent.id, chat.id


async def test_memgpt_classes_keep_each_tenants_memory(db: Database) -> None:
    agent, chat = await twins(db)
    views = {tenant: db.for_tenant(tenant) for tenant in "ab"}
    for tenant, view in views.items():
        manager = PersistenceManager(view, agent, chat)
        await manager.init(
            {
                "system": f"system of {tenant}",
                "core_memory": {"human": f"human of {tenant}"},
                "messages": [{"role": "user", "content": f"hello from {tenant}"}],
            }
        )
        await manager.append_to_messages([{"role": "assistant", "content": f"answer to {tenant}"}])
        await manager.prepend_to_messages([{"role": "user", "content": f"summary of {tenant}"}])
        await ArchivalMemory(view, agent, HashingEmbedder(dim=32)).insert(f"a fact of {tenant}")
    await PersistenceManager(views["b"], agent, chat).swap_system_message("system of b, again")
    assert await PersistenceManager(views["b"], agent, chat).trim_messages(1) == 1  # B's summary
    await PersistenceManager(views["b"], agent, chat).update_memory({"human": "Bea"})

    async with db.unit_of_work("a", read_only=True) as uow:
        assert [m.content for m in await uow.messages.window(chat)] == [
            "system of a",
            "summary of a",
            "hello from a",
            "answer to a",
        ]
        assert (await uow.agents.get(agent)).core_memory == {"human": "human of a"}
    async with db.unit_of_work("b", read_only=True) as uow:
        assert [m.content for m in await uow.messages.window(chat)] == [
            "system of b, again",
            "hello from b",
            "answer to b",
        ]
        assert (await uow.agents.get(agent)).core_memory == {"human": "Bea"}
    for tenant, view in views.items():
        recall = RecallMemory(view, agent)
        found, total = await recall.text_search("hello")
        assert ([r["content"] for r in found], total) == ([f"hello from {tenant}"], 1)
        dated, total = await recall.date_search("2000-01-01", "2199-12-31")
        assert total == (3 if tenant == "a" else 2)  # user and assistant messages, not the system's
        assert all(r["content"].endswith(f" {tenant}") for r in dated)
        archive = ArchivalMemory(view, agent, HashingEmbedder(dim=32))
        hits, total = await archive.search("fact")
        assert ([r["content"] for r in hits], total) == ([f"a fact of {tenant}"], 1)
        assert await archive.count() == 1


async def test_langchain_history_keeps_each_tenants_session_under_one_key(db: Database) -> None:
    agent, _ = await twins(db)
    a = MemormChatMessageHistory(db.for_tenant("a"), "user-1", agent=agent)
    b = MemormChatMessageHistory(db.for_tenant("b"), "user-1", agent=agent)
    await a.aadd_messages([SystemMessage("sys a"), HumanMessage("hi from a")])
    await b.aadd_messages([HumanMessage("hi from b")])

    def sync_side() -> None:  # the sync bridge, from a worker thread while the loop runs
        b.add_messages([AIMessage("hello b")])
        assert b.messages == [HumanMessage("hi from b"), AIMessage("hello b")]
        assert a.messages == [SystemMessage("sys a"), HumanMessage("hi from a")]

    await anyio.to_thread.run_sync(sync_side)
    await b.aclear()
    assert await b.aget_messages() == []
    assert await a.aget_messages() == [SystemMessage("sys a"), HumanMessage("hi from a")]
    assert await MemormChatMessageHistory(db.for_tenant("c"), "user-1", agent=agent).aget_messages() == []
    async with db.unit_of_work("a", read_only=True) as uow:
        chat_a = await uow.sessions.get_by_key(agent, "user-1")
    async with db.unit_of_work("b", read_only=True) as uow:
        chat_b = await uow.sessions.get_by_key(agent, "user-1")
    assert chat_a is not None
    assert chat_b is not None
    assert (chat_a.tenant, chat_b.tenant) == ("a", "b")


async def test_langchain_vector_store_keeps_each_tenants_documents_under_one_id(db: Database) -> None:
    agent, _ = await twins(db)
    a = MemormVectorStore(db.for_tenant("a"), agent, Hashing())
    b = MemormVectorStore(db.for_tenant("b"), agent, Hashing())
    given = str(uuid.uuid4())  # a canonical UUID is the passage id itself: the same in both tenants
    ids = ["fact-1", given]
    assert a.passage_id("fact-1") == b.passage_id("fact-1")
    await a.aadd_texts(["cats purr", "a's tea is green"], [{"of": "a"}, {"of": "a"}], ids=ids)
    await b.aadd_texts(["dogs bark", "b's tea is black"], [{"of": "b"}, {"of": "b"}], ids=ids)
    await b.aadd_texts(["dogs bark loudly"], ids=["fact-1"])  # an upsert replaces B's only

    def sync_side() -> None:
        assert [d.page_content for d in a.get_by_ids(ids)] == ["cats purr", "a's tea is green"]
        found = [d.page_content for d in b.similarity_search("tea", k=5)]
        assert (found[0], sorted(found)) == ("b's tea is black", ["b's tea is black", "dogs bark loudly"])
        b.add_texts(["b's second note"], ids=["fact-2"])

    await anyio.to_thread.run_sync(sync_side)
    assert [d.page_content for d in await b.aget_by_ids([*ids, "fact-2"])] == [
        "dogs bark loudly",
        "b's tea is black",
        "b's second note",
    ]
    found = [d.page_content for d in await a.asimilarity_search("tea", k=5)]
    assert (found[0], sorted(found)) == ("a's tea is green", ["a's tea is green", "cats purr"])
    await b.adelete(ids)
    assert [d.page_content for d in await a.aget_by_ids(ids)] == ["cats purr", "a's tea is green"]
    assert [d.metadata for d in await a.aget_by_ids(ids)] == [{"of": "a"}, {"of": "a"}]
    assert [d.page_content for d in await b.aget_by_ids([*ids, "fact-2"])] == ["b's second note"]


async def test_openai_agents_session_keeps_each_tenants_items_under_one_session_id(db: Database) -> None:
    agent, _ = await twins(db)
    a = MemormSession("conv-1", db.for_tenant("a"), agent=agent)
    b = MemormSession("conv-1", db.for_tenant("b"), agent=agent)
    await a.add_items([{"role": "user", "content": "a asks"}, {"role": "assistant", "content": "a answered"}])
    await b.add_items([{"role": "user", "content": "b asks"}])
    assert [item["content"] for item in await a.get_items()] == ["a asks", "a answered"]  # type: ignore[typeddict-item]
    assert [item["content"] for item in await b.get_items()] == ["b asks"]  # type: ignore[typeddict-item]
    popped = await b.pop_item()
    assert popped is not None
    assert popped["content"] == "b asks"  # type: ignore[typeddict-item]
    assert await b.pop_item() is None
    await b.add_items([{"role": "user", "content": "b again"}])
    await b.clear_session()
    assert await b.get_items() == []
    assert [item["content"] for item in await a.get_items(limit=1)] == ["a answered"]  # type: ignore[typeddict-item]
    assert len(await a.get_items()) == 2
