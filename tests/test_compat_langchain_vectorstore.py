"""LangChain vector store on memorm: LangChain's standard suite (sync and async) on both engines, and ours."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import anyio
import numpy as np
import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding, Embeddings
from langchain_tests.integration_tests import VectorStoreIntegrationTests

from memorm import ConflictError, Database, HashingEmbedder, ValidationError
from memorm.compat.langchain import DOCUMENT_ID_KEY, MemormVectorStore, adispose_sync

pytestmark = pytest.mark.anyio


async def _agent(db: Database, name: str = "lc") -> uuid.UUID:
    async with db.unit_of_work() as uow:
        return (await uow.agents.create(name)).id


class TestMemormVectorStoreStandard(VectorStoreIntegrationTests):
    """LangChain's own suite, untouched: every test runs on SQLite and on Postgres."""

    @pytest.fixture
    async def vectorstore(self, db: Database, anyio_backend: str) -> AsyncIterator[MemormVectorStore]:
        # anyio_backend: the suite's sync tests need this async fixture run by anyio too.
        store = MemormVectorStore(db, await _agent(db), self.get_embeddings())
        try:
            yield store
        finally:
            await adispose_sync(db)  # the sync tests' private copy, before the store is dropped


class Hashing(Embeddings):
    """memorm's HashingEmbedder as LangChain ``Embeddings``: shared words make similar vectors."""

    def __init__(self, dim: int = 64) -> None:
        self.inner = HashingEmbedder(dim=dim)
        self.model = self.inner.model

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self.inner.embed_one(text) for text in texts]

    def embed_query(self, text: str) -> list[float]:
        return self.inner.embed_one(text)


@pytest.fixture
async def db(db: Database) -> AsyncIterator[Database]:
    """conftest's ``db``, whose private sync copy (if a test made one) closes before the store goes."""
    yield db
    await adispose_sync(db)


async def test_upsert_by_string_id_replaces_text_metadata_and_embedding(db: Database) -> None:
    agent_id = await _agent(db)
    store = MemormVectorStore(db, agent_id, Hashing())
    assert await store.aadd_texts(["cats purr loudly"], [{"v": 1}], ids=["doc-a"]) == ["doc-a"]
    await store.aadd_texts(["dogs bark at night"], [{"v": 2, "extra": [1, {"x": None}]}], ids=["doc-a"])

    async with db.unit_of_work(read_only=True) as uow:
        assert await uow.passages.count(agent_id) == 1
        passage = await uow.passages.get(store.passage_id("doc-a"))
    assert passage.text == "dogs bark at night"
    assert passage.meta == {"v": 2, "extra": [1, {"x": None}], DOCUMENT_ID_KEY: "doc-a"}
    assert passage.vector == pytest.approx(Hashing().embed_query("dogs bark at night"))
    # The old embedding is gone too: the new text is the nearest to its own words.
    [(doc, score)] = await store.asimilarity_search_with_score("dogs bark", k=1)
    assert doc == Document(
        id="doc-a", page_content="dogs bark at night", metadata={"v": 2, "extra": [1, {"x": None}]}
    )
    assert score > 0.5


async def test_document_ids_round_trip_exactly(db: Database) -> None:
    store = MemormVectorStore(db, await _agent(db), Hashing())
    canonical = str(uuid.uuid4())
    odd = [canonical, canonical.upper(), "{" + str(uuid.uuid4()) + "}", "1", "naïve id/with spaces"]
    ids = await store.aadd_texts([f"text {i}" for i in range(len(odd))], ids=odd)
    assert ids == odd
    got = await store.aget_by_ids(list(reversed(odd)))
    assert [doc.id for doc in got] == list(reversed(odd))  # get_by_ids keeps the order asked for
    assert store.passage_id(canonical) == uuid.UUID(canonical)  # a canonical UUID is the passage id
    assert store.passage_id("1") != store.passage_id(canonical.upper())
    assert store.passage_id("1") == MemormVectorStore(db, store.agent_id, Hashing()).passage_id("1")


async def test_documents_added_without_ids_get_uuid_ids_that_are_passage_ids(db: Database) -> None:
    agent_id = await _agent(db)
    store = MemormVectorStore(db, agent_id, Hashing())
    [first, second] = await store.aadd_documents([Document("alpha"), Document("beta", metadata={"k": "v"})])
    async with db.unit_of_work(read_only=True) as uow:
        passage = await uow.passages.get(second)
    assert (passage.text, passage.meta) == ("beta", {"k": "v"})  # no id key: the id is the passage's
    assert first != second


