"""`MemormVectorStore`: LangChain's `VectorStore` over an agent's archival passages."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from typing_extensions import Self

from memorm.compat._sync import BRIDGE
from memorm.compat.langchain import archive
from memorm.compat.langchain.documents import (
    Batch,
    embedding_model_of,
    passage_batch,
    passage_id,
    to_document,
)
from memorm.compat.langchain.search import VectorSearch
from memorm.db import Database
from memorm.errors import ValidationError
from memorm.models import Agent, ArchivalPassage
from memorm.search.vector_index import check_metric
from memorm.validation import as_uuid, check_list, check_name

__all__ = ["MemormVectorStore"]


class MemormVectorStore(VectorSearch):
    """A LangChain vector store over an agent's archival passages.

    Args:
        db: the shared [`Database`][memorm.db.Database].
        agent_id: the agent whose passages this store holds.
        embedding: the LangChain `Embeddings` that embed texts and queries.
        embedding_model: the memorm embedding model name the passages are
            stored and searched under (one dimension per agent and name).
            Defaults to the embedding object's `model`, `model_name` or
            `model_id`, else `"default"`.
        metric: `"cosine"` (default), `"l2"` or `"inner_product"`.

    Document ids are strings.  A canonical UUID string is the passage id
    itself (which names one passage of the tenant: another agent's store
    refuses it, `ConflictError`); any other string maps to a UUID derived from the agent and the id,
    and is kept in the passage's `meta["_langchain_id"]`, so `Document.id`
    reads back exactly.  Adding a document under an existing id replaces its
    text, metadata and embedding.  `Document.metadata` is the passage's
    `meta` (JSON values) without that key; `filter=` takes memorm's
    `where` filters (`{"topic": "cats"}`, `{"lang": {"$in": [...]}}`).

    Scores from `similarity_search_with_score` are memorm's: higher is
    better (cosine similarity for `cosine`; see `docs/archival.md`).
    Relevance scores (`similarity_search_with_relevance_scores`, retrievers'
    `score_threshold`) map them onto [0, 1]: `(1 + similarity) / 2` for
    cosine.  Sync methods embed in the calling thread and run the database
    work on memorm's sync loop.

    Example:
        ```python
        store = MemormVectorStore(db, agent.id, OpenAIEmbeddings(model="text-embedding-3-small"))
        await store.aadd_texts(["Ada's cat is called Miso."], ids=["fact-1"])
        [doc] = await store.asimilarity_search("cat's name", k=1)
        ```
    """

    def __init__(
        self,
        db: Database,
        agent_id: uuid.UUID | str | Agent,
        embedding: Embeddings,
        *,
        embedding_model: str | None = None,
        metric: str = "cosine",
    ) -> None:
        self.db = db
        self.agent_id = as_uuid(agent_id.id if isinstance(agent_id, Agent) else agent_id, "agent_id")
        self.embedding = embedding
        name = embedding_model_of(embedding) if embedding_model is None else embedding_model
        self.embedding_model = check_name(name, "embedding_model")
        self.metric = check_metric(metric)

    def __repr__(self) -> str:
        return f"MemormVectorStore(agent_id={self.agent_id}, embedding_model={self.embedding_model!r})"

    @property
    def embeddings(self) -> Embeddings:
        """The embeddings this store embeds texts and queries with."""
        return self.embedding

    # -- ids and documents ---------------------------------------------------

    def passage_id(self, document_id: str) -> uuid.UUID:
        """The passage id a document id maps to."""
        return passage_id(self.agent_id, document_id)

    @staticmethod
    def document(passage: ArchivalPassage) -> Document:
        """The LangChain `Document` a passage holds."""
        return to_document(passage)

    def _batch(
        self, texts: list[str], metadatas: list[dict[str, Any]] | None, ids: Sequence[str | None] | None
    ) -> Batch:
        return passage_batch(self.agent_id, self.embedding_model, texts, metadatas, ids)

    def _targets(self, ids: list[str] | None) -> list[uuid.UUID]:
        """The passage ids to delete; LangChain's `ids=None` ("everything") is refused."""
        if ids is None:
            raise ValidationError(
                "delete: give ids (memorm does not empty an archive by accident; "
                "delete the agent, or use uow.passages.delete_where)"
            )
        return self._passage_ids(ids)

    def _passage_ids(self, ids: object) -> list[uuid.UUID]:
        return [self.passage_id(document_id) for document_id in check_list(ids, "ids", "document ids")]

    # -- writing -------------------------------------------------------------

    def add_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        """Embed and store the texts in one unit of work; returns their ids.

        `ids` entries that are None get new ids; an id that exists is replaced.
        """
        batch = check_list(texts, "texts", "strings")
        keys, items, existing = self._batch(batch, metadatas, ids)
        if not batch:
            return []
        vectors = self.embedding.embed_documents(batch)
        BRIDGE.run(self.db, lambda db: archive.upsert(db, self.agent_id, items, vectors, existing))
        return keys

    async def aadd_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        """Embed and store the texts in one unit of work; returns their ids."""
        batch = check_list(texts, "texts", "strings")
        keys, items, existing = self._batch(batch, metadatas, ids)
        if not batch:
            return []
        vectors = await self.embedding.aembed_documents(batch)
        await archive.upsert(self.db, self.agent_id, items, vectors, existing)
        return keys

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool:
        """Delete the documents with these ids (missing ids are ignored); returns True.

        `ids=None` (LangChain's "delete everything") is refused: delete the
        agent, or use `uow.passages.delete_where`.
        """
        targets = self._targets(ids)
        BRIDGE.run(self.db, lambda db: archive.delete(db, self.agent_id, targets))
        return True

    async def adelete(self, ids: list[str] | None = None, **kwargs: Any) -> bool:
        """Delete the documents with these ids (missing ids are ignored); returns True."""
        await archive.delete(self.db, self.agent_id, self._targets(ids))
        return True

    # -- reading by id (searches: VectorSearch) ------------------------------

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The documents with these ids, in the order given; missing ids are skipped."""
        wanted = self._passage_ids(ids)
        return BRIDGE.run(self.db, lambda db: archive.get(db, self.agent_id, wanted))

    async def aget_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The documents with these ids, in the order given; missing ids are skipped."""
        wanted = self._passage_ids(ids)
        return await archive.get(self.db, self.agent_id, wanted)

    # -- construction --------------------------------------------------------

    @classmethod
    def from_texts(
        cls,
        texts: list[str],
        embedding: Embeddings,
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        db: Database | None = None,
        agent_id: uuid.UUID | str | Agent | None = None,
        embedding_model: str | None = None,
        metric: str = "cosine",
        **kwargs: Any,
    ) -> Self:
        """A store over `agent_id`'s passages in `db`, with `texts` added (both are required)."""
        store = cls(*_required(db, agent_id), embedding, embedding_model=embedding_model, metric=metric)
        store.add_texts(texts, metadatas, ids=ids)
        return store

    @classmethod
    async def afrom_texts(
        cls,
        texts: list[str],
        embedding: Embeddings,
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        db: Database | None = None,
        agent_id: uuid.UUID | str | Agent | None = None,
        embedding_model: str | None = None,
        metric: str = "cosine",
        **kwargs: Any,
    ) -> Self:
        """A store over `agent_id`'s passages in `db`, with `texts` added (both are required)."""
        store = cls(*_required(db, agent_id), embedding, embedding_model=embedding_model, metric=metric)
        await store.aadd_texts(texts, metadatas, ids=ids)
        return store


def _required(
    db: Database | None, agent_id: uuid.UUID | str | Agent | None
) -> tuple[Database, uuid.UUID | str | Agent]:
    if db is None or agent_id is None:
        raise ValidationError("from_texts: give db= and agent_id=")
    return db, agent_id
