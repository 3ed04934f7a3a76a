"""The archival passages' HNSW indexes (Postgres): metrics, build options, DDL and search settings.

* `ensure_index` builds a partial HNSW index per (model, dimension,
  metric), on the embedding column cast to the model's vector type
  (`indexed_column`, which the search statements repeat so the planner
  matches the index).
* `hnsw.ef_search` and `hnsw.iterative_scan` are set once per connection
  (`CONNECTION_SETTINGS`, sent by `memorm.connections` through `connection_setup`);
  `search_settings` sends what a search needs beyond them.

Build options and metrics are checked on both engines, so code that
passes on SQLite (which searches exactly, with no index) is not refused by
Postgres.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from pgvector.sqlalchemy import HALFVEC, VECTOR
from sqlalchemy.schema import CreateIndex
from sqlalchemy.sql import ColumnElement

from memorm.connection_state import WATCHERS, in_transaction, sent
from memorm.errors import ValidationError
from memorm.link import Link
from memorm.models import PASSAGES, EmbeddingModel

__all__ = [
    "CONNECTION_SETTINGS",
    "DEFAULT_EF_SEARCH",
    "MAX_INDEXED_DIMS",
    "METRICS",
    "PROPAGATE",
    "check_build_options",
    "check_indexable",
    "check_metric",
    "connection_setup",
    "ensure_index",
    "index_name",
    "indexed_column",
    "search_settings",
]

METRICS = ("cosine", "l2", "inner_product")
_OPS_CLASS = {"cosine": "cosine_ops", "l2": "l2_ops", "inner_product": "ip_ops"}
DEFAULT_EF_SEARCH = 40  # pgvector's own default
# Every Postgres connection memorm opens starts with these (unless its
# connect_args' server_settings name them): a search with the defaults
# sends no settings of its own.  With filters (the agent, at least) an
# index scan must go on until `k` rows pass: that is the iterative scan.
CONNECTION_SETTINGS = {"hnsw.ef_search": str(DEFAULT_EF_SEARCH), "hnsw.iterative_scan": "strict_order"}
# pgvector's HNSW build options and their bounds (hnsw.h; the server refuses others).
_M = (2, 100)
_EF_CONSTRUCTION = (4, 1000)
# Citus passes the transaction's later SET LOCALs on to its worker connections.
PROPAGATE = "SET LOCAL citus.propagate_set_commands = 'local'"


def check_metric(metric: object) -> str:
    """`metric` if it is one of `METRICS`; else `ValidationError`."""
    if not isinstance(metric, str) or metric not in METRICS:
        raise ValidationError(f"metric: {metric!r} is not one of {', '.join(METRICS)}")
    return str(metric)


def _bounded(value: object, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValidationError(f"{field}: expected an integer from {low} to {high}, got {value!r:.80}")
    return int(value)  # a plain int: a subclass's own __str__ never reaches the DDL


MAX_INDEXED_DIMS = {"float32": 2_000, "float16": 4_000}
"""pgvector's limits for an HNSW index: dimensions of `vector` (float32) and `halfvec` (float16)."""


def check_indexable(model: EmbeddingModel) -> None:
    """Refuse a shape an HNSW index cannot hold (on both engines, as Postgres would)."""
    limit = MAX_INDEXED_DIMS[model.precision]
    if model.dim > limit:
        raise ValidationError(
            f"dim: an HNSW index holds at most {limit:,} dimensions at {model.precision} "
            f"(pgvector's limit), got {model.dim:,}; search those exactly, without an index"
        )


def check_build_options(m: object, ef_construction: object) -> tuple[int, int]:
    """HNSW build options as pgvector takes them: `m` 2..100, `ef_construction` 4..1000 and >= 2m.

    Checked on both engines, so code that passes on SQLite is not refused by Postgres.
    """
    links = _bounded(m, "m", *_M)
    candidates = _bounded(ef_construction, "ef_construction", *_EF_CONSTRUCTION)
    if candidates < 2 * links:
        raise ValidationError(f"ef_construction: must be at least 2 * m ({2 * links}), got {candidates}")
    return links, candidates


def indexed_column(model: EmbeddingModel, table: sa.Table = PASSAGES) -> ColumnElement[Any]:
    """The embedding column cast to the model's vector type: what the index holds and searches compare."""
    half = model.precision == "float16"
    column = table.c.embedding_half if half else table.c.embedding
    return sa.cast(column, HALFVEC(model.dim) if half else VECTOR(model.dim))


# An Index over a table's columns attaches itself to that table: built on
# memorm's own, a runtime index would join the metadata (and every later
# create_all, and alembic's comparison).  Runtime indexes use this copy.
_DETACHED = PASSAGES.to_metadata(sa.MetaData())


def index_name(model: str, dim: int, metric: str, precision: str = "float32") -> str:
    """The HNSW index for (model, dim, metric): a stable name whatever the model is called."""
    digest = hashlib.sha256(model.encode()).hexdigest()[:12]
    half = "_half" if precision == "float16" else ""
    return f"ix_archival_passages_hnsw_{digest}_{dim}{half}_{metric}"


