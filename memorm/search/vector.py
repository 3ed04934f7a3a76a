"""Nearest-neighbour search over archival passages: pgvector on Postgres, numpy on SQLite.

`nearest` returns `(passage_id, distance)` pairs, best first, ties broken
by id, for one agent's passages of one embedding model.  Distances are
the metric's own values, as pgvector defines them:

| metric          | distance                | score (higher better) |
|-----------------|-------------------------|-----------------------|
| `cosine`        | 1 - cosine similarity   | cosine similarity     |
| `l2`            | Euclidean distance      | 1 / (1 + distance)    |
| `inner_product` | minus the inner product | the inner product     |

* Postgres: `ORDER BY embedding::vector(d) <op> q LIMIT k` with every filter
  in the WHERE clause.  `ensure_index` builds a partial HNSW index per
  (model, dimension, metric); the query repeats the index's cast and model
  predicate (as a literal, so generic plans match it too), and pgvector's
  iterative scan keeps a filtered search returning `k` rows when `k` exist.
* SQLite: exact search with numpy in a worker thread, over an in-process
  matrix per (agent, model) that is reloaded whenever the agent's
  `archive_version` (bumped by every passage write, from any connection or
  process) has moved.
"""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import sqlalchemy as sa
from pgvector.sqlalchemy import HALFVEC, VECTOR
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.schema import CreateIndex
from sqlalchemy.sql import ColumnElement

from memorm.concurrency import CrossLoopLock
from memorm.driver import in_transaction
from memorm.errors import NotFoundError, ValidationError
from memorm.models import AGENTS, PASSAGES, ArchivalPassage, EmbeddingModel
from memorm.routing import DISTRIBUTED
from memorm.translate import READ_ONLY
from memorm.types import VectorType

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

__all__ = [
    "ARCHIVE_WRITES",
    "METRICS",
    "ScoredPassage",
    "VectorCache",
    "check_build_options",
    "ensure_index",
    "index_name",
    "nearest",
    "score_of",
]

METRICS = ("cosine", "l2", "inner_product")
_OPERATORS = {"cosine": "<=>", "l2": "<->", "inner_product": "<#>"}
_OPS_CLASS = {"cosine": "cosine_ops", "l2": "l2_ops", "inner_product": "ip_ops"}
DEFAULT_EF_SEARCH = 40  # pgvector's own default
# pgvector's HNSW build options and their bounds (hnsw.h; the server refuses others).
_M = (2, 100)
_EF_CONSTRUCTION = (4, 1000)
# AsyncSession.info: (tenant, agent id)s whose archive this unit of work changed
ARCHIVE_WRITES = "memorm_archive_writes"
_TIE_MARGIN = 16  # rows read past k+offset, so equal distances there can be ordered by id
# Citus passes the transaction's later SET LOCALs on to its worker connections.
_PROPAGATE = "SET LOCAL citus.propagate_set_commands = 'local'"
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


def _model_predicate(model: EmbeddingModel) -> ColumnElement[bool]:
    """The partial indexes' predicate: this model name at this dimension.

    Bound with `literal_execute`: rendered into the SQL, so the planner can
    match the partial index even from a generic (cached) plan.
    """
    return sa.and_(
        PASSAGES.c.embedding_model == sa.bindparam(None, model.name, literal_execute=True),
        PASSAGES.c.embedding_dim == sa.bindparam(None, model.dim, literal_execute=True),
    )


async def ensure_index(
    session: AsyncSession, model: EmbeddingModel, metric: str, *, m: int, ef_construction: int
) -> str:
    """Create the HNSW index for `model` and `metric` if it does not exist (Postgres only).

    Storage parameters cannot be bound, so the DDL carries only the checked
    integers; the model name reaches it as a quoted literal.
    """
    links, candidates = check_build_options(m, ef_construction)
    check_metric(metric)
    connection = await session.connection()
    if connection.dialect.name != "postgresql":
        return ""  # SQLite searches exactly; there is nothing to build
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
    if session.info.get(DISTRIBUTED, False):
        await connection.exec_driver_sql(_PROPAGATE)
    await connection.exec_driver_sql("SET LOCAL maintenance_work_mem = '512MB'")
    # IF NOT EXISTS in the DDL itself: an inspector probe can look in another schema.
    await connection.execute(CreateIndex(index, if_not_exists=True))
    return name


