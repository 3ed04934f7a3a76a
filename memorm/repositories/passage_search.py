"""Searching archival memory: vector, full-text and hybrid search of an agent's passages.

The engine's own search is chosen in `memorm.search` (`nearest`, `search_page`):
this side checks the query, finds the model (cached or looked up) and scores the hits.
"""

from __future__ import annotations

import builtins
import math
import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.sql import ColumnElement

from memorm.errors import ValidationError
from memorm.models import EMBEDDING_MODELS, PASSAGES, ArchivalPassage, EmbeddingModel
from memorm.page import Page
from memorm.repositories.passage_checks import check_half, check_model_dim, check_model_name
from memorm.repositories.passage_queries import PassageQueries
from memorm.search.filters import Filter
from memorm.search.fts_ddl import PASSAGES_FTS
from memorm.search.text import search_page
from memorm.search.vector import ScoredPassage, nearest, score_of
from memorm.search.vector_index import check_metric
from memorm.types.vector import pack_float16, unpack_float16
from memorm.validation import as_uuid, check_int, check_limit, check_text, check_vector

__all__ = ["PassageSearch"]

RRF_K = 60  # reciprocal rank fusion's damping constant (Cormack et al.)
_MODELS_NAMED = 10  # an unknown model's error names at most this many of the agent's


def _check_k(k: object, field: str = "k") -> int:
    return check_int(k, field, minimum=1, maximum=1000)