async def test_metadata_round_trips_exactly(db: Database) -> None:
    store = MemormVectorStore(db, await _agent(db), Hashing())
    metadata = {
        "source": "wiki",
        "page": 7,
        "score": 0.25,
        "flags": [True, False, None],
        "nested": {"a": {"b": [1, 2, {"c": "ü"}]}},
        "id": "user's own id key",
        "big": 2**62,
    }
    [doc_id] = await store.aadd_texts(["some text"], [metadata], ids=["m1"])
    [doc] = await store.aget_by_ids([doc_id])
    assert doc.metadata == metadata
    assert type(doc.metadata["page"]) is int
    assert type(doc.metadata["score"]) is float
    with pytest.raises(ValidationError):
        await store.aadd_texts(["x"], [{DOCUMENT_ID_KEY: "mine"}])


async def test_stores_of_two_agents_are_separate_even_with_the_same_ids(db: Database) -> None:
    sam = MemormVectorStore(db, await _agent(db, "sam"), Hashing())
    max_ = MemormVectorStore(db, await _agent(db, "max"), Hashing())
    await sam.aadd_texts(["sam's fact"], ids=["1"])
    await max_.aadd_texts(["max's fact"], ids=["1"])
    assert [d.page_content for d in await sam.asimilarity_search("fact", k=5)] == ["sam's fact"]
    assert [d.page_content for d in await max_.aget_by_ids(["1"])] == ["max's fact"]
    await sam.adelete(["1"])
    assert await sam.aget_by_ids(["1"]) == []
    assert [d.page_content for d in await max_.aget_by_ids(["1"])] == ["max's fact"]

    # A canonical UUID is the passage id, which names one passage of the tenant (issue 28):
    # another agent can neither read nor delete sam's document, nor add one under its id.
    [taken] = await sam.aadd_texts(["sam's uuid fact"], ids=[str(uuid.uuid4())])
    assert await max_.aget_by_ids([taken]) == []
    await max_.adelete([taken])
    with pytest.raises(ConflictError, match=f"^an archival passage with id {taken} exists$"):
        await max_.aadd_texts(["max's own"], ids=[taken])
    assert await max_.aget_by_ids([taken]) == []
    assert [d.page_content for d in await sam.aget_by_ids([taken])] == ["sam's uuid fact"]


async def test_filters_scores_and_relevance(db: Database) -> None:
    store = MemormVectorStore(db, await _agent(db), Hashing())
    await store.aadd_texts(
        ["the cat sat on the mat", "a cat chased a mouse", "stocks fell sharply today"],
        [{"topic": "pets"}, {"topic": "pets"}, {"topic": "news"}],
    )
    hits = await store.asimilarity_search_with_score("cat on the mat", k=3)
    assert hits[0][0].page_content == "the cat sat on the mat"
    assert [score for _, score in hits] == sorted((score for _, score in hits), reverse=True)
    # Scores are cosine similarities (the vectors are unit length: their dot product).
    stored, query = _vector("the cat sat on the mat"), _vector("cat on the mat")
    assert hits[0][1] == pytest.approx(float(stored @ query))

    news = await store.asimilarity_search("cat", k=3, filter={"topic": "news"})
    assert [d.page_content for d in news] == ["stocks fell sharply today"]
    pets = await store.asimilarity_search("cat", k=3, filter={"topic": {"$in": ["pets"]}})
    assert {d.metadata["topic"] for d in pets} == {"pets"}
    assert len(pets) == 2

    assert hits[2][1] < 0  # opposite-ish vectors: a negative cosine similarity
    relevant = await store.asimilarity_search_with_relevance_scores("cat on the mat", k=3)
    assert [d for d, _ in relevant] == [d for d, _ in hits]
    assert [r for _, r in relevant] == pytest.approx([(1 + score) / 2 for _, score in hits])


def _vector(text: str) -> np.ndarray:
    return np.asarray(Hashing().embed_query(text))


async def test_max_marginal_relevance_prefers_diverse_results(db: Database) -> None:
    store = MemormVectorStore(db, await _agent(db), Hashing())
    await store.aadd_texts(["cats are great pets", "cats are great pets indeed", "dogs are loyal pets"])
    plain = await store.asimilarity_search("cats pets", k=2)
    diverse = await store.amax_marginal_relevance_search("cats pets", k=2, fetch_k=3, lambda_mult=0.3)
    assert {d.page_content for d in plain} == {"cats are great pets", "cats are great pets indeed"}
    assert "dogs are loyal pets" in {d.page_content for d in diverse}
    sync = await anyio.to_thread.run_sync(
        lambda: store.max_marginal_relevance_search("cats pets", k=2, fetch_k=3, lambda_mult=0.3)
    )
    assert sync == diverse


