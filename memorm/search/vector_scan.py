"""Nearest-neighbour search over archival passages on SQLite: an exact numpy scan over a cached matrix.

The scan runs in a worker thread when the matrix is large, over an
in-process matrix per (agent, model) (`VectorCache`) that is reloaded
whenever the agent's `archive_version` (bumped by every passage write, from
any connection or process) has moved.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import sqlalchemy as sa
from sqlalchemy.sql import ColumnElement

from memorm.concurrency import CrossLoopLock
from memorm.driver import fetch
from memorm.errors import NotFoundError
from memorm.link import Link
from memorm.models import AGENTS, PASSAGES, ArchivalPassage, EmbeddingModel
from memorm.search.model_cache import ModelCache
from memorm.search.vector_rows import PASSAGE_FIELDS, current_model, model_params, passage_of_row

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

__all__ = ["VectorCache", "sqlite_nearest"]

_THREAD_ABOVE = 200_000  # matrix cells; smaller searches run inline (a thread hop costs ~0.1 ms)

# SQLite's exact search: the agent's archive version, with whether the (perhaps cached)
# model is still the agent's; then the passages of the nearest ids (a JSON array: one
# statement, compiled once, whatever the count).
_ARCHIVE_STATE = sa.select(
    AGENTS.c.archive_version, current_model(sa.bindparam("tenant"), sa.bindparam("agent"))
).where(AGENTS.c.tenant == sa.bindparam("tenant"), AGENTS.c.id == sa.bindparam("agent"))
_PASSAGES_BY_ID = sa.select(*PASSAGE_FIELDS).where(
    PASSAGES.c.tenant == sa.bindparam("tenant"),
    PASSAGES.c.agent_id == sa.bindparam("agent"),
    PASSAGES.c.id.in_(
        sa.select(sa.literal_column("value")).select_from(
            sa.func.json_each(sa.bindparam("ids", type_=sa.Text))
        )
    ),
)


@dataclass
class _Matrix:
    version: int
    ids: list[uuid.UUID]
    vectors: NDArray[np.float32]
    norms: NDArray[np.float32]
    position: dict[uuid.UUID, int]


class VectorCache:
    """In-process matrices of agents' embeddings (SQLite), least recently used first out.

    Beside them, `models`: agents' embedding models (both engines), so a
    search need not look its model up (`memorm.search.model_cache`).
    """

    def __init__(self, max_entries: int = 64) -> None:
        self.max_entries = max_entries
        self.models = ModelCache()
        self._entries: OrderedDict[tuple[str, uuid.UUID, uuid.UUID], _Matrix] = (
            OrderedDict()
        )  # tenant, agent, model id
        # Units of work of any event loop and thread share the cache: the dict
        # sits behind a thread lock, and loads queue on a lock that works across loops.
        self._mutex = threading.Lock()
        self._loading = CrossLoopLock("the loading of archival vectors")

    def clear(self) -> None:
        """Forget every matrix and model."""
        with self._mutex:
            self._entries.clear()
        self.models.clear()

    def evict(self, agents: Iterable[tuple[str, uuid.UUID]]) -> None:
        """Drop these `(tenant, agent id)`s' matrices (their archives changed, or they are gone)."""
        doomed = set(agents)
        with self._mutex:
            for key in [key for key in self._entries if key[:2] in doomed]:
                del self._entries[key]

    def evict_tenant(self, tenant: str) -> None:
        """Drop every matrix and model of the tenant's agents."""
        with self._mutex:
            for key in [key for key in self._entries if key[0] == tenant]:
                del self._entries[key]
        self.models.evict_tenant(tenant)

    async def matrix(
        self, link: Link, tenant: str, agent_id: uuid.UUID, model: EmbeddingModel
    ) -> _Matrix | None:
        """The agent's vectors for `model`, reloaded if the archive changed since they were read.

        None if `model` is no longer the agent's (a stale cached model).
        """
        found = await fetch(link, _ARCHIVE_STATE, model_params(tenant, agent_id, model))
        if not found:
            raise NotFoundError(f"no agent {agent_id}")
        version, current = found[0]
        if not current:
            return None
        if (tenant, agent_id) in link.state.archive_writes:
            # This unit of work changed the archive: its rows are not committed
            # and may roll back, so they must not outlive it in the cache.
            return await _load_matrix(link, tenant, agent_id, model, version)
        key = (tenant, agent_id, model.id)
        async with self._loading:
            entry = self._entries.get(key)
            if entry is None or entry.version != version:
                entry = await _load_matrix(link, tenant, agent_id, model, version)
            with self._mutex:
                self._entries[key] = entry
                self._entries.move_to_end(key)
                while len(self._entries) > self.max_entries:
                    self._entries.popitem(last=False)
        return entry