async def _search_settings(session: AsyncSession, ef_search: int) -> None:
    """Set `hnsw.ef_search` and `hnsw.iterative_scan` for the search that follows.

    With filters (the agent, at least) an index scan must go on until `k`
    rows pass: that is the iterative scan.

    * One server: session-level `set_config` (a read-only unit of work has no
      transaction for `SET LOCAL`), set by every search, so one search's
      values never leak into another.  One round trip.
    * Citus: the shard query runs on a worker, which `set_config` on the
      coordinator never reaches; Citus passes on `SET LOCAL` (with
      `citus.propagate_set_commands = 'local'`) to the worker connections of
      the transaction, as for the tenant (`memorm.tenancy`).  One round trip
      inside a transaction.  A read-only unit of work has none yet: the
      search begins one (`READ ONLY`), which lasts until the unit of work
      ends, like a tenant's.  Its `BEGIN` goes on its own: Citus replays a
      propagated `SET LOCAL`'s whole query string on the workers, and a
      `BEGIN` in it would warn on every worker transaction.
    """
    if not session.info.get(DISTRIBUTED, False):
        await session.execute(
            sa.select(
                sa.func.set_config("hnsw.ef_search", str(ef_search), False),
                sa.func.set_config("hnsw.iterative_scan", "strict_order", False),
            )
        )
        return
    connection = await session.connection()
    raw = await connection.get_raw_connection()
    driver: Any = raw.driver_connection
    if not in_transaction(driver):
        if getattr(raw.dbapi_connection, "autocommit", False):  # the unit of work begins its own
            mode = " READ ONLY" if session.info.get(READ_ONLY, False) else ""
            await driver.execute(f"BEGIN ISOLATION LEVEL READ COMMITTED{mode}")
        else:  # SQLAlchemy begins its transaction with its first statement
            await connection.exec_driver_sql(_PROPAGATE)
    # Several statements in one message (the simple protocol): one round trip.
    await driver.execute(
        f"{_PROPAGATE}; SET LOCAL hnsw.ef_search = {int(ef_search)}; "
        "SET LOCAL hnsw.iterative_scan = strict_order"
    )


async def _pg_nearest(
    session: AsyncSession,
    model: EmbeddingModel,
    query: list[float],
    *,
    metric: str,
    where: Sequence[ColumnElement[bool]],
    k: int,
    offset: int,
    ef_search: int | None,
) -> list[tuple[uuid.UUID, float]]:
    vector_type = VectorType(half=model.precision == "float16")
    target = sa.cast(sa.bindparam("query", query, type_=vector_type), _pg_column(model).type)
    distance = _pg_column(model).op(_OPERATORS[metric], return_type=sa.Float)(target).label("distance")
    await _search_settings(session, ef_search or DEFAULT_EF_SEARCH)
    # The index yields rows in distance order only for ORDER BY distance alone:
    # take the nearest few that way, then break ties by id here.
    want = k + offset
    scoped = sa.select(PASSAGES.c.id, distance).where(_model_predicate(model), *where)
    found = [tuple(row) for row in await session.execute(scoped.order_by(distance).limit(want + _TIE_MARGIN))]
    if len(found) == want + _TIE_MARGIN and found[want - 1][1] == found[-1][1]:
        # More equal distances than the margin holds at the page's edge (duplicate
        # texts, say): order them exactly, by (distance, id), without the index.
        exact = await session.execute(scoped.order_by(distance, PASSAGES.c.id).limit(k).offset(offset))
        return [(row[0], float(row[1])) for row in (tuple(r) for r in exact)]
    found.sort(key=lambda row: (row[1], row[0]))
    return [(row[0], float(row[1])) for row in found[offset:want]]


# -- SQLite ------------------------------------------------------------------------------------


@dataclass
class _Matrix:
    version: int
    ids: list[uuid.UUID]
    vectors: NDArray[np.float32]
    norms: NDArray[np.float32]
    position: dict[uuid.UUID, int]


