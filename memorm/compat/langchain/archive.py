"""The vector store's units of work on an agent's archival passages.

Each function takes the store's `Database` (a tenant view scopes the work
to its tenant): async methods await them on the caller's loop, sync ones on
the sync bridge's loop.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from langchain_core.documents import Document

from memorm.compat.langchain.documents import to_document
from memorm.db import Database
from memorm.errors import ConflictError, NotFoundError, ValidationError
from memorm.search.vector import ScoredPassage
from memorm.validation import check_list

__all__ = ["UPSERT_ATTEMPTS", "delete", "get", "search", "upsert"]

UPSERT_ATTEMPTS = 3


async def upsert(
    db: Database,
    agent_id: uuid.UUID,
    items: list[dict[str, Any]],
    vectors: list[list[float]],
    existing: set[uuid.UUID],
) -> None:
    """Store the items with their vectors, replacing this agent's passages under `existing` ids."""
    vectors = check_list(vectors, "embeddings", "vectors")
    if len(vectors) != len(items):  # the embeddings' answer, not the caller's input
        raise ValidationError(f"embeddings: {len(vectors)} vectors for {len(items)} texts")
    # The last item of an id wins, as if they had been added one after another.
    latest = {item["id"]: {**item, "embedding": vector} for item, vector in zip(items, vectors, strict=True)}
    for attempt in range(UPSERT_ATTEMPTS):
        try:
            async with db.unit_of_work() as uow:
                # Sorted: concurrent upserts of overlapping ids lock their rows in one order.
                await uow.passages.delete_many(agent_id, sorted(existing))
                await uow.passages.add_many(agent_id, list(latest.values()))
            return
        except ConflictError:
            # A concurrent add of the same id committed after our delete: replace
            # it on the next attempt.  (A passage id names one passage of the
            # tenant: another agent's under the id stays, and the last attempt
            # raises the conflict.)
            if attempt == UPSERT_ATTEMPTS - 1:
                raise


async def delete(db: Database, agent_id: uuid.UUID, ids: list[uuid.UUID]) -> None:
    """Delete this agent's passages with these ids; unknown ids and other agents' are skipped."""
    try:
        async with db.unit_of_work() as uow:
            await uow.passages.delete_many(agent_id, ids)
    except NotFoundError:
        pass  # the agent is gone, and its passages with it: nothing left to delete


async def get(db: Database, agent_id: uuid.UUID, ids: list[uuid.UUID]) -> list[Document]:
    """This agent's documents with these ids, in the order given; others are skipped."""
    async with db.unit_of_work(read_only=True) as uow:
        found = await uow.passages.get_many(ids, agent_id=agent_id)
    return [to_document(passage) for passage in found]


async def search(
    db: Database,
    agent_id: uuid.UUID,
    vector: Sequence[float],
    k: int,
    *,
    embedding_model: str,
    metric: str,
    where: dict[str, Any] | None,
) -> list[ScoredPassage]:
    """The `k` passages of `embedding_model` nearest `vector`, best first."""
    async with db.unit_of_work(read_only=True) as uow:
        return await uow.passages.search(
            agent_id, vector, k=k, embedding_model=embedding_model, metric=metric, where=where
        )
