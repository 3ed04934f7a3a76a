"""Embedders: text -> vectors, for the layers that embed on the caller's behalf.

Anything with `model`, `dim` and `async embed(texts)` is an
[`Embedder`][memorm.embeddings.Embedder] — wrap OpenAI, sentence-transformers or your own service.
[`HashingEmbedder`][memorm.embeddings.HashingEmbedder] needs nothing: it is deterministic and offline, for
tests, demos and keyword-ish similarity.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

__all__ = ["Embedder", "HashingEmbedder"]


@runtime_checkable
class Embedder(Protocol):
    """Embeds batches of text with one model of fixed dimension."""

    model: str
    dim: int

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector of `dim` floats per text, in order."""
        ...


_TOKEN = re.compile(r"[^\W_]+")


class HashingEmbedder:
    """Feature hashing of words (and word pairs) into `dim` buckets, L2-normalised.

    Texts sharing words get similar vectors, so cosine search finds passages
    that use the query's words; it knows nothing of synonyms.  Deterministic
    across processes and machines (BLAKE2b, not Python's salted `hash`).

    Example:
        ```python
        embedder = HashingEmbedder(dim=384)
        [vector] = await embedder.embed(["the cat sat"])
        ```
    """

    def __init__(self, dim: int = 384, *, model: str | None = None) -> None:
        if dim < 8:
            raise ValueError("dim must be at least 8")
        self.dim = dim
        self.model = model or f"hashing-{dim}"

    def embed_one(self, text: str) -> list[float]:
        """The vector of one text (synchronous)."""
        vector = [0.0] * self.dim
        words = _TOKEN.findall(text.lower())
        features = words + [f"{a} {b}" for a, b in itertools.pairwise(words)]
        for feature in features:
            digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
            bucket = int.from_bytes(digest[:4], "little") % self.dim
            vector[bucket] += 1.0 if digest[4] & 1 else -1.0
        norm = math.sqrt(sum(x * x for x in vector))
        if not norm:  # no words: a fixed unit vector, so cosine stays defined
            vector[0] = 1.0
            return vector
        return [x / norm for x in vector]

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Vectors of `texts`."""
        return [self.embed_one(text) for text in texts]
