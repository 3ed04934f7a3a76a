"""The archival benchmark's data: clustered unit embeddings with short texts, and recall's truth.

:mod:`benchmarks.archival` describes the corpus; :func:`make_corpus` builds
it, seeded, and :func:`exact_top` is the ground truth searches are scored on.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.raw.passages import K

NAME = "archival"

DIM = 384
BATCH = 10_000
CLUSTERS = 300
SPECTRUM = 0.5  # per-axis noise scale i ** -SPECTRUM within a cluster
SEED = 384
_VOCABULARY = (  # of the passages' short texts
    "meeting flight hotel budget invoice recipe garden python deploy outage birthday doctor contract lease "
    "tax refund train museum concert dentist laptop password backup review launch roadmap hiring salary"
)


@dataclass
class Size:
    passages: int
    queries: int
    cold_reps: int


FULL = Size(passages=100_000, queries=100, cold_reps=5)
QUICK = Size(passages=20_000, queries=30, cold_reps=2)


@dataclass
class Corpus:
    """Unit float32 embeddings (``vectors``), their texts, and query vectors."""

    vectors: np.ndarray
    texts: list[str]
    queries: np.ndarray

    def items(self, start: int, stop: int) -> list[dict[str, Any]]:
        """Passages ``start:stop`` as ``add_many`` items; embeddings are lists of floats."""
        vectors = self.vectors[start:stop].tolist()
        return [
            {"text": text, "embedding": vector}
            for text, vector in zip(self.texts[start:stop], vectors, strict=True)
        ]

    def query(self, index: int) -> list[float]:
        return self.queries[index].tolist()  # type: ignore[no-any-return]


def unit(matrix: np.ndarray) -> np.ndarray:
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix


def make_corpus(count: int, queries: int, *, seed: int = SEED) -> Corpus:
    """``count`` clustered unit vectors with short texts, and ``queries`` vectors near cluster centres."""
    rng = np.random.default_rng(seed)
    centres = unit(rng.standard_normal((CLUSTERS, DIM), dtype=np.float32))
    weights = rng.lognormal(0.0, 0.7, CLUSTERS)
    weights /= weights.sum()
    spectrum = np.arange(1, DIM + 1, dtype=np.float32) ** -SPECTRUM
    spectrum /= np.linalg.norm(spectrum)  # a cluster's noise has norm ~ its spread
    spread = rng.uniform(0.6, 1.1, CLUSTERS).astype(np.float32)
    scales = np.stack([spectrum[rng.permutation(DIM)] for _ in range(CLUSTERS)]) * spread[:, None]
    assign = rng.choice(CLUSTERS, count, p=weights)
    vectors = np.empty((count, DIM), dtype=np.float32)
    for start in range(0, count, BATCH):
        part = assign[start : start + BATCH]
        noise = rng.standard_normal((len(part), DIM), dtype=np.float32) * scales[part]
        vectors[start : start + BATCH] = unit(centres[part] + noise)
    near = rng.choice(CLUSTERS, queries, p=weights)
    query_vectors = unit(
        centres[near] + 0.5 * rng.standard_normal((queries, DIM), dtype=np.float32) * scales[near]
    )
    words, pick = _VOCABULARY.split(), random.Random(seed)
    texts = [
        f"note {index} on topic {topic}: " + " ".join(pick.choices(words, k=pick.randint(6, 16)))
        for index, topic in enumerate(assign.tolist())
    ]
    return Corpus(vectors, texts, query_vectors)


def exact_top(corpus: Corpus, query: np.ndarray, k: int = K) -> np.ndarray:
    """Row positions of the ``k`` nearest stored vectors by cosine, in float64 (the ground truth)."""
    scores = corpus.vectors.astype(np.float64) @ query.astype(np.float64)
    top = np.argpartition(-scores, k)[:k]
    return top[np.argsort(-scores[top])]  # type: ignore[no-any-return]


def recall(found: Sequence[Any], truth: Sequence[Any]) -> float:
    return len(set(found) & set(truth)) / len(truth)