async def test_embedding_model_name_comes_from_the_embeddings(db: Database) -> None:
    agent_id = await _agent(db)
    named = MemormVectorStore(db, agent_id, Hashing(dim=32))
    assert named.embedding_model == "hashing-32"
    assert named.embeddings is named.embedding
    anonymous = MemormVectorStore(db, agent_id, DeterministicFakeEmbedding(size=8))
    assert anonymous.embedding_model == "default"
    explicit = MemormVectorStore(db, agent_id, DeterministicFakeEmbedding(size=8), embedding_model="fake-8")
    await named.aadd_texts(["one"])
    await explicit.aadd_texts(["two"])
    async with db.unit_of_work(read_only=True) as uow:
        assert await uow.passages.count(agent_id, embedding_model="hashing-32") == 1
        assert await uow.passages.count(agent_id, embedding_model="fake-8") == 1
    # Searches compare only the store's own model.
    assert [d.page_content for d in await explicit.asimilarity_search("one", k=5)] == ["two"]


async def test_from_texts_and_delete_all_refusal(db: Database) -> None:
    agent_id = await _agent(db)
    store = await MemormVectorStore.afrom_texts(
        ["a b", "c d"], Hashing(), [{"n": 1}, {"n": 2}], ids=["x", "y"], db=db, agent_id=agent_id
    )
    assert [d.metadata for d in await store.aget_by_ids(["y", "x"])] == [{"n": 2}, {"n": 1}]
    synced = await anyio.to_thread.run_sync(
        lambda: MemormVectorStore.from_texts(["e f"], Hashing(), ids=["z"], db=db, agent_id=agent_id)
    )
    assert [d.page_content for d in await synced.aget_by_ids(["x", "z"])] == ["a b", "e f"]
    with pytest.raises(ValidationError):
        await MemormVectorStore.afrom_texts(["a"], Hashing(), db=db)
    with pytest.raises(ValidationError):
        await store.adelete()
    with pytest.raises(ValidationError):
        await store.aadd_texts(["a", "b"], [{}])  # one metadata for two texts


async def test_repeated_id_in_one_batch_keeps_the_last(db: Database) -> None:
    agent_id = await _agent(db)
    store = MemormVectorStore(db, agent_id, Hashing())
    assert await store.aadd_texts(["first", "second"], [{"n": 1}, {"n": 2}], ids=["dup", "dup"]) == [
        "dup",
        "dup",
    ]
    assert await store.aget_by_ids(["dup"]) == [Document(id="dup", page_content="second", metadata={"n": 2})]
    async with db.unit_of_work(read_only=True) as uow:
        assert await uow.passages.count(agent_id) == 1


async def test_concurrent_upserts_of_one_id_leave_one_passage(db: Database) -> None:
    agent_id = await _agent(db)
    store = MemormVectorStore(db, agent_id, Hashing())

    async def add(index: int) -> None:
        await store.aadd_texts([f"version {index}"], ids=["same"])

    async with anyio.create_task_group() as group:
        for index in range(10):
            group.start_soon(add, index)

    async with db.unit_of_work(read_only=True) as uow:
        assert await uow.passages.count(agent_id) == 1
    [doc] = await store.aget_by_ids(["same"])
    assert doc.page_content.startswith("version ")


async def test_passages_written_with_memorms_api_are_documents(db: Database) -> None:
    agent_id = await _agent(db)
    embedding = Hashing()
    async with db.unit_of_work() as uow:
        passage = await uow.passages.add(
            agent_id,
            "native passage",
            embedding.embed_query("native passage"),
            embedding_model=embedding.model,
            meta={"m": 1},
        )
    store = MemormVectorStore(db, agent_id, embedding)
    assert await store.aget_by_ids([str(passage.id)]) == [
        Document(id=str(passage.id), page_content="native passage", metadata={"m": 1})
    ]
    assert (await store.asimilarity_search("native", k=1))[0].id == str(passage.id)
    await store.adelete([str(passage.id)])
    async with db.unit_of_work(read_only=True) as uow:
        assert await uow.passages.count(agent_id) == 0


async def test_deleting_from_a_deleted_agents_store_is_a_no_op(db: Database) -> None:
    agent_id = await _agent(db)
    store = MemormVectorStore(db, agent_id, Hashing())
    await store.aadd_texts(["gone soon"], ids=["g"])
    async with db.unit_of_work() as uow:
        await uow.agents.delete(agent_id)
    assert await store.adelete(["g"]) is True
    assert await store.aget_by_ids(["g"]) == []
