"""Reading archival memory: passages, embedding models, vector, text and hybrid search."""

from __future__ import annotations

import builtins
import math
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql import ColumnElement

from memorm.errors import NotFoundError, ValidationError
from memorm.link import Link
from memorm.models import EMBEDDING_MODELS, PASSAGES, ArchivalPassage, EmbeddingModel, fields, hydrate
from memorm.page import Page
from memorm.repositories.base import Repository
from memorm.search.filters import Filter, filter_conditions
from memorm.search.fts_ddl import PASSAGES_FTS
from memorm.search.text import search_page
from memorm.search.vector import (
    ScoredPassage,
    VectorCache,
    check_metric,
    nearest,
    score_of,
)
from memorm.tenancy import DEFAULT_TENANT
from memorm.types.vector import pack_float16, unpack_float16
from memorm.validation import (
    as_uuid,
    check_int,
    check_limit,
    check_list,
    check_name,
    check_text,
    check_vector,
    shown,
)

__all__ = ["PassageQueries"]

_FIELDS = fields(PASSAGES)  # not the derived search words
_COLUMNS = tuple(column.name for column in _FIELDS)
_PRECISIONS = ("float32", "float16")
_ITEM_FIELDS = frozenset(("text", "embedding", "meta", "embedding_model", "id", "created_at"))
RRF_K = 60  # reciprocal rank fusion's damping constant (Cormack et al.)
_MODELS_NAMED = 10  # an unknown model's error names at most this many of the agent's

PassageInput = ArchivalPassage | Mapping[str, Any]


def _check_model_name(name: object) -> str:
    return check_name(name, "embedding_model")


def _check_shape(dim: object, precision: object) -> None:
    """An embedding model's shape: 1 to 16,000 dimensions, stored at one of `_PRECISIONS`."""
    check_int(dim, "dim", minimum=1, maximum=16000)
    _check_precision(precision)


FLOAT16_MAX = 65504.0


def _check_half(vectors: Iterable[Sequence[float]]) -> None:
    """Values a float16 model can store (larger ones would become infinity)."""
    for vector in vectors:
        if max(map(abs, vector), default=0.0) > FLOAT16_MAX:
            raise ValidationError(f"embedding: a float16 model stores values up to {FLOAT16_MAX:g}")


def _check_precision(precision: object) -> str:
    if not isinstance(precision, str) or precision not in _PRECISIONS:
        raise ValidationError(f"precision: {shown(precision)} is not one of {', '.join(_PRECISIONS)}")
    return precision


def _check_k(k: object, field: str = "k") -> int:
    return check_int(k, field, minimum=1, maximum=1000)


