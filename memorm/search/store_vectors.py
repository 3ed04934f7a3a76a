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
  item's key), ordered, limited and offset in SQL; or, `approximate`, through
  the HNSW index of `memorm.search.store_index`.
* SQLite: the candidate vectors are read `BATCH` rows at a time in key
  order and scored with numpy (in a worker thread when the matrix is
  large); only the best `limit + offset` items are kept between batches
  (`memorm.search.store_scan`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import sqlalchemy as sa
from pgvector.sqlalchemy import VECTOR
from sqlalchemy.sql import ColumnElement

from memorm.driver import fetch
from memorm.link import Link
from memorm.models import STORE_ITEMS, STORE_VECTORS
from memorm.search.store_index import indexed_dims
from memorm.search.store_scan import Hit, scan_nearest
from memorm.search.store_shapes import OF_ITEM, sized, sized_postgres
from memorm.search.vector_index import search_settings
from memorm.types import VectorType
from memorm.validation import INT64_MAX

__all__ = ["BATCH", "Found", "nearest_items", "scored_count", "unscored"]

BATCH = 2_000  # vectors read (and scored) at a time on SQLite
_OPERATORS = {"cosine": "<=>", "inner_product": "<#>", "l2": "<->"}
_CANDIDATES = 4  # vectors an approximate search takes from the index per row of its page

Found = tuple[tuple[Any, ...], float]
"""An item found: its row (the columns asked for) and its score."""

_V, _I = STORE_VECTORS, STORE_ITEMS


def unscored(link: Link, scope: Sequence[ColumnElement[bool]], dims: int) -> ColumnElement[bool]:
    """The item (a row of `STORE_ITEMS`) has no embedding a search of `dims` dimensions scores.

    `scope`: the vectors' own conditions (tenant, agent, namespace prefix),
    as values: Citus keeps a correlated subquery on one shard only when its
    table names the agent itself.
    """
    return ~sa.exists().where(OF_ITEM, *scope, sized(link, dims))


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
        hits = await scan_nearest(
            link, where, scope, query, values, distance=distance, limit=limit, offset=offset, batch=BATCH
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
            .where(*scope, indexed_dims(_V, dims))
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
        .where(OF_ITEM, *scope, sized_postgres(dims))
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
