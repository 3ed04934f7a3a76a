"""``uow.passages``: archival memory, text with its embedding in one row."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from memorm.errors import NotFoundError, ValidationError
from memorm.models import AGENTS, PASSAGES, ArchivalPassage
from memorm.repositories.base import Repository
from memorm.validation import as_uuid, check_json_object, check_text, check_vector

__all__ = ["PassageRepository"]

_PASSAGES = PASSAGES


class PassageRepository(Repository):
    """Archival passages of an agent."""

    async def add(
        self,
        agent_id: uuid.UUID | str,
        text: str,
        embedding: Sequence[float],
        *,
        embedding_model: str = "default",
        meta: Mapping[str, Any] | None = None,
    ) -> ArchivalPassage:
        """Store a passage and its embedding in one row.

        All of an agent's passages for one ``embedding_model`` share a dimension;
        a vector of another length raises ``ValidationError``.
        """
        key = as_uuid(agent_id, "agent_id")
        vector = check_vector(embedding)
        model = check_text(embedding_model, "embedding_model") or ""
        if not model:
            raise ValidationError("embedding_model: must not be empty")
        passage = ArchivalPassage(
            agent_id=key,
            text=check_text(text, "text"),
            embedding=vector,
            embedding_model=model,
            embedding_dim=len(vector),
            meta=check_json_object(meta, "meta"),
        )
        if await self._scalar(sa.select(AGENTS.c.id).where(AGENTS.c.id == key)) is None:
            raise NotFoundError(f"no agent {key}")
        stored_dim = await self._scalar(
            sa.select(_PASSAGES.c.embedding_dim)
            .where(_PASSAGES.c.agent_id == key, _PASSAGES.c.embedding_model == model)
            .limit(1)
        )
        if stored_dim is not None and stored_dim != len(vector):
            raise ValidationError(
                f"embedding: model {model!r} stores {stored_dim}-d vectors, got {len(vector)}"
            )
        async with self._savepoint():
            self.session.add(passage)
            await self.session.flush()
        return passage

    async def get(self, passage_id: uuid.UUID | str) -> ArchivalPassage:
        """The passage with this id; ``NotFoundError`` if there is none."""
        key = as_uuid(passage_id, "passage_id")
        passage: ArchivalPassage | None = await self._scalar(
            sa.select(ArchivalPassage).where(_PASSAGES.c.id == key)
        )
        if passage is None:
            raise NotFoundError(f"no passage {key}")
        return passage

    async def count(self, agent_id: uuid.UUID | str, *, embedding_model: str | None = None) -> int:
        """How many passages the agent has (of one model, if given)."""
        key = as_uuid(agent_id, "agent_id")
        query = sa.select(sa.func.count()).where(_PASSAGES.c.agent_id == key)
        if embedding_model is not None:
            query = query.where(_PASSAGES.c.embedding_model == embedding_model)
        return int(await self._scalar(query) or 0)

    async def delete(self, passage_id: uuid.UUID | str) -> None:
        """Delete one passage."""
        key = as_uuid(passage_id, "passage_id")
        result = await self._execute(sa.delete(_PASSAGES).where(_PASSAGES.c.id == key))
        if result.rowcount == 0:  # type: ignore[attr-defined]
            raise NotFoundError(f"no passage {key}")
