"""The embedder `memorm mcp` embeds archival memory with, named by `--embedder`.

* `hashing` (the default) or `hashing:DIM`: `memorm.embeddings.HashingEmbedder`,
  a word-hashing stand-in that runs offline.  It finds passages that share the
  query's words; it is not a semantic model (no synonyms, no paraphrase).
* `module:attribute`: your own `memorm.embeddings.Embedder` (an object with
  `model`, `dim` and `async embed(texts)`), or a callable taking no arguments
  that returns one, imported from your code.

Passages are stored under the embedder's `model` name, and searched under it:
a server started with another embedder does not compare its vectors with them.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

import anyio.to_thread

from memorm.embeddings import Embedder, HashingEmbedder
from memorm.errors import ValidationError
from memorm.validation import check_list

__all__ = ["DEFAULT_EMBEDDER", "embed_one", "load_embedder"]

DEFAULT_EMBEDDER = "hashing"
"""`--embedder`'s default: `HashingEmbedder(dim=384)`, the offline stand-in."""


def load_embedder(spec: str = DEFAULT_EMBEDDER) -> Embedder:
    """The embedder `spec` names: `hashing`, `hashing:DIM` or `module:attribute`.

    Raises:
        ValidationError: a spec that names nothing importable, or not an embedder.
    """
    name, _, rest = spec.partition(":")
    if name == "hashing":
        if not rest:
            return HashingEmbedder()
        if not rest.isascii() or not rest.isdigit() or not 8 <= int(rest) <= 16_000:
            raise ValidationError(f"embedder {spec!r}: hashing:DIM takes a dimension from 8 to 16000")
        return HashingEmbedder(int(rest))
    if not name or not rest:
        raise ValidationError(f"embedder {spec!r}: expected `hashing`, `hashing:DIM` or `module:attribute`")
    try:
        found: object = importlib.import_module(name)
        for part in rest.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as error:
        raise ValidationError(f"embedder {spec!r}: cannot import it ({error})") from error
    if not isinstance(found, Embedder) and callable(found):
        found = found()
    if not isinstance(found, Embedder):
        raise ValidationError(
            f"embedder {spec!r}: {type(found).__name__} is not an embedder (needs model, dim, async embed)"
        )
    return found


async def embed_one(embedder: Embedder, text: str) -> list[float]:
    """The vector of `text`, off the event loop for the word-hashing stand-in (pure Python)."""
    if isinstance(embedder, HashingEmbedder):
        return await anyio.to_thread.run_sync(embedder.embed_one, text)
    vectors: Sequence[Sequence[float]] = check_list(await embedder.embed([text]), "embedder", "vectors")
    if len(vectors) != 1:
        raise ValidationError(f"embedder {embedder.model!r}: {len(vectors)} vectors for 1 text")
    return list(vectors[0])