class VectorCache:
    """In-process matrices of agents' embeddings (SQLite), least recently used first out."""

    def __init__(self, max_entries: int = 64) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, uuid.UUID, str], _Matrix] = (
            OrderedDict()
        )  # tenant, agent, model
        # Units of work of any event loop and thread share the cache: the dict
        # sits behind a thread lock, and loads queue on a lock that works across loops.
        self._mutex = threading.Lock()
        self._loading = CrossLoopLock()

    def clear(self) -> None:
        """Forget every matrix."""
        with self._mutex:
            self._entries.clear()

    def evict(self, agents: Iterable[tuple[str, uuid.UUID]]) -> None:
        """Drop these `(tenant, agent id)`s' matrices (their archives changed, or they are gone)."""
        doomed = set(agents)
        with self._mutex:
            for key in [key for key in self._entries if key[:2] in doomed]:
                del self._entries[key]

    def evict_tenant(self, tenant: str) -> None:
        """Drop every matrix of the tenant's agents."""
        with self._mutex:
            for key in [key for key in self._entries if key[0] == tenant]:
                del self._entries[key]

    async def matrix(
        self, session: AsyncSession, tenant: str, agent_id: uuid.UUID, model: EmbeddingModel
    ) -> _Matrix:
        """The agent's vectors for `model`, reloaded if the archive changed since they were read."""
        version = await session.scalar(
            sa.select(AGENTS.c.archive_version).where(AGENTS.c.tenant == tenant, AGENTS.c.id == agent_id)
        )
        if version is None:
            raise NotFoundError(f"no agent {agent_id}")
        if (tenant, agent_id) in session.info.get(ARCHIVE_WRITES, ()):
            # This unit of work changed the archive: its rows are not committed
            # and may roll back, so they must not outlive it in the cache.
            return await _load(session, tenant, agent_id, model, version)
        key = (tenant, agent_id, model.name)
        async with self._loading:
            entry = self._entries.get(key)
            if entry is None or entry.version != version:
                entry = await _load(session, tenant, agent_id, model, version)
            with self._mutex:
                self._entries[key] = entry
                self._entries.move_to_end(key)
                while len(self._entries) > self.max_entries:
                    self._entries.popitem(last=False)
        return entry


async def _load(
    session: AsyncSession, tenant: str, agent_id: uuid.UUID, model: EmbeddingModel, version: int
) -> _Matrix:
    import numpy as np  # here, not at the top: `from memorm import Database` need not load it

    half = model.precision == "float16"
    column = PASSAGES.c.embedding_half if half else PASSAGES.c.embedding
    raw = sa.type_coerce(column, sa.LargeBinary())  # the stored bytes, undecoded
    # No ORDER BY: hits are ranked by (distance, id) afterwards, and sorting
    # 100,000 rows of vectors cost SQLite a 150 MB temporary b-tree.
    rows = await session.execute(
        sa.select(PASSAGES.c.id, raw).where(
            PASSAGES.c.tenant == tenant,
            PASSAGES.c.agent_id == agent_id,
            PASSAGES.c.embedding_model == model.name,
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
    session: AsyncSession,
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
) -> list[tuple[uuid.UUID, float]]:
    import numpy as np

    matrix = await cache.matrix(session, tenant, agent_id, model)
    rows: NDArray[np.intp] | None = None
    if where:  # filters run in SQL; the matrix is narrowed to the rows that pass
        allowed = await session.scalars(
            sa.select(PASSAGES.c.id).where(
                PASSAGES.c.tenant == tenant,
                PASSAGES.c.agent_id == agent_id,
                PASSAGES.c.embedding_model == model.name,
                *where,
            )
        )
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
    )
    return [(passage_id, distance) for distance, passage_id in ranked[offset:want]]


async def nearest(
    session: AsyncSession,
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
) -> list[tuple[uuid.UUID, float]]:
    """The `k` nearest passages (after `offset`): `(id, distance)`, best first."""
    connection = await session.connection()
    if connection.dialect.name == "postgresql":
        scope = [PASSAGES.c.tenant == tenant, PASSAGES.c.agent_id == agent_id, *where]
        return await _pg_nearest(
            session, model, query, metric=metric, where=scope, k=k, offset=offset, ef_search=ef_search
        )
    return await _sqlite_nearest(
        session, cache, tenant, agent_id, model, query, metric=metric, where=where, k=k, offset=offset
    )
