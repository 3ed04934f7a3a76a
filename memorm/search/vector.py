"""Nearest-neighbour search over archival passages: pgvector on Postgres, numpy on SQLite.

`nearest` returns `(passage_id, distance)` pairs, best first, ties broken
by id, for one agent's passages of one embedding model.  Distances are
the metric's own values, as pgvector defines them:

| metric          | distance                | score (higher better) |
|-----------------|-------------------------|-----------------------|
| `cosine`        | 1 - cosine similarity   | cosine similarity     |
| `l2`            | Euclidean distance      | 1 / (1 + distance)    |
| `inner_product` | minus the inner product | the inner product     |

* Postgres: one statement, `ORDER BY embedding::vector(d) <op> q LIMIT k`
  with every filter in the WHERE clause, returning the passages' columns
  with their distances.  `ensure_index` builds a partial HNSW index per
  (model, dimension, metric); the query repeats the index's cast and model
  predicate (as a literal, so generic plans match it too), and pgvector's
  iterative scan keeps a filtered search returning `k` rows when `k` exist.
  `hnsw.ef_search` and `hnsw.iterative_scan` are set once per connection
  (`CONNECTION_SETTINGS`, by `memorm.db`); see `search_settings`.
* SQLite: exact search with numpy in a worker thread, over an in-process
  matrix per (agent, model) that is reloaded whenever the agent's
  `archive_version` (bumped by every passage write, from any connection or
  process) has moved.
"""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import sqlalchemy as sa
from pgvector.sqlalchemy import HALFVEC, VECTOR
from sqlalchemy.schema import CreateIndex
from sqlalchemy.sql import ColumnElement

from memorm.concurrency import CrossLoopLock
from memorm.driver import WATCHERS, fetch, in_transaction, sent
from memorm.errors import NotFoundError, ValidationError
from memorm.models import AGENTS, EMBEDDING_MODELS, PASSAGES, ArchivalPassage, EmbeddingModel, fields, hydrate
from memorm.routing import DISTRIBUTED
from memorm.search.model_cache import ModelCache
from memorm.translate import READ_ONLY
from memorm.types import VectorType
from memorm.validation import INT64_MAX

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from memorm.link import Link

__all__ = [
    "ARCHIVE_WRITES",
    "CONNECTION_SETTINGS",
    "METRICS",
    "PROPAGATE",
    "ScoredPassage",
    "VectorCache",
    "check_build_options",
    "connection_setup",
    "current_model",
    "ensure_index",
    "index_name",
    "nearest",
    "score_of",
    "search_settings",
]

METRICS = ("cosine", "l2", "inner_product")
_OPERATORS = {"cosine": "<=>", "l2": "<->", "inner_product": "<#>"}
_OPS_CLASS = {"cosine": "cosine_ops", "l2": "l2_ops", "inner_product": "ip_ops"}
DEFAULT_EF_SEARCH = 40  # pgvector's own default
# Every Postgres connection memorm opens starts with these (unless its
# connect_args' server_settings name them): a search with the defaults
# sends no settings of its own.  With filters (the agent, at least) an
# index scan must go on until `k` rows pass: that is the iterative scan.
CONNECTION_SETTINGS = {"hnsw.ef_search": str(DEFAULT_EF_SEARCH), "hnsw.iterative_scan": "strict_order"}
# link.info: a SET LOCAL hnsw.ef_search may be in force in this transaction
_EF_CHANGED = "memorm_ef_search_changed"
# pgvector's HNSW build options and their bounds (hnsw.h; the server refuses others).
_M = (2, 100)
_EF_CONSTRUCTION = (4, 1000)
# AsyncSession.info: (tenant, agent id)s whose archive this unit of work changed
ARCHIVE_WRITES = "memorm_archive_writes"
_TIE_MARGIN = 16  # rows read past k+offset, so equal distances there can be ordered by id
# Citus passes the transaction's later SET LOCALs on to its worker connections.
PROPAGATE = "SET LOCAL citus.propagate_set_commands = 'local'"
_THREAD_ABOVE = 200_000  # matrix cells; smaller searches run inline (a thread hop costs ~0.1 ms)


