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
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import anyio.to_thread
import sqlalchemy as sa
from pgvector.sqlalchemy import VECTOR
from sqlalchemy.schema import CreateIndex
from sqlalchemy.sql import ColumnElement

from memorm.driver import fetch
from memorm.errors import ValidationError
from memorm.models import STORE_ITEMS, STORE_VECTORS
from memorm.routing import DISTRIBUTED
from memorm.search.vector import PROPAGATE, check_build_options, search_settings
from memorm.types import VectorType
from memorm.validation import INT64_MAX

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from memorm.link import Link

__all__ = [
    "BATCH",
    "DISTANCES",
    "Found",
    "check_index_shape",
    "ensure_store_index",
    "nearest_items",
    "scored_count",
    "store_index_exists",
    "store_index_name",
    "unscored",
]

DISTANCES = ("cosine", "inner_product", "l2")
BATCH = 2_000  # vectors read (and scored) at a time on SQLite
_OPERATORS = {"cosine": "<=>", "inner_product": "<#>", "l2": "<->"}
_THREAD_ABOVE = 200_000  # matrix cells; smaller batches are scored inline
_CANDIDATES = 4  # vectors an approximate search takes from the index per row of its page

Hit = tuple[str, str, float]
"""An item found by its vectors: its namespace, key and score."""
Found = tuple[tuple[Any, ...], float]
"""An item found: its row (the columns asked for) and its score."""

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
        return _sized_sqlite(dims)
    return _sized_postgres(dims)


def _sized_sqlite(dims: int) -> ColumnElement[bool]:
    """SQLite keeps a vector as packed float32 (`memorm.types.VectorType`): 4 bytes a dimension."""
    return sa.func.length(_V.c.embedding) == sa.literal_column(str(int(dims) * 4))


def _sized_postgres(dims: int) -> ColumnElement[bool]:
    return sa.func.vector_dims(_V.c.embedding) == dims


def unscored(link: Link, scope: Sequence[ColumnElement[bool]], dims: int) -> ColumnElement[bool]:
    """The item (a row of `STORE_ITEMS`) has no embedding a search of `dims` dimensions scores.

    `scope`: the vectors' own conditions (tenant, agent, namespace prefix),
    as values: Citus keeps a correlated subquery on one shard only when its
    table names the agent itself.
    """
    return ~sa.exists().where(_OF_ITEM, *scope, _sized(link, dims))


async def scored_count(
    link: Link,
    where: Sequence[ColumnElement[bool]],
    scope: Sequence[ColumnElement[bool]],
    dims: int,
    params: Mapping[str, Any],
) -> int:
    """How many of the items `where` keeps have an embedding of `dims` dimensions."""
    query = sa.select(sa.func.count()).select_from(_I).where(*where, ~unscored(link, scope, dims))
    return int((await link.execute(query, dict(params))).scalar() or 0)


def _score(distance: str, value: float) -> float:
    if distance == "cosine":
        return 1.0 - value
    return -value


async def nearest_items(
    link: Link,
    where: tuple[ColumnElement[bool], ...],
    scope: tuple[ColumnElement[bool], ...],
    columns: tuple[ColumnElement[Any], ...],
    query: list[float],
    params: Mapping[str, Any],
    *,
    distance: str,
    limit: int,
    offset: int,
    approximate: bool = False,
) -> list[Found]:
    """The page `offset:offset+limit` of the items `where` keeps, by their best field's score.

    `where` holds conditions on `STORE_ITEMS` (the tenant and agent first),
    `scope` the same on `STORE_VECTORS` (tenant, agent, namespace prefix),
    both with named parameters whose values are in `params` (built once per
    shape by the caller: the statements here are then built and compiled
    once too).  Each item found comes as its row of `columns` and its score;
    only vectors of `len(query)` dimensions are compared.  `approximate`, on
    Postgres: through the HNSW index `ensure_store_index` built, if there is
    one; a page the index's candidates do not fill (a selective filter, a
    small namespace) is searched again exactly.  SQLite always searches
    exactly.
    """
    values = {**params, "query": query, "limit": limit, "offset": offset}
    if link.sqlite:
        hits = await _sqlite_nearest(
            link, where, scope, query, values, distance=distance, limit=limit, offset=offset
        )
        return await _rows_of(link, where, columns, hits, values)
    dims = len(query)
    if approximate:
        if link.pooler:  # the iterative scan is not a setting of this server connection: send it
            await search_settings(link, None)
        values["want"] = min((limit + offset) * _CANDIDATES, INT64_MAX)
        found = await _found(
            link, _ranked(where, scope, columns, dims, distance, approximate=True), values, distance
        )
        if len(found) == limit:
            return found
    return await _found(
        link, _ranked(where, scope, columns, dims, distance, approximate=False), values, distance
    )


