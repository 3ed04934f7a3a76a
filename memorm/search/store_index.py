"""The graph store's HNSW indexes (Postgres): one per shape (dimensions) and distance, for every agent.

SQLite searches exactly and has none.  `ensure_store_index` builds one,
`store_index_exists` tells whether it is there; a search that asks for it
(`memorm.search.store_vectors.nearest_items`, `approximate`) goes through it.
"""

from __future__ import annotations

import sqlalchemy as sa
from pgvector.sqlalchemy import VECTOR
from sqlalchemy.schema import CreateIndex
from sqlalchemy.sql import ColumnElement

from memorm.errors import ValidationError
from memorm.link import Link
from memorm.models import STORE_VECTORS
from memorm.search.store_shapes import DISTANCES
from memorm.search.vector_index import MAX_INDEXED_DIMS, PROPAGATE, check_build_options

__all__ = [
    "check_index_shape",
    "ensure_store_index",
    "indexed_dims",
    "store_index_exists",
    "store_index_name",
]

# Runtime indexes are built on a detached copy: one on memorm's table would join its metadata.
_DETACHED = STORE_VECTORS.to_metadata(sa.MetaData())
_OPS_CLASS = {"cosine": "vector_cosine_ops", "inner_product": "vector_ip_ops", "l2": "vector_l2_ops"}
_MAX_INDEXED_DIMS = MAX_INDEXED_DIMS["float32"]  # the store keeps `vector`s


def indexed_dims(table: sa.Table, dims: int) -> ColumnElement[bool]:
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
        postgresql_where=indexed_dims(_DETACHED, size),
    )
    if link.state.distributed:  # the shards' indexes are built on the workers
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
