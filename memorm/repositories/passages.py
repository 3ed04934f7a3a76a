"""`uow.passages`: archival memory, text with its embedding in one row.

Every passage belongs to an agent and an embedding model.  A model has one
dimension and one storage precision, fixed the first time it is used (or
declared with
[`PassageRepository.define_model`][memorm.repositories.PassageRepository.define_model]),
so vectors of several models — 384-d beside 1536-d — live side by side, and only passages of the
same model are ever compared.  Every write bumps the agent's
`archive_version`, which the SQLite vector cache checks before each search.
"""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from memorm.driver import insert_rows
from memorm.errors import ConflictError, NotFoundError, ValidationError
from memorm.models import AGENTS, PASSAGES, ArchivalPassage, EmbeddingModel, fields, hydrate
from memorm.repositories.id_claims import chose_id, refuse_held
from memorm.repositories.passage_checks import (
    PassageInput,
    check_half,
    check_item,
    check_model_dim,
    check_model_name,
    check_shape,
)
from memorm.repositories.passage_search import PassageSearch
from memorm.search.filters import Filter
from memorm.search.vector_index import check_metric, ensure_index
from memorm.types import utcnow
from memorm.validation import as_uuid, check_aware, check_flag, check_list, check_text, check_vector

__all__ = ["PassageRepository"]

_COLUMNS = tuple(column.name for column in fields(PASSAGES))  # not the derived search words
_OLD_BATCH = 10_000  # passages per DELETE in delete_before


def _old(tenant: str, agent_id: uuid.UUID, instant: datetime) -> sa.ColumnElement[bool]:
    return sa.and_(
        PASSAGES.c.tenant == tenant, PASSAGES.c.agent_id == agent_id, PASSAGES.c.created_at < instant
    )