async def _found(link: Link, statement: sa.Select[Any], values: dict[str, Any], distance: str) -> list[Found]:
    rows = await fetch(link, statement, values)
    return [(row[:-1], _score(distance, float(row[-1]))) for row in rows]


@lru_cache(maxsize=64)
def _ranked(
    where: tuple[ColumnElement[bool], ...],
    scope: tuple[ColumnElement[bool], ...],
    columns: tuple[ColumnElement[Any], ...],
    dims: int,
    distance: str,
    *,
    approximate: bool,
) -> sa.Select[Any]:
    """The items' `columns` and best distance, nearest first, a page (`:limit`, `:offset`): Postgres.

    Exact: per item kept, its best field, by a lateral subquery on the
    item's own key, so each item's vectors are found by the primary key
    whatever the planner thinks of the tables' sizes (a join planned on a
    fresh table's statistics compared every pair).

    Approximate: the nearest vectors by the index, then their items, best
    field each.  The inner query is what an HNSW index answers: the
    vectors' own conditions, the dimension as a literal (the partial
    index's predicate), `:want` rows (`_CANDIDATES` times the page's: an
    item may have several fields, and the items' conditions drop some);
    pgvector's iterative scan (set on every connection) goes on until so
    many pass.
    """
    column = sa.cast(_V.c.embedding, VECTOR(dims))
    target = sa.cast(sa.bindparam("query", type_=VectorType()), VECTOR(dims))
    measured = column.op(_OPERATORS[distance], return_type=sa.Float)(target)
    page = (sa.bindparam("limit", type_=sa.Integer), sa.bindparam("offset", type_=sa.Integer))
    if approximate:
        near = (
            sa.select(_V.c.namespace, _V.c.key, measured.label("distance"))
            .where(*scope, _dims_literal(_V, dims))
            .order_by(measured)
            .limit(sa.bindparam("want", type_=sa.BigInteger))
            .subquery("near")
        )
        best: ColumnElement[Any] = sa.func.min(near.c.distance)
        return (
            sa.select(*columns, best.label("distance"))
            .select_from(near.join(_I, sa.and_(_I.c.namespace == near.c.namespace, _I.c.key == near.c.key)))
            .where(*where)
            .group_by(*_I.primary_key.columns)  # the item's other columns depend on its key
            .order_by(best, _I.c.namespace, _I.c.key)
            .limit(page[0])
            .offset(page[1])
        )
    nearest = (
        sa.select(sa.func.min(measured).label("distance"))
        .where(_OF_ITEM, *scope, _sized_postgres(dims))
        .lateral("best")
    )
    return (
        sa.select(*columns, nearest.c.distance)
        .select_from(_I.join(nearest, sa.true()))
        .where(*where, nearest.c.distance.is_not(None))
        .order_by(nearest.c.distance, _I.c.namespace, _I.c.key)
        .limit(page[0])
        .offset(page[1])
    )


async def _rows_of(
    link: Link,
    where: Sequence[ColumnElement[bool]],
    columns: Sequence[ColumnElement[Any]],
    hits: list[Hit],
    values: dict[str, Any],
) -> list[Found]:
    """The hits' rows of `columns` (those `where` still keeps), in the hits' order."""
    if not hits:
        return []
    pairs = [(namespace, key) for namespace, key, _ in hits]
    statement = sa.select(*columns).where(*where, sa.tuple_(_I.c.namespace, _I.c.key).in_(pairs))
    found: list[Any] = [tuple(row) for row in await link.execute(statement, values)]
    rows = {(row[0], row[1]): row for row in found}
    return [(rows[namespace, key], score) for namespace, key, score in hits if (namespace, key) in rows]


# -- the HNSW index (Postgres) ------------------------------------------------------------------

# Runtime indexes are built on a detached copy: one on memorm's table would join its metadata.
_DETACHED = STORE_VECTORS.to_metadata(sa.MetaData())
_OPS_CLASS = {"cosine": "vector_cosine_ops", "inner_product": "vector_ip_ops", "l2": "vector_l2_ops"}
_MAX_INDEXED_DIMS = 2_000  # pgvector's limit for an HNSW index on `vector`


