"""The adapters under hostile input: MemGPT, LangChain history and vector store, OpenAI Agents session.

Each call gets a wrong type, a value past a limit, or an embedder that
answers with the wrong number of vectors.  It must raise a ``MemormError``
(never ``TypeError``, ``AttributeError`` or ``ValueError`` from inside
memorm) and leave every row as it was.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import date
from typing import Any

import pytest
from langchain_core.embeddings import Embeddings
from langchain_core.messages import AIMessage, HumanMessage

from memorm import Database, HashingEmbedder
from memorm.compat.langchain import MemormChatMessageHistory, MemormVectorStore, adispose_sync
from memorm.compat.memgpt import ArchivalMemory, PersistenceManager, RecallMemory
from memorm.compat.openai_agents import MemormSession
from memorm.errors import MemormError
from reliability.hostile_kit import base_rows, record, report_counts, snapshot

pytestmark = [pytest.mark.anyio, pytest.mark.reliability, pytest.mark.long]
_ = report_counts  # an autouse fixture: imported so pytest finds it here

Hostile = Callable[[Database, dict[str, Any]], Awaitable[Any]]


class _Short(HashingEmbedder):
    """An embedder that loses a vector: one fewer than the texts it was given."""

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return (await super().embed(texts))[1:]


class _LangChainHashing(Embeddings):
    def __init__(self, *, short: bool = False) -> None:
        self.inner = HashingEmbedder(dim=8, model="hash8")
        self.short = short

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        vectors = [self.inner.embed_one(text) for text in texts]
        return vectors[1:] if self.short else vectors

    def embed_query(self, text: str) -> list[float]:
        return self.inner.embed_one(text)


def _archive(db: Database, b: dict[str, Any], embedder: Any = None) -> ArchivalMemory:
    return ArchivalMemory(db, b["agent"], embedder or HashingEmbedder(dim=8, model="hash8"))


def _manager(db: Database, b: dict[str, Any]) -> PersistenceManager:
    return PersistenceManager(db, b["agent"], b["session"])


def _store(db: Database, b: dict[str, Any], *, short: bool = False) -> MemormVectorStore:
    return MemormVectorStore(db, b["agent"], _LangChainHashing(short=short))


def _history(
    db: Database, b: dict[str, Any], session_key: str = "base", **options: Any
) -> MemormChatMessageHistory:
    return MemormChatMessageHistory(db, session_key, agent=b["agent"], **options)


def _session(db: Database, b: dict[str, Any], **options: Any) -> MemormSession:
    return MemormSession("base", db, agent=b["agent"], **options)


async def _make(build: Callable[[], Any]) -> Any:
    return build()


HOSTILE: dict[str, Hostile] = {
    # MemGPT
    "memgpt.insert None": lambda db, b: _archive(db, b).insert(None),
    "memgpt.insert meta": lambda db, b: _archive(db, b).insert("x", meta=5),
    "memgpt.insert NUL": lambda db, b: _archive(db, b).insert("a\x00b"),
    "memgpt.insert short embedder": lambda db, b: _archive(db, b, _Short(dim=8, model="hash8")).insert("x"),
    "memgpt.search None": lambda db, b: _archive(db, b).search(None),
    "memgpt.search count": lambda db, b: _archive(db, b).search("x", count="5"),
    "memgpt.search start": lambda db, b: _archive(db, b).search("x", start=2**63),
    "memgpt.search short embedder": lambda db, b: _archive(db, b, _Short(dim=8, model="hash8")).search("x"),
    "memgpt.text_search None": lambda db, b: RecallMemory(db, b["agent"]).text_search(None),
    "memgpt.text_search count": lambda db, b: RecallMemory(db, b["agent"]).text_search("x", count=0),
    "memgpt.date_search garbage": lambda db, b: RecallMemory(db, b["agent"]).date_search("soon", "later"),
    "memgpt.date_search min/max": lambda db, b: RecallMemory(db, b["agent"]).date_search(date.min, date.max),
    "memgpt.date_search strings": lambda db, b: RecallMemory(db, b["agent"]).date_search(
        "0001-01-01", "9999-12-31"
    ),
    "memgpt.init None": lambda db, b: _manager(db, b).init(None),
    "memgpt.init messages int": lambda db, b: _manager(db, b).init({"messages": 5}),
    "memgpt.init messages None item": lambda db, b: _manager(db, b).init({"messages": [None]}),
    "memgpt.init bad system": lambda db, b: _manager(db, b).init({"core_memory": {"a": "b"}, "system": 5}),
    "memgpt.trim negative": lambda db, b: _manager(db, b).trim_messages(-1),
    "memgpt.trim past 2**62": lambda db, b: _manager(db, b).trim_messages(2**70),
    "memgpt.prepend None": lambda db, b: _manager(db, b).prepend_to_messages(None),
    "memgpt.append None": lambda db, b: _manager(db, b).append_to_messages(None),
    "memgpt.append meta": lambda db, b: _manager(db, b).append_to_messages(
        [{"role": "user", "content": "x", "meta": 5}]
    ),
    "memgpt.append role": lambda db, b: _manager(db, b).append_to_messages([{"role": "bot", "content": "x"}]),
    "memgpt.swap int": lambda db, b: _manager(db, b).swap_system_message(5),
    "memgpt.swap NUL": lambda db, b: _manager(db, b).swap_system_message({"content": "\x00"}),
    "memgpt.update_memory list": lambda db, b: _manager(db, b).update_memory([1]),
    # LangChain chat history
    "history window": lambda db, b: _make(lambda: _history(db, b, window=0)),
    "history window past 2**62": lambda db, b: _make(lambda: _history(db, b, window=2**70)),
    "history ttl": lambda db, b: _make(lambda: _history(db, b, ttl=float("nan"))),
    "history key": lambda db, b: _make(lambda: MemormChatMessageHistory(db, "", agent=b["agent"])),
    "history key long": lambda db, b: _make(
        lambda: MemormChatMessageHistory(db, "k" * 600, agent=b["agent"])
    ),
    "history agent": lambda db, b: _make(lambda: MemormChatMessageHistory(db, "k", agent=5)),
    "history add None": lambda db, b: _history(db, b).aadd_messages(None),
    "history add str": lambda db, b: _history(db, b).aadd_messages(["hi"]),
    "history add dict": lambda db, b: _history(db, b).aadd_messages([{"role": "user"}]),
    "history add non-JSON": lambda db, b: _history(db, b).aadd_messages(
        [HumanMessage("x", additional_kwargs={"when": date(2000, 1, 1)})]
    ),
    "history add NUL": lambda db, b: _history(db, b).aadd_messages([AIMessage("a\x00")]),
    # LangChain vector store
    "store texts None": lambda db, b: _store(db, b).aadd_texts(None),
    "store texts int": lambda db, b: _store(db, b).aadd_texts([5]),
    "store metadatas int": lambda db, b: _store(db, b).aadd_texts(["a"], metadatas=5),
    "store metadata int": lambda db, b: _store(db, b).aadd_texts(["a"], metadatas=[5]),
    "store metadata NaN": lambda db, b: _store(db, b).aadd_texts(["a"], metadatas=[{"x": float("nan")}]),
    "store ids int": lambda db, b: _store(db, b).aadd_texts(["a"], ids=5),
    "store ids item": lambda db, b: _store(db, b).aadd_texts(["a"], ids=[5]),
    "store short embeddings": lambda db, b: _store(db, b, short=True).aadd_texts(["a", "b"]),
    "store delete str": lambda db, b: _store(db, b).adelete(ids="abc"),
    "store get None": lambda db, b: _store(db, b).aget_by_ids(None),
    "store search None": lambda db, b: _store(db, b).asimilarity_search(None),
    "store search k": lambda db, b: _store(db, b).asimilarity_search("q", k=0),
    "store search k huge": lambda db, b: _store(db, b).asimilarity_search("q", k=2**70),
    "store search filter": lambda db, b: _store(db, b).asimilarity_search("q", filter=[1]),
    "store vector inf": lambda db, b: _store(db, b).asimilarity_search_by_vector(
        [float("inf"), float("-inf"), 1.0]
    ),
    "store mmr lambda": lambda db, b: _store(db, b).amax_marginal_relevance_search("q", lambda_mult=2),
    "store mmr lambda NaN": lambda db, b: _store(db, b).amax_marginal_relevance_search(
        "q", lambda_mult=float("nan")
    ),
    "store mmr k": lambda db, b: _store(db, b).amax_marginal_relevance_search("q", k="2"),
    "store mmr fetch_k": lambda db, b: _store(db, b).amax_marginal_relevance_search("q", fetch_k=2**40),
    "store model long": lambda db, b: _make(
        lambda: MemormVectorStore(db, b["agent"], _LangChainHashing(), embedding_model="m" * 600)
    ),
    # OpenAI Agents SDK session
    "session agent": lambda db, b: _make(lambda: MemormSession("s", db, agent=5)),
    "session ttl": lambda db, b: _make(lambda: _session(db, b, ttl=-1)),
    "session get limit": lambda db, b: _session(db, b).get_items(limit="5"),
    "session get limit huge": lambda db, b: _session(db, b).get_items(limit=2**70),
    "session add None": lambda db, b: _session(db, b).add_items(None),
    "session add int": lambda db, b: _session(db, b).add_items([5]),
    "session add non-JSON": lambda db, b: _session(db, b).add_items(
        [{"role": "user", "content": "x", "extra": {1, 2}}]
    ),
    "session add NUL": lambda db, b: _session(db, b).add_items([{"role": "user", "content": "\x00"}]),
}


async def test_adapters_map_hostile_input_to_memorm_errors_and_write_nothing(
    db: Database, engine: str
) -> None:
    base = await base_rows(db)
    before = await snapshot(db)
    escaped: dict[str, str] = {}
    try:
        for name, call in HOSTILE.items():
            try:
                await call(db, base)
            except MemormError:
                record(engine, "adapter", "rejected")
            except Exception as error:
                escaped[name] = f"{type(error).__name__}: {error}"
            else:
                escaped[name] = "accepted"
    finally:
        await adispose_sync(db)
    assert not escaped, escaped
    assert await snapshot(db) == before


async def test_an_unknown_agent_is_not_found_through_every_adapter(db: Database) -> None:
    unknown = uuid.uuid4()
    with pytest.raises(MemormError):
        await MemormSession("s", db, agent=unknown).add_items([{"role": "user", "content": "x"}])
    with pytest.raises(MemormError):
        await MemormChatMessageHistory(db, "s", agent=unknown).aadd_messages([HumanMessage("x")])
    with pytest.raises(MemormError):
        await MemormVectorStore(db, unknown, _LangChainHashing()).aadd_texts(["x"])