@dataclass(frozen=True)
class ScoredPassage:
    """A search hit: the passage, its distance to the query and a score (higher is better)."""

    passage: ArchivalPassage
    distance: float | None
    score: float


def score_of(metric: str, distance: float) -> float:
    """The score for a distance: see the table in this module's docstring."""
    if metric == "cosine":
        return 1.0 - distance
    if metric == "l2":
        return 1.0 / (1.0 + distance)
    return -distance


def check_metric(metric: object) -> str:
    if not isinstance(metric, str) or metric not in METRICS:
        raise ValidationError(f"metric: {metric!r} is not one of {', '.join(METRICS)}")
    return str(metric)


def _bounded(value: object, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValidationError(f"{field}: expected an integer from {low} to {high}, got {value!r:.80}")
    return int(value)  # a plain int: a subclass's own __str__ never reaches the DDL


def check_build_options(m: object, ef_construction: object) -> tuple[int, int]:
    """HNSW build options as pgvector takes them: `m` 2..100, `ef_construction` 4..1000 and >= 2m.

    Checked on both engines, so code that passes on SQLite is not refused by Postgres.
    """
    links = _bounded(m, "m", *_M)
    candidates = _bounded(ef_construction, "ef_construction", *_EF_CONSTRUCTION)
    if candidates < 2 * links:
        raise ValidationError(f"ef_construction: must be at least 2 * m ({2 * links}), got {candidates}")
    return links, candidates


# -- Postgres ----------------------------------------------------------------------------------


def _pg_column(model: EmbeddingModel, table: sa.Table = PASSAGES) -> ColumnElement[Any]:
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


def _model_predicate(name: str, dim: int) -> ColumnElement[bool]:
    """The partial indexes' predicate: this model name at this dimension, as literals in the SQL.

    Literals, not parameters, so the planner can match the partial index
    even from a generic (cached) plan.  The name goes as an escape string
    (`E'…'`, backslashes and quotes escaped), read alike whatever
    `standard_conforming_strings` says; a name has no NUL (`check_text`).
    """
    quoted = "E'" + name.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return sa.and_(
        PASSAGES.c.embedding_model == sa.literal_column(quoted, sa.Text),
        PASSAGES.c.embedding_dim == sa.literal_column(str(int(dim)), sa.Integer),
    )


async def ensure_index(
    link: Link, model: EmbeddingModel, metric: str, *, m: int, ef_construction: int
) -> str:
    """Create the HNSW index for `model` and `metric` if it does not exist (Postgres only).

    Storage parameters cannot be bound, so the DDL carries only the checked
    integers; the model name reaches it as a quoted literal.
    """
    links, candidates = check_build_options(m, ef_construction)
    check_metric(metric)
    if link.sqlite:
        return ""  # SQLite searches exactly; there is nothing to build
    await link.ready()
    connection = link.connection
    name = index_name(model.name, model.dim, metric, model.precision)
    ops = ("halfvec_" if model.precision == "float16" else "vector_") + _OPS_CLASS[metric]
    index = sa.Index(
        name,
        _pg_column(model, _DETACHED).label("embedding"),
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
    if link.info.get(DISTRIBUTED, False):
        await connection.exec_driver_sql(PROPAGATE)
    await connection.exec_driver_sql("SET LOCAL maintenance_work_mem = '512MB'")
    # IF NOT EXISTS in the DDL itself: an inspector probe can look in another schema.
    await connection.execute(CreateIndex(index, if_not_exists=True))
    return name


def connection_setup(server_settings: Mapping[str, Any]) -> str | None:
    """The `SET`s a new Postgres connection runs: `CONNECTION_SETTINGS` that `server_settings` leaves out.

    Sent once per connection, as one simple-protocol message (`memorm.db`).
    Placeholders until pgvector's library loads in that session, which then
    adopts the values.
    """
    missing = [(name, value) for name, value in CONNECTION_SETTINGS.items() if name not in server_settings]
    return "; ".join(f"SET {name} = {value}" for name, value in missing) or None


def current_model(tenant: Any, agent_id: Any, model: EmbeddingModel | None = None) -> ColumnElement[bool]:
    """True while this very model row is the agent's: same id, name, dimension and precision.

    A search statement carries it, so a model cached on the `Database`
    (`memorm.search.model_cache`) that another process dropped or replaced
    matches no rows rather than the wrong ones.  An index lookup by primary
    key; Postgres evaluates it once per statement (it refers to no outer row).
    Without `model`, its values are the parameters `model_id`, `model_name`,
    `model_dim` and `model_precision` (a statement built once, `_nearest_statement`).
    """
    shape: tuple[Any, ...] = (
        (model.id, model.name, model.dim, model.precision)
        if model is not None
        else tuple(sa.bindparam(f"model_{field}") for field in ("id", "name", "dim", "precision"))
    )
    return sa.exists().where(
        EMBEDDING_MODELS.c.tenant == tenant,
        EMBEDDING_MODELS.c.id == shape[0],
        EMBEDDING_MODELS.c.agent_id == agent_id,
        EMBEDDING_MODELS.c.name == shape[1],
        EMBEDDING_MODELS.c.dim == shape[2],
        EMBEDDING_MODELS.c.precision == shape[3],
    )


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
    distributed = link.info.get(DISTRIBUTED, False)
    every_time = distributed or link.pooler
    if not every_time and ef_search is None and not link.info.get(_EF_CHANGED, False):
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
        link.info.pop(_EF_CHANGED, None)
        if in_transaction(driver):  # else it ended, and its SET LOCAL with it
            await _send(link, "SET LOCAL hnsw.ef_search TO DEFAULT")
        return
    else:
        statements = [f"SET LOCAL hnsw.ef_search = {int(ef_search)}"]
        link.info[_EF_CHANGED] = True
    if not in_transaction(driver):  # a read-only unit of work: the search begins one
        mode = " READ ONLY" if link.info.get(READ_ONLY, False) else ""
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
        sent(link, sql)
    await link.driver.execute(sql)


_FIELDS = fields(PASSAGES)  # the passage's columns, not the derived search words
_WIDTH = len(_FIELDS)
_NAMES = tuple(column.name for column in _FIELDS)


# SQLite's exact search: the agent's archive version, with whether the (perhaps cached)
# model is still the agent's; then the passages of the nearest ids (a JSON array: one
# statement, compiled once, whatever the count).
_ARCHIVE_STATE = sa.select(
    AGENTS.c.archive_version, current_model(sa.bindparam("tenant"), sa.bindparam("agent"))
).where(AGENTS.c.tenant == sa.bindparam("tenant"), AGENTS.c.id == sa.bindparam("agent"))
_PASSAGES_BY_ID = sa.select(*_FIELDS).where(
    PASSAGES.c.tenant == sa.bindparam("tenant"),
    PASSAGES.c.agent_id == sa.bindparam("agent"),
    PASSAGES.c.id.in_(
        sa.select(sa.literal_column("value")).select_from(
            sa.func.json_each(sa.bindparam("ids", type_=sa.Text))
        )
    ),
)


def _model_params(tenant: str, agent_id: uuid.UUID, model: EmbeddingModel) -> dict[str, Any]:
    """The parameters of `current_model` (built without a model) and of the agent it belongs to."""
    return {
        "tenant": tenant,
        "agent": agent_id,
        "model_id": model.id,
        "model_name": model.name,
        "model_dim": model.dim,
        "model_precision": model.precision,
    }


def _passage(row: Sequence[Any]) -> ArchivalPassage:
    """The passage in a row that starts with the passage's columns."""
    return hydrate(ArchivalPassage, dict(zip(_NAMES, row[:_WIDTH], strict=True)))


def _hits(rows: Iterable[Sequence[Any]]) -> list[tuple[ArchivalPassage, float]]:
    """Passages and distances from rows of the passage's columns followed by the distance."""
    return [(_passage(row), float(row[_WIDTH])) for row in rows]


@dataclass(frozen=True)
class _Nearest:
    """A search's statements: `page` (the nearest few by the index, the page of them by
    (distance, id)) and `exact` (the page by (distance, id) without the index)."""

    page: sa.Select[Any]
    exact: sa.Select[Any]


# (metric, model name, dim, precision, first page's k or None): a search's statements without
# filters, built once
_STATEMENTS: dict[tuple[str, str, int, str, int | None], _Nearest] = {}
_STATEMENTS_MAX = 1024  # beyond, searches build their own: any number of model names stays bounded


def _nearest_statement(
    metric: str, name: str, dim: int, precision: str, where: Sequence[ColumnElement[bool]], first: int | None
) -> _Nearest:
    """The search's statements for this model shape and metric; without filters, built once.

    The model name and dimension are literals (`_model_predicate`); every
    other value is a parameter: `query`, `tenant`, `agent`, the model's
    (`current_model`), and for a page past the first, `near` (how many the
    inner query takes), `limit` and `offset`.  A statement built once is
    compiled once, and its cache key computed once.

    `first`: the `k` of a first page (offset 0), whose limits are literals.
    With a parameter for a LIMIT, Postgres cannot cost a generic plan, so it
    plans every execution of the prepared statement anew (custom plans); a
    literal LIMIT lets it settle on one plan after five executions.  That
    planning was a quarter of the statement's time on the server.  Pages past
    the first keep parameters, so paging through results prepares no new
    statement per offset.
    """
    key = (metric, name, dim, precision, first)
    if not where and key in _STATEMENTS:
        return _STATEMENTS[key]
    shape = EmbeddingModel(name=name, dim=dim, precision=precision)
    column = _pg_column(shape)
    target = sa.cast(sa.bindparam("query", type_=VectorType(half=precision == "float16")), column.type)
    distance = column.op(_OPERATORS[metric], return_type=sa.Float)(target).label("distance")
    scoped = sa.select(*_FIELDS, distance).where(
        _model_predicate(name, dim),
        PASSAGES.c.tenant == sa.bindparam("tenant"),
        PASSAGES.c.agent_id == sa.bindparam("agent"),
        current_model(sa.bindparam("tenant"), sa.bindparam("agent")),
        *where,
    )
    counts: tuple[sa.ColumnElement[int], ...]
    if first is None:
        counts = tuple(sa.bindparam(name, type_=sa.BigInteger) for name in ("near", "limit", "offset"))
    else:
        counts = tuple(sa.literal_column(str(n), sa.BigInteger) for n in (_margin(first), first, 0))
    near_limit, limit, offset = counts
    # The index yields rows in distance order only for ORDER BY distance alone:
    # the inner query takes the nearest few that way; the outer one breaks
    # ties by id and cuts the page, and says how many the inner one found and
    # the farthest distance among them, to tell whether equal distances ran
    # past the margin.  One statement, the passages' columns included.
    near = scoped.order_by(distance).limit(near_limit).subquery("near")
    page = (
        sa.select(
            *near.c,
            sa.func.count().over().label("found"),
            sa.func.max(near.c.distance).over().label("edge"),
        )
        .order_by(near.c.distance, near.c.id)
        .limit(limit)
        .offset(offset)
    )
    exact = scoped.order_by(distance, PASSAGES.c.id).limit(limit).offset(offset)
    statements = _Nearest(page, exact)
    if not where and len(_STATEMENTS) < _STATEMENTS_MAX:
        _STATEMENTS[key] = statements
    return statements


def _margin(want: int) -> int:
    """How many rows the inner query takes for the nearest `want` (offsets count: 64-bit)."""
    return min(want + _TIE_MARGIN, INT64_MAX)


async def _pg_nearest(
    link: Link,
    tenant: str,
    agent_id: uuid.UUID,
    model: EmbeddingModel,
    query: list[float],
    *,
    metric: str,
    where: Sequence[ColumnElement[bool]],
    k: int,
    offset: int,
    ef_search: int | None,
) -> list[tuple[ArchivalPassage, float]]:
    first = k if offset == 0 else None
    statements = _nearest_statement(metric, model.name, model.dim, model.precision, where, first)
    near = _margin(k + offset)
    values = {
        "query": query,
        **_model_params(tenant, agent_id, model),
        "near": near,
        "limit": k,
        "offset": offset,
    }
    await search_settings(link, ef_search)
    if where:  # a statement of its own
        rows = [tuple(row) for row in await link.execute(statements.page, values)]
    else:
        rows = await fetch(link, statements.page, values)
    if rows and rows[0][_WIDTH + 1] == near and rows[-1][_WIDTH] == rows[0][_WIDTH + 2]:
        # More equal distances than the margin holds at the page's edge (duplicate
        # texts, say): order them exactly, by (distance, id), without the index.
        exact = await link.execute(statements.exact, values)
        return _hits(tuple(row) for row in exact)
    return _hits(rows)


# -- SQLite ------------------------------------------------------------------------------------


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
        found = await fetch(link, _ARCHIVE_STATE, _model_params(tenant, agent_id, model))
        if not found:
            raise NotFoundError(f"no agent {agent_id}")
        version, current = found[0]
        if not current:
            return None
        if (tenant, agent_id) in link.info.get(ARCHIVE_WRITES, ()):
            # This unit of work changed the archive: its rows are not committed
            # and may roll back, so they must not outlive it in the cache.
            return await _load(link, tenant, agent_id, model, version)
        key = (tenant, agent_id, model.id)
        async with self._loading:
            entry = self._entries.get(key)
            if entry is None or entry.version != version:
                entry = await _load(link, tenant, agent_id, model, version)
            with self._mutex:
                self._entries[key] = entry
                self._entries.move_to_end(key)
                while len(self._entries) > self.max_entries:
                    self._entries.popitem(last=False)
        return entry


async def _load(link: Link, tenant: str, agent_id: uuid.UUID, model: EmbeddingModel, version: int) -> _Matrix:
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


def _metric(vectors: NDArray[Any], norms: NDArray[Any], query: NDArray[Any], metric: str) -> NDArray[Any]:
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
    screen = np.nan_to_num(_metric(vectors, norms, query.astype(np.float32), metric), nan=np.inf)
    keep = min(len(screen), want + max(16, want))
    if keep < len(screen):
        # Everything up to the keep-th distance, ties included: equal distances
        # are ordered by id afterwards, so none of them may be dropped here.
        threshold = np.partition(screen, keep - 1)[keep - 1]
        candidates = np.flatnonzero(screen <= threshold)
    else:
        candidates = np.arange(len(screen))
    exact = vectors[candidates].astype(np.float64)
    final = _metric(exact, np.linalg.norm(exact, axis=1), query, metric)
    if metric == "l2":  # the expanded form loses digits; take the difference directly
        final = np.linalg.norm(exact - query, axis=1)
    return [(int(positions[c]), float(d)) for c, d in zip(candidates, final, strict=True)]


async def _sqlite_nearest(
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
    passages = {passage.id: passage for passage in map(_passage, loaded)}
    return [(passages[passage_id], distance) for distance, passage_id in ranked if passage_id in passages]


async def nearest(
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
    ef_search: int | None = None,
) -> list[tuple[ArchivalPassage, float]]:
    """The `k` nearest passages (after `offset`), with their distances, best first.

    Only passages of `model`, and only while `model` is still this agent's
    (it may come from a cache): else none.
    """
    if not link.sqlite:
        return await _pg_nearest(
            link,
            tenant,
            agent_id,
            model,
            query,
            metric=metric,
            where=where,
            k=k,
            offset=offset,
            ef_search=ef_search,
        )
    return await _sqlite_nearest(
        link, cache, tenant, agent_id, model, query, metric=metric, where=where, k=k, offset=offset
    )