async def _load_matrix(
    link: Link, tenant: str, agent_id: uuid.UUID, model: EmbeddingModel, version: int
) -> _Matrix:
    import numpy as np  # here, not at the top: `from memorm import Database` need not load it

    half = model.precision == "float16"
    column = PASSAGES.c.embedding_half if half else PASSAGES.c.embedding
    raw = sa.type_coerce(column, sa.LargeBinary())  # the stored bytes, undecoded
    # No ORDER BY: hits are ranked by (distance, id) afterwards, and sorting
    # 100,000 rows of vectors cost SQLite a 150 MB temporary b-tree.
    rows = await link.execute(
        sa.select(PASSAGES.c.id, raw).where(
            PASSAGES.c.tenant == tenant,
            PASSAGES.c.agent_id == agent_id,
            PASSAGES.c.embedding_model == model.name,
            PASSAGES.c.embedding_dim == model.dim,
        )
    )
    ids: list[uuid.UUID] = []
    blobs: list[bytes] = []
    for row in rows:
        passage_id, blob = tuple(row)
        ids.append(passage_id)
        blobs.append(blob)
    dtype = "<f2" if half else "<f4"
    vectors = (
        np.frombuffer(b"".join(blobs), dtype=dtype)
        .astype(np.float32, copy=False)
        .reshape(len(ids), model.dim)
    )
    norms = np.sqrt(np.einsum("ij,ij->i", vectors, vectors)).astype(np.float32, copy=False)
    return _Matrix(version, ids, vectors, norms, {passage_id: i for i, passage_id in enumerate(ids)})


def _metric_distances(
    vectors: NDArray[Any], norms: NDArray[Any], query: NDArray[Any], metric: str
) -> NDArray[Any]:
    """Each row's distance to `query`, in the arrays' precision (NaN for a zero-norm cosine)."""
    import numpy as np

    dots = vectors @ query
    if metric == "cosine":
        with np.errstate(divide="ignore", invalid="ignore"):
            result: NDArray[Any] = 1.0 - dots / (norms * np.linalg.norm(query))
        return result
    if metric == "l2":
        squared: NDArray[Any] = norms * norms - 2 * dots + query @ query
        distances: NDArray[Any] = np.sqrt(np.maximum(squared, 0.0))
        return distances
    negated: NDArray[Any] = -dots
    return negated


def _distances(
    matrix: _Matrix, rows: NDArray[np.intp] | None, query: NDArray[np.float64], metric: str, want: int
) -> list[tuple[int, float]]:
    """Row positions and distances of the `want` nearest rows.

    A float32 pass over the whole matrix picks candidates (with a margin, so
    rounding cannot drop a true neighbour); float64 then gives their exact
    distances.
    """
    import numpy as np

    vectors = matrix.vectors if rows is None else matrix.vectors[rows]
    norms = matrix.norms if rows is None else matrix.norms[rows]
    positions = np.arange(len(matrix.ids)) if rows is None else rows
    if len(vectors) == 0:
        return []
    screen = np.nan_to_num(_metric_distances(vectors, norms, query.astype(np.float32), metric), nan=np.inf)
    keep = min(len(screen), want + max(16, want))
    if keep < len(screen):
        # Everything up to the keep-th distance, ties included: equal distances
        # are ordered by id afterwards, so none of them may be dropped here.
        threshold = np.partition(screen, keep - 1)[keep - 1]
        candidates = np.flatnonzero(screen <= threshold)
    else:
        candidates = np.arange(len(screen))
    exact = vectors[candidates].astype(np.float64)
    final = _metric_distances(exact, np.linalg.norm(exact, axis=1), query, metric)
    if metric == "l2":  # the expanded form loses digits; take the difference directly
        final = np.linalg.norm(exact - query, axis=1)
    return [(int(positions[c]), float(d)) for c, d in zip(candidates, final, strict=True)]


async def sqlite_nearest(
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
) -> list[tuple[ArchivalPassage, float]]:
    """The `k` nearest passages (after `offset`) and their distances, best first, ties by id.

    None at all while `model` is no longer the agent's (the cache checks it).
    """
    import numpy as np

    matrix = await cache.matrix(link, tenant, agent_id, model)
    if matrix is None:
        return []
    rows: NDArray[np.intp] | None = None
    if where:  # filters run in SQL; the matrix is narrowed to the rows that pass
        allowed = (
            await link.execute(
                sa.select(PASSAGES.c.id).where(
                    PASSAGES.c.tenant == tenant,
                    PASSAGES.c.agent_id == agent_id,
                    PASSAGES.c.embedding_model == model.name,
                    *where,
                )
            )
        ).scalars()
        rows = np.array(sorted(matrix.position[i] for i in allowed if i in matrix.position), dtype=np.intp)
    vector = np.asarray(query, dtype=np.float64)
    want = k + offset
    cells = (len(matrix.ids) if rows is None else len(rows)) * model.dim
    if cells > _THREAD_ABOVE:  # large matrices: keep the event loop free
        found = await anyio.to_thread.run_sync(_distances, matrix, rows, vector, metric, want)
    else:
        found = _distances(matrix, rows, vector, metric, want)
    ranked = sorted(
        ((distance, matrix.ids[position]) for position, distance in found),
        key=lambda pair: (np.isnan(pair[0]), pair[0], pair[1]),
    )[offset:want]
    if not ranked:
        return []
    wanted_ids = json.dumps([passage_id.hex for _, passage_id in ranked])  # ids as SQLite stores them
    loaded = await fetch(link, _PASSAGES_BY_ID, {"tenant": tenant, "agent": agent_id, "ids": wanted_ids})
    passages = {passage.id: passage for passage in map(passage_of_row, loaded)}
    return [(passages[passage_id], distance) for distance, passage_id in ranked if passage_id in passages]
