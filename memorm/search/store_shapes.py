"""Which of the graph store's vectors a search compares: its items' own, of its dimensions, per engine.

A store keeps one embedding per indexed field of an item (`STORE_VECTORS`);
a search by a query of `dims` dimensions compares only the vectors of that
many dimensions (others, from another index config, are never compared).
`memorm.search.store_vectors` (Postgres), `memorm.search.store_scan`
(SQLite) and `memorm.search.store_index` (the HNSW index) share these.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.sql import ColumnElement

from memorm.link import Link
from memorm.models import STORE_ITEMS, STORE_VECTORS

__all__ = ["DISTANCES", "OF_ITEM", "sized", "sized_postgres", "sized_sqlite"]

DISTANCES = ("cosine", "inner_product", "l2")

_V, _I = STORE_VECTORS, STORE_ITEMS
OF_ITEM = sa.and_(
    _V.c.tenant == _I.c.tenant,
    _V.c.agent_id == _I.c.agent_id,
    _V.c.namespace == _I.c.namespace,
    _V.c.key == _I.c.key,
)
"""A vector (a row of `STORE_VECTORS`) of the item (a row of `STORE_ITEMS`): the item's key."""


def sized(link: Link, dims: int) -> ColumnElement[bool]:
    """A vector of `dims` dimensions (others, from another index config, are never compared)."""
    if link.sqlite:
        return sized_sqlite(dims)
    return sized_postgres(dims)


def sized_sqlite(dims: int) -> ColumnElement[bool]:
    """SQLite keeps a vector as packed float32 (`memorm.types.VectorType`): 4 bytes a dimension."""
    return sa.func.length(_V.c.embedding) == sa.literal_column(str(int(dims) * 4))


def sized_postgres(dims: int) -> ColumnElement[bool]:
    """Postgres keeps a vector as pgvector's `vector`, which knows its dimensions."""
    return sa.func.vector_dims(_V.c.embedding) == dims