def _dims_literal(table: sa.Table, dims: int) -> ColumnElement[bool]:
    """`vector_dims(embedding) = dims`, `dims` a literal: the partial index's predicate, in any plan."""
    return sa.func.vector_dims(table.c.embedding) == sa.literal_column(str(int(dims)), sa.Integer)


def store_index_name(dims: int, distance: str) -> str:
    """The HNSW index over the store's vectors of `dims` dimensions, for `distance`."""
    return f"ix_graph_store_vectors_hnsw_{int(dims)}_{distance}"


def check_index_shape(dims: object, distance: object) -> tuple[int, str]:
    """`dims` (1 to 2,000, pgvector's limit for an index) and `distance`, checked on both engines."""
    if isinstance(dims, bool) or not isinstance(dims, int) or not 1 <= dims <= _MAX_INDEXED_DIMS:
        raise ValidationError(f"dims: expected an integer from 1 to {_MAX_INDEXED_DIMS}, got {dims!r:.80}")
    if distance not in DISTANCES:
        raise ValidationError(f"distance: expected one of {', '.join(DISTANCES)}, got {distance!r:.80}")
    return int(dims), str(distance)


async def ensure_store_index(link: Link, dims: int, distance: str, *, m: int, ef_construction: int) -> str:
    """Create the HNSW index for the store's vectors of `dims` dimensions and `distance`, if missing.

    Postgres only (SQLite searches exactly: ""); its name otherwise.  A
    partial index on `embedding::vector(dims)`, one per shape and distance,
    serving every agent's store.
    """
    links, candidates = check_build_options(m, ef_construction)
    size, measure = check_index_shape(dims, distance)
    if link.sqlite:
        return ""
    await link.ready()
    connection = link.connection
    name = store_index_name(size, measure)
    index = sa.Index(
        name,
        sa.cast(_DETACHED.c.embedding, VECTOR(size)).label("embedding"),
        postgresql_using="hnsw",
        postgresql_with={"m": links, "ef_construction": candidates},
        postgresql_ops={"embedding": _OPS_CLASS[measure]},
        postgresql_where=_dims_literal(_DETACHED, size),
    )
    if link.info.get(DISTRIBUTED, False):  # the shards' indexes are built on the workers
        await connection.exec_driver_sql(PROPAGATE)
    await connection.exec_driver_sql("SET LOCAL maintenance_work_mem = '512MB'")
    await connection.execute(CreateIndex(index, if_not_exists=True))
    return name


async def store_index_exists(link: Link, dims: int, distance: str) -> bool:
    """Whether `ensure_store_index` built the index for this shape and distance (never on SQLite)."""
    if link.sqlite:
        return False
    found = await link.execute(
        sa.text(
            "SELECT 1 FROM pg_indexes WHERE indexname = :name AND schemaname = ANY (current_schemas(false))"
        ),
        {"name": store_index_name(*check_index_shape(dims, distance))},
    )
    return found.first() is not None


@lru_cache(maxsize=64)
def _batches(
    where: tuple[ColumnElement[bool], ...], scope: tuple[ColumnElement[bool], ...], dims: int
) -> tuple[sa.Select[Any], sa.Select[Any]]:
    """SQLite: the first `:batch` vectors the search compares, in key order, and those after `:after_*`."""
    first = (
        sa.select(_V.c.namespace, _V.c.key, _V.c.field, sa.type_coerce(_V.c.embedding, sa.LargeBinary))
        .join(_I, _OF_ITEM)
        .where(*where, *scope, _sized_sqlite(dims))
        .order_by(_V.c.namespace, _V.c.key, _V.c.field)
        .limit(sa.bindparam("batch", type_=sa.Integer))
    )
    after = sa.tuple_(
        sa.bindparam("after_namespace", type_=sa.String),
        sa.bindparam("after_key", type_=sa.String),
        sa.bindparam("after_field", type_=sa.String),
    )
    return first, first.where(sa.tuple_(_V.c.namespace, _V.c.key, _V.c.field) > after)


async def _sqlite_nearest(
    link: Link,
    where: tuple[ColumnElement[bool], ...],
    scope: tuple[ColumnElement[bool], ...],
    query: list[float],
    values: dict[str, Any],
    *,
    distance: str,
    limit: int,
    offset: int,
) -> list[Hit]:
    import numpy as np

    want = min(limit + offset, INT64_MAX)
    target = np.asarray(query, dtype=np.float32)
    dims = len(query)
    first, following = _batches(where, scope, dims)
    values = {**values, "batch": BATCH}
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
