"""The search half of `MemormVectorStore`: similarity and MMR searches, sync and async.

`VectorSearch` holds only the searches, over the attributes the store
sets; [`MemormVectorStore`][memorm.compat.langchain.MemormVectorStore] adds
construction, writes and reads by id.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import VectorStore
from langchain_core.vectorstores.utils import maximal_marginal_relevance

from memorm.compat._sync import BRIDGE
from memorm.compat.langchain import archive
from memorm.compat.langchain.documents import to_document
from memorm.db import Database
from memorm.errors import ValidationError
from memorm.search.vector import ScoredPassage
from memorm.validation import check_int, check_text, shown

__all__ = ["VectorSearch"]


def _query(query: object) -> str:
    """The query text, checked before the embeddings see it."""
    return check_text(query, "query") or ""


def _check_mmr(k: object, lambda_mult: object) -> None:
    """MMR's own arguments (`fetch_k` is the search's `k`, checked there)."""
    check_int(k, "k", minimum=1, maximum=1000)
    if (
        isinstance(lambda_mult, bool)
        or not isinstance(lambda_mult, (int, float))
        or not 0 <= lambda_mult <= 1  # also false for NaN
    ):
        raise ValidationError(f"lambda_mult: expected a number from 0 to 1, got {shown(lambda_mult)}")


class VectorSearch(VectorStore):
    """LangChain's search methods over an agent's passages (a base of `MemormVectorStore`)."""

    db: Database
    agent_id: uuid.UUID
    embedding: Embeddings
    embedding_model: str
    metric: str

    def similarity_search(
        self, query: str, k: int = 4, *, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        """The `k` documents nearest `query`, best first."""
        return [doc for doc, _ in self.similarity_search_with_score(query, k, filter=filter)]

    async def asimilarity_search(
        self, query: str, k: int = 4, *, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        """The `k` documents nearest `query`, best first."""
        return [doc for doc, _ in await self.asimilarity_search_with_score(query, k, filter=filter)]

    def similarity_search_with_score(
        self, query: str, k: int = 4, *, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """The `k` documents nearest `query` with their scores (higher is better)."""
        return self.similarity_search_with_score_by_vector(
            self.embedding.embed_query(_query(query)), k, filter=filter
        )

    async def asimilarity_search_with_score(
        self, query: str, k: int = 4, *, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """The `k` documents nearest `query` with their scores (higher is better)."""
        vector = await self.embedding.aembed_query(_query(query))
        return await self.asimilarity_search_with_score_by_vector(vector, k, filter=filter)

    def similarity_search_with_score_by_vector(
        self, embedding: list[float], k: int = 4, *, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """The `k` documents nearest `embedding` with their scores (higher is better)."""
        hits = BRIDGE.run(self.db, lambda db: self._search(db, embedding, k, filter))
        return [(to_document(hit.passage), hit.score) for hit in hits]

    async def asimilarity_search_with_score_by_vector(
        self, embedding: list[float], k: int = 4, *, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """The `k` documents nearest `embedding` with their scores (higher is better)."""
        hits = await self._search(self.db, embedding, k, filter)
        return [(to_document(hit.passage), hit.score) for hit in hits]

    def similarity_search_by_vector(
        self, embedding: list[float], k: int = 4, *, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        """The `k` documents nearest `embedding`, best first."""
        return [doc for doc, _ in self.similarity_search_with_score_by_vector(embedding, k, filter=filter)]

    async def asimilarity_search_by_vector(
        self, embedding: list[float], k: int = 4, *, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        """The `k` documents nearest `embedding`, best first."""
        found = await self.asimilarity_search_with_score_by_vector(embedding, k, filter=filter)
        return [doc for doc, _ in found]

    def max_marginal_relevance_search(
        self,
        query: str,
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        *,
        filter: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        """`k` documents chosen among the `fetch_k` nearest for relevance and diversity."""
        _check_mmr(k, lambda_mult)
        return self.max_marginal_relevance_search_by_vector(
            self.embedding.embed_query(_query(query)), k, fetch_k, lambda_mult, filter=filter
        )

    async def amax_marginal_relevance_search(
        self,
        query: str,
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        *,
        filter: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        """`k` documents chosen among the `fetch_k` nearest for relevance and diversity."""
        _check_mmr(k, lambda_mult)
        vector = await self.embedding.aembed_query(_query(query))
        return await self.amax_marginal_relevance_search_by_vector(
            vector, k, fetch_k, lambda_mult, filter=filter
        )

    def max_marginal_relevance_search_by_vector(
        self,
        embedding: list[float],
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        *,
        filter: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        """`k` documents chosen among the `fetch_k` nearest for relevance and diversity."""
        _check_mmr(k, lambda_mult)
        hits = BRIDGE.run(self.db, lambda db: self._search(db, embedding, fetch_k, filter))
        return self._mmr(embedding, hits, k, lambda_mult)

    async def amax_marginal_relevance_search_by_vector(
        self,
        embedding: list[float],
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        *,
        filter: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        """`k` documents chosen among the `fetch_k` nearest for relevance and diversity."""
        _check_mmr(k, lambda_mult)
        hits = await self._search(self.db, embedding, fetch_k, filter)
        return self._mmr(embedding, hits, k, lambda_mult)

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        # Scores are already similarities (higher is better), not distances.
        if self.metric == "cosine":
            return lambda score: (1.0 + score) / 2.0  # [-1, 1] onto LangChain's [0, 1]
        if self.metric == "l2":
            return lambda score: score  # 1 / (1 + distance) is in (0, 1] already
        return lambda score: self._max_inner_product_relevance_score_fn(-score)

    async def _search(
        self, db: Database, vector: Sequence[float], k: int, where: dict[str, Any] | None
    ) -> list[ScoredPassage]:
        return await archive.search(
            db,
            self.agent_id,
            vector,
            k,
            embedding_model=self.embedding_model,
            metric=self.metric,
            where=where,
        )

    def _mmr(
        self, query: Sequence[float], hits: list[ScoredPassage], k: int, lambda_mult: float
    ) -> list[Document]:
        if not hits:
            return []
        chosen = maximal_marginal_relevance(
            np.asarray(query, dtype=np.float32),
            [list(hit.passage.vector) for hit in hits],
            lambda_mult=lambda_mult,
            k=k,
        )
        return [to_document(hits[index].passage) for index in chosen]