async def ensure_index(
    link: Link, model: EmbeddingModel, metric: str, *, m: int, ef_construction: int
) -> str:
    """Create the HNSW index for `model` and `metric` if it does not exist (Postgres only).

    Storage parameters cannot be bound, so the DDL carries only the checked
    integers; the model name reaches it as a quoted literal.
    """
    links, candidates = check_build_options(m, ef_construction)
    check_metric(metric)
    check_indexable(model)
    if link.sqlite:
        return ""  # SQLite searches exactly; there is nothing to build
    await link.ready()
    connection = link.connection
    name = index_name(model.name, model.dim, metric, model.precision)
    ops = ("halfvec_" if model.precision == "float16" else "vector_") + _OPS_CLASS[metric]
    index = sa.Index(
        name,
        indexed_column(model, _DETACHED).label("embedding"),
        postgresql_using="hnsw",
        postgresql_with={"m": links, "ef_construction": candidates},
        postgresql_ops={"embedding": ops},
        postgresql_where=sa.and_(
            _DETACHED.c.embedding_model == sa.literal(model.name),
            _DETACHED.c.embedding_dim == sa.literal(model.dim),
        ),
    )
    # HNSW builds are memory-hungry: with the default 64 MB, 100k x 384 took 2-4x longer.
    # On Citus the shards' indexes are built on the workers: the setting goes there too.
    if link.state.distributed:
        await connection.exec_driver_sql(PROPAGATE)
    await connection.exec_driver_sql("SET LOCAL maintenance_work_mem = '512MB'")
    # IF NOT EXISTS in the DDL itself: an inspector probe can look in another schema.
    await connection.execute(CreateIndex(index, if_not_exists=True))
    return name


def connection_setup(server_settings: Mapping[str, Any]) -> str | None:
    """The `SET`s a new Postgres connection runs: `CONNECTION_SETTINGS` that `server_settings` leaves out.

    Sent once per connection, as one simple-protocol message (`memorm.connections`).
    Placeholders until pgvector's library loads in that session, which then
    adopts the values.
    """
    missing = [(name, value) for name, value in CONNECTION_SETTINGS.items() if name not in server_settings]
    return "; ".join(f"SET {name} = {value}" for name, value in missing) or None


async def search_settings(link: Link, ef_search: int | None) -> None:
    """Set `hnsw.ef_search` (and on Citus `hnsw.iterative_scan`) for the search that follows.

    * One server: every connection starts with `CONNECTION_SETTINGS`, so a
      search at the default sends nothing.  Another `ef_search` goes as
      `SET LOCAL`, undone when the transaction ends (commit or rollback), so
      it never reaches another unit of work on that pooled connection; a
      read-only unit of work has no transaction yet, and the search begins
      one (`READ ONLY`, in the same message), which lasts until the unit of
      work ends.  A later search at the default in that transaction sets it
      back (`TO DEFAULT`: the connection's value).
    * Citus: the shard query runs on a worker, which the coordinator's
      connection settings never reach; Citus passes on `SET LOCAL` (with
      `citus.propagate_set_commands = 'local'`) to the worker connections of
      the transaction, as for the tenant (`memorm.tenancy`).  So every search
      sends both settings: one statement more than on one server, inside a
      transaction (begun as above).  Its `BEGIN` goes on its own: Citus
      replays a propagated `SET LOCAL`'s whole query string on the workers,
      and a `BEGIN` in it would warn on every worker transaction.
    * Behind a transaction pooler (`link.pooler`) a connection's settings
      stay on whichever server connection the pooler gave it: every search
      sends both settings, in a transaction (begun in the same message).
    """
    distributed = link.state.distributed
    every_time = distributed or link.pooler
    if not every_time and ef_search is None and not link.state.ef_search_changed:
        return  # the connection's own settings
    await link.ready()  # a writer's (or a tenant's) transaction is the unit of work's to begin
    driver: Any = link.driver
    if every_time:
        statements = [
            *([PROPAGATE] if distributed else []),
            f"SET LOCAL hnsw.ef_search = {int(ef_search or DEFAULT_EF_SEARCH)}",
            "SET LOCAL hnsw.iterative_scan = strict_order",
        ]
    elif ef_search is None:  # an earlier search of this transaction set another value
        link.state.ef_search_changed = False
        if in_transaction(driver):  # else it ended, and its SET LOCAL with it
            await _send(link, "SET LOCAL hnsw.ef_search TO DEFAULT")
        return
    else:
        statements = [f"SET LOCAL hnsw.ef_search = {int(ef_search)}"]
        link.state.ef_search_changed = True
    if not in_transaction(driver):  # a read-only unit of work: the search begins one
        mode = " READ ONLY" if link.state.read_only else ""
        begin = f"BEGIN ISOLATION LEVEL READ COMMITTED{mode}"
        if distributed:
            await _send(link, begin)
        else:
            statements.insert(0, begin)
    if statements:
        # Several statements in one message (the simple protocol): one round trip.
        await _send(link, "; ".join(statements))


async def _send(link: Link, sql: str) -> None:
    """Settings (and their `BEGIN`) on the driver, one simple-protocol message, seen by the watchers."""
    if WATCHERS:
        sent(link.engine, sql)
    await link.driver.execute(sql)