class PassageRepository(PassageSearch):
    """Archival passages of an agent: storage, vector, text and hybrid search."""

    # -- models -------------------------------------------------------------

    async def define_model(
        self, agent_id: uuid.UUID | str, name: str, dim: int, *, precision: str = "float32"
    ) -> EmbeddingModel:
        """Declare one of the agent's embedding models before its first passage.

        `precision="float16"` halves storage (`halfvec` on Postgres, float16
        on SQLite) at about three significant digits per component.  Declaring
        the model again with the same shape is a no-op; another shape raises
        `ConflictError`.  Undeclared models are registered as float32 by their
        first passage.
        """
        key = as_uuid(agent_id, "agent_id")
        model = check_model_name(name)
        check_shape(dim, precision)
        await self._require_agent(key)
        found = await self._model(key, model, dim, precision=precision, check_dim=False)
        if (found.dim, found.precision) != (dim, precision):
            raise ConflictError(
                f"embedding model {model!r} is already {found.dim}-d {found.precision}, "
                f"not {dim}-d {precision}"
            )
        return found

    async def _model(
        self, agent_id: uuid.UUID, name: str, dim: int, *, precision: str = "float32", check_dim: bool = True
    ) -> EmbeddingModel:
        """The agent's model called `name`, registered with this shape on first use."""
        found = await self._lookup(agent_id, name)
        if found is None:
            model = EmbeddingModel(
                tenant=self._required_tenant, agent_id=agent_id, name=name, dim=dim, precision=precision
            )
            try:
                async with self._savepoint({"agent_id": agent_id, "name": name}):
                    self.session.add(model)
                    await self.session.flush()
            except ConflictError:  # registered meanwhile by another unit of work
                self.session.expunge(model)
                found = await self._lookup(agent_id, name)
                if found is None:
                    raise
            else:
                found = model
            self._models[(agent_id, name)] = found
        if check_dim:
            check_model_dim(name, found.dim, dim)
        return found

    # -- writing ------------------------------------------------------------

    async def add(
        self,
        agent_id: uuid.UUID | str,
        text: str,
        embedding: Sequence[float],
        *,
        embedding_model: str = "default",
        meta: Mapping[str, Any] | None = None,
    ) -> ArchivalPassage:
        """Store a passage and its embedding in one row."""
        [passage] = await self.add_many(
            agent_id,
            [{"text": text, "embedding": embedding, "embedding_model": embedding_model, "meta": meta}],
        )
        return passage

    async def add_many(
        self, agent_id: uuid.UUID | str, items: Iterable[PassageInput]
    ) -> builtins.list[ArchivalPassage]:
        """Store many passages in one bulk insert (COPY on Postgres); all or nothing.

        Items are dicts (`text`, `embedding`, optional `embedding_model`,
        `meta`, `id`, `created_at`) or `ArchivalPassage` objects.  An id
        names one passage of the tenant: one that a passage of any agent
        has raises `ConflictError` before anything is written.
        """
        key = as_uuid(agent_id, "agent_id")
        given = check_list(items, "items", "passages (dicts or ArchivalPassage objects)")
        rows = [check_item(item, index) for index, item in enumerate(given)]
        # Every check before any write: a rejected batch registers no model and
        # bumps no version, even if the caller carries on with the unit of work.
        shapes: dict[str, int] = {}
        for index, row in enumerate(rows):
            size = len(row["embedding"])
            dim = shapes.setdefault(row["embedding_model"], size)
            if dim != size:
                raise ValidationError(
                    f"items[{index}].embedding: {size}-d, but model {row['embedding_model']!r} "
                    f"is {dim}-d in this batch"
                )
        for name, dim in shapes.items():
            known = await self._lookup(key, name)
            if known is not None:
                check_model_dim(name, known.dim, dim)
            if known is not None and known.precision == "float16":
                check_half([row["embedding"] for row in rows if row["embedding_model"] == name])
        chosen = [row["id"] for item, row in zip(given, rows, strict=True) if chose_id(item)]
        await refuse_held(self.link, PASSAGES, self._required_tenant, chosen)
        await self._touch_agent(key)
        half: set[str] = set()  # the models that store half precision
        for name, dim in shapes.items():
            if (await self._model(key, name, dim)).precision == "float16":
                half.add(name)
        now = utcnow()
        shared = {"tenant": self._required_tenant, "agent_id": key, "updated_at": now}
        for row in rows:  # each checked row becomes its passage's fields (`hydrate`)
            row.update(shared)
            row["embedding_dim"] = len(row["embedding"])
            if row["created_at"] is None:
                row["created_at"] = now
            if half and row["embedding_model"] in half:
                row["embedding_half"], row["embedding"] = row["embedding"], None
        await insert_rows(self.link, PASSAGES, _COLUMNS, rows)
        return [hydrate(ArchivalPassage, row) for row in rows]

    async def update_text(
        self, passage_id: uuid.UUID | str, text: str, embedding: Sequence[float]
    ) -> ArchivalPassage:
        """Replace a passage's text and embedding together (same model, same dimension)."""
        key = as_uuid(passage_id, "passage_id")
        new_text = check_text(text, "text")
        vector = check_vector(embedding)
        current = await self.get(key)
        model = await self._model(current.agent_id, current.embedding_model, len(vector))
        half = model.precision == "float16"
        if half:
            check_half([vector])
        await self._touch_agent(current.agent_id)
        now = utcnow()
        await self._execute(
            sa.update(PASSAGES)
            .where(PASSAGES.c.id == key, *self._tenant_filter(PASSAGES))
            .values(
                text=new_text,
                search_words=new_text,
                embedding=None if half else vector,
                embedding_half=vector if half else None,
                updated_at=now,
            )
        )
        return await self.get(key)

    async def delete(self, passage_id: uuid.UUID | str) -> None:
        """Delete one passage."""
        key = as_uuid(passage_id, "passage_id")
        owner = await self._scalar(
            sa.select(PASSAGES.c.agent_id).where(PASSAGES.c.id == key, *self._tenant_filter(PASSAGES))
        )
        if owner is None:
            raise NotFoundError(f"no passage {key}")
        await self._touch_agent(owner)
        await self._execute(sa.delete(PASSAGES).where(PASSAGES.c.id == key, *self._tenant_filter(PASSAGES)))

    async def delete_where(self, agent_id: uuid.UUID | str, where: Filter) -> int:
        """Delete the agent's passages matching `where`, a [`Filter`][memorm.search.filters.Filter].

        Returns how many were deleted.
        """
        key = as_uuid(agent_id, "agent_id")
        conditions = await self._filters(where)
        if not conditions:
            raise ValidationError("where: give at least one condition (delete the agent to drop everything)")
        await self._touch_agent(key)
        return await self._rowcount(
            sa.delete(PASSAGES).where(*self._tenant_filter(PASSAGES), PASSAGES.c.agent_id == key, *conditions)
        )

    async def delete_many(self, agent_id: uuid.UUID | str, ids: Iterable[uuid.UUID | str]) -> int:
        """Delete these passages of the agent (others' and unknown ids are ignored); returns how many."""
        key = as_uuid(agent_id, "agent_id")
        wanted = [as_uuid(passage_id, "ids[]") for passage_id in check_list(ids, "ids", "passage ids")]
        await self._require_agent(key)
        mine = sa.and_(*self._tenant_filter(PASSAGES), PASSAGES.c.agent_id == key, PASSAGES.c.id.in_(wanted))
        if not wanted or await self._scalar(sa.select(PASSAGES.c.id).where(mine).limit(1)) is None:
            return 0  # unknown ids change nothing, so caches stay valid
        # The bump locks the agent before the delete, so concurrent writers of the
        # same passages queue here and then see each other's committed rows.
        await self._touch_agent(key)
        return await self._rowcount(sa.delete(PASSAGES).where(mine))

    async def delete_before(
        self, agent_id: uuid.UUID | str, cutoff: datetime, *, dry_run: bool = False
    ) -> int:
        """Delete the agent's passages created before `cutoff`; returns how many.

        With `dry_run`, counts them and deletes nothing.  For a long purge
        that commits as it goes, see [`memorm.retention.purge_older_than`][memorm.retention.purge_older_than].
        """
        key = as_uuid(agent_id, "agent_id")
        instant = check_aware(cutoff, "cutoff")
        check_flag(dry_run, "dry_run")
        await self._require_agent(key)
        if dry_run:
            return int(
                await self._scalar(
                    sa.select(sa.func.count()).where(_old(self._required_tenant, key, instant))
                )
            )
        deleted = 0
        while True:
            count = await self._delete_old_batch(key, instant, _OLD_BATCH)
            deleted += count
            if count < _OLD_BATCH:
                return deleted

    async def _delete_old_batch(self, key: uuid.UUID, instant: datetime, size: int) -> int:
        """Delete up to `size` of the agent's passages created before `instant`, oldest first."""
        doomed = list(
            (
                await self._execute(
                    sa.select(PASSAGES.c.id)
                    .where(_old(self._required_tenant, key, instant))
                    .order_by(PASSAGES.c.created_at)
                    .limit(size)
                )
            ).scalars()
        )
        if not doomed:
            return 0  # nothing changes, so caches stay valid
        await self._touch_agent(key)
        return await self._rowcount(
            sa.delete(PASSAGES).where(
                *self._tenant_filter(PASSAGES), PASSAGES.c.agent_id == key, PASSAGES.c.id.in_(doomed)
            )
        )

    async def _touch_agent(self, key: uuid.UUID) -> None:
        """Bump the agent's archive version (and check the agent exists)."""
        bumped = await self._rowcount(
            sa.update(AGENTS)
            .where(AGENTS.c.id == key, *self._tenant_filter(AGENTS))
            .values(archive_version=AGENTS.c.archive_version + 1)
        )
        if bumped == 0:
            raise NotFoundError(f"no agent {key}")
        self._archive_changed(key)

    async def ensure_index(
        self,
        embedding_model: str,
        dim: int,
        metric: str = "cosine",
        *,
        precision: str = "float32",
        m: int = 16,
        ef_construction: int = 64,
    ) -> str:
        """Build the HNSW index for (model, dim, metric) on Postgres, if missing; returns its name.

        One index serves every agent's passages of that model name and
        dimension (stored at `precision`); searches with that metric use it.
        A no-op on SQLite, which searches exactly.  Runs inside the unit of
        work, and `CREATE INDEX` blocks writes to the table while it builds:
        for a live table, use the migration pattern in the docs
        (`CREATE INDEX CONCURRENTLY`).  `m` (2 to 100) and `ef_construction`
        (4 to 1000, at least `2 * m`) are pgvector's build options; other
        values raise `ValidationError` on both engines.
        """
        check_shape(dim, precision)
        shape = EmbeddingModel(name=check_model_name(embedding_model), dim=dim, precision=precision)
        async with self._guard():
            return await ensure_index(
                self.link, shape, check_metric(metric), m=m, ef_construction=ef_construction
            )