class PassageSearch(PassageQueries):
    """The search side of [`PassageRepository`][memorm.repositories.PassageRepository]."""

    async def search(
        self,
        agent_id: uuid.UUID | str,
        embedding: Sequence[float],
        *,
        k: int = 10,
        embedding_model: str = "default",
        metric: str = "cosine",
        where: Filter | None = None,
        offset: int = 0,
        ef_search: int | None = None,
    ) -> builtins.list[ScoredPassage]:
        """The `k` passages nearest `embedding`, best first (ties by id).

        On Postgres an HNSW index
        ([`ensure_index`][memorm.repositories.PassageRepository.ensure_index]) is
        used when it exists.

        Args:
            agent_id: the agent whose passages to search.
            embedding: the query vector, of the model's dimension.
            k: how many passages at most.
            embedding_model: only passages of this model are compared.
            metric: `"cosine"`, `"l2"` or `"inner_product"`.
            where: a [`Filter`][memorm.search.filters.Filter] on `meta` and
                `created_at`, applied in SQL before the limit, so a filtered
                search still returns `k` hits when `k` exist.
            offset: how many of the nearest passages to skip.
            ef_search: on Postgres, the HNSW index's candidates per query;
                None is the connection's (40, unless its `server_settings`
                say otherwise).  Another value costs one statement more.

        Returns:
            Up to `k` hits; an empty list when none is near enough to be
            found, or the agent has no passages at all.

        Raises:
            NotFoundError: the agent does not exist (in this tenant).
            ValidationError: bad arguments; an `embedding` whose length is
                not the model's dimension; or an `embedding_model` the agent
                does not have while it has others (the message names them:
                a search without `embedding_model=` looks under
                `"default"`).
        """
        key = as_uuid(agent_id, "agent_id")
        vector = check_vector(embedding)
        check_limit(_check_k(k), offset)
        chosen = check_metric(metric)
        if ef_search is not None:
            _check_k(ef_search, "ef_search")
        if chosen == "cosine" and not any(vector):
            raise ValidationError("embedding: a zero vector has no direction for cosine distance")
        conditions = await self._filters(where)
        name = check_model_name(embedding_model)
        # A model cached on the Database may be stale (dropped or replaced by another
        # process): the search statement checks it, and a search that finds nothing
        # (or a dimension that does not fit) looks the model up again.
        model = self._models.get((key, name)) or self.cache.models.get(self._required_tenant, key, name)
        known = model is not None and (key, name) in self._models
        if model is None or model.dim != len(vector):
            model, known = await self._lookup(key, name), True
        if model is None:
            await self._no_model(key, name)
            return []
        hits = await self._nearest(key, model, vector, chosen, conditions, k, offset, ef_search)
        if not hits and not known:
            self.cache.models.drop(self._required_tenant, key, name)
            fresh = await self._lookup(key, name)
            if fresh is None:
                await self._no_model(key, name)
                return []
            if (fresh.id, fresh.dim, fresh.precision) != (model.id, model.dim, model.precision):
                hits = await self._nearest(key, fresh, vector, chosen, conditions, k, offset, ef_search)
        elif not hits:
            await self._require_agent(key)
        # A stored zero vector has no direction: its cosine distance is NaN on both
        # engines (sorted last), and it is no match.
        return [
            ScoredPassage(passage, distance, score_of(chosen, distance))
            for passage, distance in hits
            if not math.isnan(distance)
        ]

    async def _nearest(
        self,
        key: uuid.UUID,
        model: EmbeddingModel,
        vector: builtins.list[float],
        metric: str,
        conditions: builtins.list[ColumnElement[bool]],
        k: int,
        offset: int,
        ef_search: int | None,
    ) -> builtins.list[tuple[ArchivalPassage, float]]:
        """`nearest` with `model`, after checking the query fits it."""
        check_model_dim(model.name, model.dim, len(vector))
        if model.precision == "float16":
            # Compare as the vectors are stored: Postgres casts the query to
            # halfvec, so SQLite rounds it the same way.
            check_half([vector])
            vector = unpack_float16(pack_float16(vector))
        async with self._guard():
            return await nearest(
                self.link,
                self.cache,
                self._required_tenant,
                key,
                model,
                vector,
                metric=metric,
                where=conditions,
                k=k,
                offset=offset,
                ef_search=ef_search,
            )

    async def search_text(
        self, agent_id: uuid.UUID | str, query: str, *, limit: int = 10, offset: int = 0
    ) -> Page[ArchivalPassage]:
        """Full-text search of the agent's passages, with the same rules as message search."""
        key = as_uuid(agent_id, "agent_id")
        text = check_text(query, "query") or ""
        check_limit(limit, offset)
        page = await self._text_page(key, text, [], limit=limit, offset=offset)
        if not page.total:  # a match proves the agent exists: only no match asks
            await self._require_agent(key)
        return page

    async def hybrid_search(
        self,
        agent_id: uuid.UUID | str,
        query: str,
        embedding: Sequence[float],
        *,
        k: int = 10,
        embedding_model: str = "default",
        metric: str = "cosine",
        where: Filter | None = None,
        candidates: int | None = None,
    ) -> builtins.list[ScoredPassage]:
        """Text and vector search fused by reciprocal rank (score = sum of 1 / (60 + rank)).

        `distance` is the vector distance, or None for passages only the text
        search found.

        Args:
            agent_id: the agent whose passages to search.
            query: the words for the full-text side.
            embedding: the query vector for the vector side.
            k: how many passages at most.
            embedding_model: both sides search only passages of this model.
            metric: the vector side's metric, as in `search`.
            where: a [`Filter`][memorm.search.filters.Filter] on `meta` and
                `created_at`, for both sides.
            candidates: each side contributes its best `candidates` (default
                `4 * k`, at most 1000).
        """
        _check_k(k)
        pool = _check_k(candidates if candidates is not None else min(1000, 4 * k), "candidates")
        text = check_text(query, "query") or ""  # checked with the rest, before search's statements
        vector_hits = await self.search(
            agent_id, embedding, k=pool, embedding_model=embedding_model, metric=metric, where=where
        )
        # The text side gets the same scope in SQL, before its limit: model and filters.
        key = as_uuid(agent_id, "agent_id")
        scope = [
            PASSAGES.c.embedding_model == check_model_name(embedding_model),
            *await self._filters(where),
        ]
        text_hits = await self._text_page(key, text, scope, limit=pool, offset=0)
        distance = {hit.passage.id: hit.distance for hit in vector_hits}
        found = {hit.passage.id: hit.passage for hit in vector_hits}
        fused: dict[uuid.UUID, float] = {}
        for rank, hit in enumerate(vector_hits, start=1):
            fused[hit.passage.id] = fused.get(hit.passage.id, 0.0) + 1.0 / (RRF_K + rank)
        for rank, passage in enumerate(text_hits.items, start=1):
            found.setdefault(passage.id, passage)
            fused[passage.id] = fused.get(passage.id, 0.0) + 1.0 / (RRF_K + rank)
        ranked = sorted(fused.items(), key=lambda pair: (-pair[1], pair[0]))[:k]
        return [ScoredPassage(found[i], distance.get(i), score) for i, score in ranked]

    # -- helpers ------------------------------------------------------------

    async def _no_model(self, key: uuid.UUID, name: str) -> None:
        """The agent has no model `name`: fine (nothing to find) if it has none at all.

        An agent with models of other names gets a `ValidationError` naming
        them: an empty answer would read as "no passage is near", when the
        search looked in the wrong place (a search without
        `embedding_model=` looks under `"default"`).
        """
        names = list(
            (
                await self._execute(
                    sa.select(EMBEDDING_MODELS.c.name)
                    .where(*self._tenant_filter(EMBEDDING_MODELS), EMBEDDING_MODELS.c.agent_id == key)
                    .order_by(EMBEDDING_MODELS.c.name)
                    .limit(_MODELS_NAMED + 1)
                )
            ).scalars()
        )
        if not names:  # a model belongs to its agent: none may mean no agent
            await self._require_agent(key)
            return
        listed = ", ".join(repr(found) for found in names[:_MODELS_NAMED])
        if len(names) > _MODELS_NAMED:
            listed += ", …"
        raise ValidationError(
            f"embedding_model: agent {key} has no embedding model {name!r}; its models are {listed}: "
            "pass one as embedding_model="
        )

    async def _text_page(
        self,
        agent: uuid.UUID,
        text: str,
        where: builtins.list[ColumnElement[bool]],
        *,
        limit: int,
        offset: int,
    ) -> Page[ArchivalPassage]:
        return await search_page(
            self.link,
            PASSAGES_FTS,
            text,
            entity=ArchivalPassage,
            tenant=self._required_tenant,
            agent=agent,
            where=where,
            limit=limit,
            offset=offset,
        )
