"""The graph store's exact search on SQLite: its vectors read in batches and scored with numpy.

The candidate vectors are read `batch` rows at a time in key order and
scored with numpy (in a worker thread when the matrix is large); only the
best `limit + offset` items are kept between batches.  An item's score is
its best field's, as on Postgres (`memorm.search.store_vectors`).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import anyio.to_thread
import sqlalchemy as sa
from sqlalchemy.sql import ColumnElement

from memorm.driver import fetch
from memorm.link import Link
from memorm.models import STORE_ITEMS, STORE_VECTORS
from memorm.search.store_shapes import OF_ITEM, sized_sqlite
from memorm.validation import INT64_MAX

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

__all__ = ["Hit", "scan_nearest"]

_THREAD_ABOVE = 200_000  # matrix cells; smaller batches are scored inline

Hit = tuple[str, str, float]
"""An item found by its vectors: its namespace, key and score."""

_V, _I = STORE_VECTORS, STORE_ITEMS


@lru_cache(maxsize=64)
def _batches(
    where: tuple[ColumnElement[bool], ...], scope: tuple[ColumnElement[bool], ...], dims: int
) -> tuple[sa.Select[Any], sa.Select[Any]]:
    """SQLite: the first `:batch` vectors the search compares, in key order, and those after `:after_*`."""
    first = (
        sa.select(_V.c.namespace, _V.c.key, _V.c.field, sa.type_coerce(_V.c.embedding, sa.LargeBinary))
        .join(_I, OF_ITEM)
        .where(*where, *scope, sized_sqlite(dims))
        .order_by(_V.c.namespace, _V.c.key, _V.c.field)
        .limit(sa.bindparam("batch", type_=sa.Integer))
    )
    after = sa.tuple_(
        sa.bindparam("after_namespace", type_=sa.String),
        sa.bindparam("after_key", type_=sa.String),
        sa.bindparam("after_field", type_=sa.String),
    )
    return first, first.where(sa.tuple_(_V.c.namespace, _V.c.key, _V.c.field) > after)


async def scan_nearest(
    link: Link,
    where: tuple[ColumnElement[bool], ...],
    scope: tuple[ColumnElement[bool], ...],
    query: list[float],
    values: dict[str, Any],
    *,
    distance: str,
    limit: int,
    offset: int,
    batch: int,
) -> list[Hit]:
    """The page `offset:offset+limit` of the items `where` keeps, best score first: SQLite.

    `where`, `scope` and `values` as `memorm.search.store_vectors.nearest_items`
    takes them; `batch`: vectors read (and scored) at a time.
    """
    import numpy as np

    want = min(limit + offset, INT64_MAX)
    target = np.asarray(query, dtype=np.float32)
    dims = len(query)
    first, following = _batches(where, scope, dims)
    values = {**values, "batch": batch}
    # Heap of the best `want` items so far: (score, inverted key) so the worst is popped first.
    kept: list[tuple[float, _Inverted]] = []
    pending: tuple[tuple[str, str], float] | None = None  # an item whose fields may go on in the next batch
    statement = first
    while True:
        rows = await fetch(link, statement, values)
        if not rows:
            break
        last = rows[-1]
        values.update(after_namespace=last[0], after_key=last[1], after_field=last[2])
        statement = following
        # Packed little-endian float32 (memorm.types.VectorType): read without unpacking into lists.
        vectors = np.frombuffer(b"".join([row[3] for row in rows]), dtype="<f4").reshape(len(rows), dims)
        if vectors.size > _THREAD_ABOVE:
            scores = await anyio.to_thread.run_sync(_scores, vectors, target, distance)
        else:
            scores = _scores(vectors, target, distance)
        # Rows come in key order, so an item's fields are neighbours: each item's best score.
        keys = [(row[0], row[1]) for row in rows]
        starts = [0, *(i for i in range(1, len(keys)) if keys[i] != keys[i - 1])]
        items = [keys[i] for i in starts]
        best: list[float] = np.maximum.reduceat(scores, starts).tolist()
        if pending is not None:
            if items[0] == pending[0]:
                best[0] = max(best[0], pending[1])
            else:
                _keep(kept, pending, want)
        pending = (items[-1], best[-1])  # the batch's last item may have more fields in the next
        _keep_best(kept, items[:-1], best[:-1], want)
        if len(rows) < batch:
            break
    if pending is not None:
        _keep(kept, pending, want)
    ordered = sorted(((score, key.value) for score, key in kept), key=lambda hit: (-hit[0], hit[1]))
    return [(key[0], key[1], score) for score, key in ordered[offset : offset + limit]]


class _Inverted:
    """A (namespace, key) that orders backwards: on a tie of scores the larger key is dropped first."""

    __slots__ = ("value",)

    def __init__(self, value: tuple[str, str]) -> None:
        self.value = value

    def __lt__(self, other: _Inverted) -> bool:
        return self.value > other.value


def _keep(kept: list[tuple[float, _Inverted]], hit: tuple[tuple[str, str], float], want: int) -> None:
    entry = (hit[1], _Inverted(hit[0]))
    if len(kept) < want:
        heapq.heappush(kept, entry)
    elif entry > kept[0]:
        heapq.heapreplace(kept, entry)


def _keep_best(
    kept: list[tuple[float, _Inverted]], items: list[tuple[str, str]], scores: list[float], want: int
) -> None:
    """`_keep` each item that can enter the heap: none scoring below the `want`-th best of these."""
    chosen: Iterable[int] = range(len(items))
    if len(items) > want:
        floor = heapq.nlargest(want, scores)[-1]
        if len(kept) >= want:
            floor = max(floor, kept[0][0])
        chosen = [i for i, score in enumerate(scores) if score >= floor]
    for i in chosen:
        _keep(kept, (items[i], scores[i]), want)


def _scores(vectors: NDArray[np.float32], query: NDArray[np.float32], distance: str) -> NDArray[np.float64]:
    import numpy as np

    vectors = vectors.astype(np.float32, copy=False)
    products = (vectors @ query).astype(np.float64)
    if distance == "inner_product":
        return products
    if distance == "l2":
        gaps: NDArray[np.float64] = np.linalg.norm(
            vectors.astype(np.float64) - query.astype(np.float64), axis=1
        )
        return -gaps
    norms = np.linalg.norm(vectors, axis=1).astype(np.float64) * float(np.linalg.norm(query))
    with np.errstate(divide="ignore", invalid="ignore"):
        similarity: NDArray[np.float64] = np.where(norms > 0, products / norms, 0.0)
    return similarity
