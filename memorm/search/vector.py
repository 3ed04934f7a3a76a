"""Nearest-neighbour search over archival passages: pgvector on Postgres, numpy on SQLite.

`nearest` returns `(passage, distance)` pairs, best first, ties broken
by id, for one agent's passages of one embedding model.  Distances are
the metric's own values, as pgvector defines them:

| metric          | distance                | score (higher better) |
|-----------------|-------------------------|-----------------------|
| `cosine`        | 1 - cosine similarity   | cosine similarity     |
| `l2`            | Euclidean distance      | 1 / (1 + distance)    |
| `inner_product` | minus the inner product | the inner product     |

* Postgres (`memorm.search.vector_pg`): one statement, `ORDER BY
  embedding::vector(d) <op> q LIMIT k` with every filter in the WHERE
  clause, returning the passages' columns with their distances.
  `ensure_index` (`memorm.search.vector_index`) builds a partial HNSW index
  per (model, dimension, metric); the query repeats the index's cast and
  model predicate (as a literal, so generic plans match it too), and
  pgvector's iterative scan keeps a filtered search returning `k` rows when
  `k` exist.  `hnsw.ef_search` and `hnsw.iterative_scan` are set once per
  connection (`CONNECTION_SETTINGS`, by `memorm.connections`); see `search_settings`.
* SQLite (`memorm.search.vector_scan`): exact search with numpy in a worker
  thread, over an in-process matrix per (agent, model) that is reloaded
  whenever the agent's `archive_version` (bumped by every passage write,
  from any connection or process) has moved.

This module is the entry point: `nearest` picks the engine's search, and
`ScoredPassage` and `score_of` turn its distances into hits.  The index's
and the cache's names a caller needs are importable from here too.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.sql import ColumnElement

from memorm.link import Link
from memorm.models import ArchivalPassage, EmbeddingModel
from memorm.search.vector_index import (
    CONNECTION_SETTINGS,
    METRICS,
    PROPAGATE,
    check_build_options,
    connection_setup,
    ensure_index,
    index_name,
    search_settings,
)
from memorm.search.vector_pg import pg_nearest
from memorm.search.vector_rows import current_model
from memorm.search.vector_scan import VectorCache, sqlite_nearest

__all__ = [
    "CONNECTION_SETTINGS",
    "METRICS",
    "PROPAGATE",
    "ScoredPassage",
    "VectorCache",
    "check_build_options",
    "connection_setup",
    "current_model",
    "ensure_index",
    "index_name",
    "nearest",
    "score_of",
    "search_settings",
]


@dataclass(frozen=True)
class ScoredPassage:
    """A search hit: the passage, its distance to the query and a score (higher is better)."""

    passage: ArchivalPassage
    distance: float | None
    score: float


def score_of(metric: str, distance: float) -> float:
    """The score for a distance: see the table in this module's docstring."""
    if metric == "cosine":
        return 1.0 - distance
    if metric == "l2":
        return 1.0 / (1.0 + distance)
    return -distance


async def nearest(
    link: Link,
    cache: VectorCache,
    tenant: str,
    agent_id: uuid.UUID,
    model: EmbeddingModel,
    query: list[float],
    *,
    metric: str,
    where: Sequence[ColumnElement[bool]],
    k: int,
    offset: int,
    ef_search: int | None = None,
) -> list[tuple[ArchivalPassage, float]]:
    """The `k` nearest passages (after `offset`), with their distances, best first.

    Only passages of `model`, and only while `model` is still this agent's
    (it may come from a cache): else none.
    """
    if not link.sqlite:
        return await pg_nearest(
            link,
            tenant,
            agent_id,
            model,
            query,
            metric=metric,
            where=where,
            k=k,
            offset=offset,
            ef_search=ef_search,
        )
    return await sqlite_nearest(
        link, cache, tenant, agent_id, model, query, metric=metric, where=where, k=k, offset=offset
    )
