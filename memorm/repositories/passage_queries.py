"""Reading archival memory: passages by id or page, counts, and the agents' embedding models."""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql import ColumnElement

from memorm.errors import NotFoundError
from memorm.link import Link
from memorm.models import EMBEDDING_MODELS, PASSAGES, ArchivalPassage, EmbeddingModel, fields, hydrate
from memorm.page import Page
from memorm.repositories.base import Repository
from memorm.repositories.passage_checks import check_model_name
from memorm.search.filters import Filter, filter_conditions
from memorm.search.vector_scan import VectorCache
from memorm.tenancy import DEFAULT_TENANT
from memorm.translate import guarded
from memorm.validation import as_uuid, check_list

__all__ = ["PassageQueries"]

_FIELDS = fields(PASSAGES)  # not the derived search words


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
        model = check_model_name(name)
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
                    *self._tenant_filter(EMBEDDING_MODELS),
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
        query = sa.select(sa.func.count()).where(*self._tenant_filter(PASSAGES), PASSAGES.c.agent_id == key)
        if embedding_model is not None:
            query = query.where(PASSAGES.c.embedding_model == check_model_name(embedding_model))
        return int(await self._scalar(query) or 0)

    async def list(
        self, agent_id: uuid.UUID | str, *, limit: int = 50, offset: int = 0
    ) -> Page[ArchivalPassage]:
        """The agent's passages, oldest first."""
        key = as_uuid(agent_id, "agent_id")
        query = (
            sa.select(ArchivalPassage)
            .where(*self._tenant_filter(PASSAGES), PASSAGES.c.agent_id == key)
            .order_by(PASSAGES.c.created_at, PASSAGES.c.id)
            .execution_options(populate_existing=True)
        )
        return await self._page(query, limit=limit, offset=offset)

    # -- helpers ------------------------------------------------------------

    def _guard(self) -> Any:
        """The unit of work's error translation around a statement not run by `_execute`."""
        return guarded(self.link)

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
                *self._tenant_filter(PASSAGES),
                *self._agent_filter_if_known(PASSAGES, agent),
                PASSAGES.c.id.in_(ids),
            )
        )
        return {row.id: hydrate(ArchivalPassage, dict(row._mapping)) for row in rows}
