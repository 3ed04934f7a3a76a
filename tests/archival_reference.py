"""A float64 numpy reference for archival vector search, shared by the archival test modules.

Not a test module: imported by name (``from archival_reference import ...``), as
the tests import ``conftest``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from memorm import ScoredPassage

__all__ = ["assert_matches", "reference", "scaled_vectors"]


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