class PassageQueries(Repository):
    """The read side of [`PassageRepository`][memorm.repositories.PassageRepository]."""

    def __init__(
        self, link: Link, tenant: str | None = DEFAULT_TENANT, *, cache: VectorCache | None = None
    ) -> None:
        super().__init__(link, tenant)
        self.cache = cache if cache is not None else VectorCache()
        self._models: dict[tuple[uuid.UUID, str], EmbeddingModel] = {}

    async def get_model(self, agent_id: uuid.UUID | str, name: str) -> EmbeddingModel:
        """One of the agent's models; `NotFoundError` if it has none of that name."""
        key = as_uuid(agent_id, "agent_id")
        model = _check_model_name(name)
        found = await self._lookup(key, model)
        if found is None:
            raise NotFoundError(f"agent {key} has no embedding model {model!r}")
        return found

    async def _lookup(self, agent_id: uuid.UUID, name: str) -> EmbeddingModel | None:
        """The agent's model, as this unit of work knows it or as the database has it now."""
        cached = self._models.get((agent_id, name))
        if cached is not None:
            return cached
        row = (
            await self._execute(
                sa.select(*EMBEDDING_MODELS.c).where(
                    *self._own(EMBEDDING_MODELS),
                    EMBEDDING_MODELS.c.agent_id == agent_id,
                    EMBEDDING_MODELS.c.name == name,
                )
            )
        ).first()
        if row is None:
            return None
        values = dict(row._mapping)
        self.cache.models.put(values)  # for later searches (which check it is still current)
        model = hydrate(EmbeddingModel, values)
        self._models[(agent_id, name)] = model
        return model

    # -- reading ------------------------------------------------------------

    async def get(self, passage_id: uuid.UUID | str) -> ArchivalPassage:
        """The passage with this id; `NotFoundError` if there is none."""
        key = as_uuid(passage_id, "passage_id")
        found = await self._load([key])
        if not found:
            raise NotFoundError(f"no passage {key}")
        return found[key]

    async def get_many(
        self, ids: Iterable[uuid.UUID | str], *, agent_id: uuid.UUID | str | None = None
    ) -> builtins.list[ArchivalPassage]:
        """The passages with these ids, in the order given; unknown ids are left out.

        An id names one passage of the tenant: with `agent_id`, only that
        agent's are returned (and on a distributed database, one shard is
        asked); without it, any agent's of the tenant.
        """
        wanted = [as_uuid(passage_id, "ids[]") for passage_id in check_list(ids, "ids", "passage ids")]
        owner = None if agent_id is None else as_uuid(agent_id, "agent_id")
        found: dict[uuid.UUID, ArchivalPassage] = {}
        for first in range(0, len(wanted), 1000):  # bounded IN lists
            found.update(await self._load(wanted[first : first + 1000], owner))
        return [found[passage_id] for passage_id in wanted if passage_id in found]

    async def count(self, agent_id: uuid.UUID | str, *, embedding_model: str | None = None) -> int:
        """How many passages the agent has (of one model, if given)."""
        key = as_uuid(agent_id, "agent_id")
        query = sa.select(sa.func.count()).where(*self._own(PASSAGES), PASSAGES.c.agent_id == key)
        if embedding_model is not None:
            query = query.where(PASSAGES.c.embedding_model == _check_model_name(embedding_model))
        return int(await self._scalar(query) or 0)

    async def list(
        self, agent_id: uuid.UUID | str, *, limit: int = 50, offset: int = 0
    ) -> Page[ArchivalPassage]:
        """The agent's passages, oldest first."""
        key = as_uuid(agent_id, "agent_id")
        query = (
            sa.select(ArchivalPassage)
            .where(*self._own(PASSAGES), PASSAGES.c.agent_id == key)
            .order_by(PASSAGES.c.created_at, PASSAGES.c.id)
            .execution_options(populate_existing=True)
        )
        return await self._page(query, limit=limit, offset=offset)

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
        name = _check_model_name(embedding_model)
        # A model cached on the Database may be stale (dropped or replaced by another
        # process): the search statement checks it, and a search that finds nothing
        # (or a dimension that does not fit) looks the model up again.
        model = self._models.get((key, name)) or self.cache.models.get(self._owner, key, name)
        known = model is not None and (key, name) in self._models
        if model is None or model.dim != len(vector):
            model, known = await self._lookup(key, name), True
        if model is None:
            await self._no_model(key, name)
            return []
        hits = await self._nearest(key, model, vector, chosen, conditions, k, offset, ef_search)
        if not hits and not known:
            self.cache.models.drop(self._owner, key, name)
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
        if model.dim != len(vector):
            raise ValidationError(
                f"embedding: model {model.name!r} stores {model.dim}-d vectors, got {len(vector)}"
            )
        if model.precision == "float16":
            # Compare as the vectors are stored: Postgres casts the query to
            # halfvec, so SQLite rounds it the same way.
            _check_half([vector])
            vector = unpack_float16(pack_float16(vector))
        async with self._guard():
            return await nearest(
                self.link,
                self.cache,
                self._owner,
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
            PASSAGES.c.embedding_model == _check_model_name(embedding_model),
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
                    .where(*self._own(EMBEDDING_MODELS), EMBEDDING_MODELS.c.agent_id == key)
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

    def _guard(self) -> Any:
        from memorm.translate import guarded

        return guarded(self.link)

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
            tenant=self._owner,
            agent=agent,
            where=where,
            limit=limit,
            offset=offset,
        )

    async def _filters(self, where: Filter | None) -> builtins.list[ColumnElement[bool]]:
        return await filter_conditions(self.link, PASSAGES, where)

    async def _load(
        self, ids: builtins.list[uuid.UUID], agent: uuid.UUID | None = None
    ) -> dict[uuid.UUID, ArchivalPassage]:
        """Passages by id (of `agent`, when known: one shard on a distributed database)."""
        if not ids:
            return {}
        rows = await self._execute(
            sa.select(*_FIELDS).where(
                *self._own(PASSAGES), *self._on(PASSAGES, agent), PASSAGES.c.id.in_(ids)
            )
        )
        return {row.id: hydrate(ArchivalPassage, dict(row._mapping)) for row in rows}
