"""A float64 numpy reference for archival vector search, shared by the archival test modules.

Not a test module: imported by name (``from archival_reference import ...``), as
the tests import ``conftest``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from memorm import Agent, Database, ScoredPassage

__all__ = ["assert_matches", "new_agent", "reference", "scaled_vectors", "store_vectors"]


def scaled_vectors(seed: int, n: int, dim: int, dtype: Any = np.float32) -> np.ndarray:
    """Normal vectors of norm ~1, rounded to ``dtype`` (as the store keeps them), widened to float64."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, dim)) / np.sqrt(dim)).astype(dtype).astype(np.float64)


def distances(vectors: np.ndarray, query: np.ndarray, metric: str) -> np.ndarray:
    """Each row's distance to ``query``, as pgvector defines the metric."""
    vectors, query = np.asarray(vectors, dtype=np.float64), np.asarray(query, dtype=np.float64)
    if metric == "cosine":
        return 1.0 - vectors @ query / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(query))
    if metric == "l2":
        return np.linalg.norm(vectors - query, axis=1)
    return -(vectors @ query)


def reference(
    vectors: np.ndarray, ids: Sequence[uuid.UUID], query: np.ndarray, metric: str, k: int
) -> list[tuple[uuid.UUID, float]]:
    """The ``k`` nearest (id, distance) pairs, ties broken by id, as search promises."""
    found = distances(vectors, query, metric)
    return sorted(zip(ids, found.tolist(), strict=True), key=lambda pair: (pair[1], pair[0]))[:k]


def assert_matches(hits: list[ScoredPassage], expected: list[tuple[uuid.UUID, float]]) -> None:
    """Same ids in the same order, distances within 1e-5 (the server computes in float32)."""
    assert [hit.passage.id for hit in hits] == [passage_id for passage_id, _ in expected]
    got = np.array([hit.distance for hit in hits], dtype=np.float64)
    np.testing.assert_allclose(got, [distance for _, distance in expected], rtol=0, atol=1e-5)


async def new_agent(db: Database, name: str = "sam") -> Agent:
    """A committed agent."""
    async with db.unit_of_work() as uow:
        return await uow.agents.create(name)


async def store_vectors(db: Database, agent: Agent, vectors: np.ndarray, **item: Any) -> list[uuid.UUID]:
    """Passages ``p0``, ``p1``… with these embeddings (and ``item``'s fields); their ids in order."""
    async with db.unit_of_work() as uow:
        added = await uow.passages.add_many(
            agent.id, [{"text": f"p{i}", "embedding": v, **item} for i, v in enumerate(vectors)]
        )
    return [passage.id for passage in added]
