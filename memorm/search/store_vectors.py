"""Semantic search over the graph store's embeddings: pgvector on Postgres, numpy on SQLite.

`nearest_items` ranks the items that `where` keeps (a namespace prefix, value
filters, not expired) by the best score of any of their fields' embeddings,
as LangGraph's Postgres store does, and returns one page of `(namespace,
key, score)`, best first, ties broken by (namespace, key).  Scores are
LangGraph's:

| distance        | score                          |
|-----------------|--------------------------------|
| `cosine`        | cosine similarity (1 - distance) |
| `inner_product` | the inner product              |
| `l2`            | minus the Euclidean distance   |

* Postgres: one statement: for each item kept, the best of
  `embedding::vector(dims) <op> :query` over its vectors (found by the
  item's key), ordered, limited and offset in SQL.  Exact: the store's
  vectors have no ANN index.
* SQLite: the candidate vectors are read `BATCH` rows at a time in key
  order and scored with numpy (in a worker thread when the matrix is
  large); only the best `limit + offset` items are kept between batches.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio.to_thread
import sqlalchemy as sa
from pgvector.sqlalchemy import VECTOR
from sqlalchemy.sql import ColumnElement

from memorm.models import STORE_ITEMS, STORE_VECTORS
from memorm.types import VectorType
from memorm.validation import INT64_MAX

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from memorm.link import Link

__all__ = ["BATCH", "DISTANCES", "nearest_items", "scored_count", "unscored"]

DISTANCES = ("cosine", "inner_product", "l2")
BATCH = 2_000  # vectors read (and scored) at a time on SQLite
_OPERATORS = {"cosine": "<=>", "inner_product": "<#>", "l2": "<->"}
_THREAD_ABOVE = 200_000  # matrix cells; smaller batches are scored inline

Hit = tuple[str, str, float]
"""An item found: its namespace, key and score."""

_V, _I = STORE_VECTORS, STORE_ITEMS
_OF_ITEM = sa.and_(
    _V.c.tenant == _I.c.tenant,
    _V.c.agent_id == _I.c.agent_id,
    _V.c.namespace == _I.c.namespace,
    _V.c.key == _I.c.key,
)


def _sized(link: Link, dims: int) -> ColumnElement[bool]:
    """A vector of `dims` dimensions (others, from another index config, are never compared)."""
    if link.sqlite:
        return sa.func.length(_V.c.embedding) == dims * 4
    return sa.func.vector_dims(_V.c.embedding) == dims


def unscored(link: Link, dims: int) -> ColumnElement[bool]:
    """The item (a row of `STORE_ITEMS`) has no embedding a search of `dims` dimensions scores."""
    return ~sa.exists().where(_OF_ITEM, _sized(link, dims))


async def scored_count(link: Link, where: Sequence[ColumnElement[bool]], dims: int) -> int:
    """How many of the items `where` keeps have an embedding of `dims` dimensions."""
    query = sa.select(sa.func.count()).select_from(_I).where(*where, ~unscored(link, dims))
    return int((await link.execute(query)).scalar() or 0)


def _score(distance: str, value: float) -> float:
    if distance == "cosine":
        return 1.0 - value
    return -value


async def nearest_items(
    link: Link,
    where: Sequence[ColumnElement[bool]],
    query: list[float],
    *,
    distance: str,
    limit: int,
    offset: int,
) -> list[Hit]:
    """The page `offset:offset+limit` of the items `where` keeps, by their best field's score.

    `where` holds conditions on `STORE_ITEMS` (the tenant and agent first);
    only vectors of `len(query)` dimensions are compared.
    """
    if link.sqlite:
        return await _sqlite_nearest(link, where, query, distance=distance, limit=limit, offset=offset)
    dims = len(query)
    column = sa.cast(_V.c.embedding, VECTOR(dims))
    target = sa.cast(sa.bindparam("query", query, type_=VectorType()), VECTOR(dims))
    measured = column.op(_OPERATORS[distance], return_type=sa.Float)(target)
    # Per item kept, its best field: a lateral subquery on the item's own key, so each
    # item's vectors are found by the primary key whatever the planner thinks of the
    # tables' sizes (a join planned on a fresh table's statistics compared every pair).
    best = (
        sa.select(sa.func.min(measured).label("distance")).where(_OF_ITEM, _sized(link, dims)).lateral("best")
    )
    ranked = (
        sa.select(_I.c.namespace, _I.c.key, best.c.distance)
        .select_from(_I.join(best, sa.true()))
        .where(*where, best.c.distance.is_not(None))
        .order_by(best.c.distance, _I.c.namespace, _I.c.key)
        .limit(limit)
        .offset(offset)
    )
    rows: list[Any] = [tuple(row) for row in await link.execute(ranked)]
    return [(row[0], row[1], _score(distance, float(row[2]))) for row in rows]


async def _sqlite_nearest(
    link: Link,
    where: Sequence[ColumnElement[bool]],
    query: list[float],
    *,
    distance: str,
    limit: int,
    offset: int,
) -> list[Hit]:
    import numpy as np

    want = min(limit + offset, INT64_MAX)
    target = np.asarray(query, dtype=np.float32)
    dims = len(query)
    # Heap of the best `want` items so far: (score, inverted key) so the worst is popped first.
    kept: list[tuple[float, _Inverted]] = []
    after: tuple[str, str, str] | None = None
    pending: tuple[str, str, float] | None = None  # an item whose fields may go on in the next batch
    while True:
        statement = (
            sa.select(_V.c.namespace, _V.c.key, _V.c.field, sa.type_coerce(_V.c.embedding, sa.LargeBinary))
            .join(_I, _OF_ITEM)
            .where(*where, _sized(link, dims))
            .order_by(_V.c.namespace, _V.c.key, _V.c.field)
            .limit(BATCH)
        )
        if after is not None:
            statement = statement.where(sa.tuple_(_V.c.namespace, _V.c.key, _V.c.field) > sa.tuple_(*after))
        rows: list[Any] = [tuple(row) for row in await link.execute(statement)]
        if not rows:
            break
        after = (rows[-1][0], rows[-1][1], rows[-1][2])
        # Packed little-endian float32 (memorm.types.VectorType): read without unpacking into lists.
        vectors = np.frombuffer(b"".join(bytes(row[3]) for row in rows), dtype="<f4").reshape(len(rows), dims)
        if vectors.size > _THREAD_ABOVE:
            scores = await anyio.to_thread.run_sync(_scores, vectors, target, distance)
        else:
            scores = _scores(vectors, target, distance)
        for row, score in zip(rows, scores.tolist(), strict=True):
            item = (row[0], row[1])
            if pending is not None and pending[:2] == item:
                pending = (row[0], row[1], max(pending[2], score))
                continue
            if pending is not None:
                _keep(kept, pending, want)
            pending = (row[0], row[1], score)
        if len(rows) < BATCH:
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


def _keep(kept: list[tuple[float, _Inverted]], hit: tuple[str, str, float], want: int) -> None:
    entry = (hit[2], _Inverted((hit[0], hit[1])))
    if len(kept) < want:
        heapq.heappush(kept, entry)
    elif entry > kept[0]:
        heapq.heapreplace(kept, entry)


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
