"""`uow.graph_store`: an agent's long-term store (LangGraph's `BaseStore`): items and their embeddings.

Items are JSON objects under a namespace (LangGraph's labels joined by ".")
and a key; an item may expire (`expires_at`), after which reads skip it
(unless told `expired`: LangGraph's stores read it until swept), and a
sweep deletes it.  Every call names the agent, so it stays on one shard of
a distributed database.  Callers (`memorm.compat.langgraph`) pass values
checked, and the time `now` that decides what has expired.
"""

from __future__ import annotations

import builtins
import math
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql import ColumnElement

from memorm.driver import Insert, fetch, insert_many
from memorm.errors import NotFoundError, ValidationError
from memorm.models import STORE_ITEMS, STORE_VECTORS
from memorm.repositories.base import Repository
from memorm.search.filters import ValueShape, shaped_conditions, value_filter
from memorm.search.store_vectors import (
    ensure_store_index,
    nearest_items,
    scored_count,
    store_index_exists,
    unscored,
)
from memorm.translate import check_writable, guarded
from memorm.types import VectorType
from memorm.validation import MAX_PAGE, MIN_TIME, as_uuid, check_int

__all__ = ["MAX_KEY_BYTES", "NewItem", "StoreRepository", "StoredItem", "check_minutes", "under"]

_I, _V = STORE_ITEMS, STORE_VECTORS
_ITEM_COLUMNS = (
    "tenant",
    "agent_id",
    "namespace",
    "key",
    "value",
    "created_at",
    "updated_at",
    "expires_at",
    "ttl_minutes",
)
_VECTOR_COLUMNS = ("tenant", "agent_id", "namespace", "key", "field", "embedding")
_READ = (_I.c.namespace, _I.c.key, _I.c.value, _I.c.created_at, _I.c.updated_at, _I.c.ttl_minutes)
_KEYS_PER_STATEMENT = 500  # (namespace, key) pairs per IN list
MAX_KEY_BYTES = 1024  # of a joined namespace, and of a key: both in the primary key's btree entries
_MAX_MINUTES = 1000 * 365 * 24 * 60


_ONE = {"tenant": "tenant", "agent_id": "agent", "namespace": "namespace", "key": "key"}  # column: parameter


def _one(table: sa.Table) -> list[ColumnElement[bool]]:
    """One item's rows of `table`: its tenant, agent, namespace and key, as parameters."""
    return [table.c[column] == sa.bindparam(name) for column, name in _ONE.items()]


_DELETE_VECTORS_OF = sa.delete(_V).where(*_one(_V))  # one item's embeddings


def _put_one() -> Any:
    """One item stored with its embeddings, which replace its old ones: one statement (Postgres).

    The item's upsert and the delete of its embeddings of fields not in
    `:fields` are CTEs beside the upsert of the new embeddings (`:fields`
    and `:embeddings`, arrays): no row is touched twice, and the
    embeddings' foreign key to the item is checked as the statement ends,
    the item there.  With no fields, every old embedding goes.
    """
    parameter = {"agent_id": "agent", "created_at": "now", "updated_at": "now"}
    item = postgresql.insert(_I).values(
        {name: sa.bindparam(parameter.get(name, name), type_=_I.c[name].type) for name in _ITEM_COLUMNS}
    )
    key = [column.name for column in _I.primary_key.columns]
    replaced = {name: item.excluded[name] for name in _ITEM_COLUMNS if name not in (*key, "created_at")}
    stored = item.on_conflict_do_update(index_elements=key, set_=replaced).cte("item")
    fields = sa.bindparam("fields", type_=postgresql.ARRAY(sa.Text))
    others = sa.delete(_V).where(*_one(_V), sa.not_(_V.c.field == sa.any_(fields))).cte("others")
    embeddings = sa.bindparam("embeddings", type_=postgresql.ARRAY(VectorType(array_item=True), dimensions=1))
    new = sa.func.unnest(fields, embeddings).table_valued("field", "embedding").render_derived()
    owner = [sa.bindparam(name, type_=_V.c[column].type) for column, name in _ONE.items()]
    vectors = postgresql.insert(_V).from_select(
        list(_VECTOR_COLUMNS), sa.select(*owner, new.c.field, new.c.embedding)
    )
    vector_key = [column.name for column in _V.primary_key.columns]
    upsert = vectors.on_conflict_do_update(
        index_elements=vector_key, set_={"embedding": vectors.excluded.embedding}
    )
    return upsert.add_cte(stored).add_cte(others)


_PUT_ONE = _put_one()
_LIVE = sa.or_(_I.c.expires_at.is_(None), _I.c.expires_at > sa.bindparam("now", type_=_I.c.expires_at.type))
_GET_ONE = sa.select(*_READ).where(*_one(_I), _LIVE)  # one item, if live at :now


class StoredItem(NamedTuple):
    """An item as read: its namespace (joined), key, value, times, TTL and search score."""

    namespace: str
    key: str
    value: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    ttl_minutes: float | None
    score: float | None = None


class NewItem(NamedTuple):
    """An item to store; `vectors` maps field paths to embeddings (None: keep no embeddings)."""

    namespace: str
    key: str
    value: dict[str, Any]
    ttl_minutes: float | None
    vectors: Mapping[str, list[float]] | None = None


def check_minutes(value: object, field: str) -> float | None:
    """A TTL in minutes (None: none) as the store keeps it: a positive float of at most a thousand years."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValidationError(f"{field}: expected a positive number of minutes or None, got {value!r:.80}")
    if value > _MAX_MINUTES:
        raise ValidationError(f"{field}: more than a thousand years")
    return float(value)


def under(column: Any, prefix: str) -> list[ColumnElement[bool]]:
    """`column` is the namespace `prefix` or one below it ("" matches every namespace).

    A range, not LIKE: namespaces compare byte by byte, and "/" follows ".",
    so the namespaces below "a.b" are those from "a.b." up to "a.b/".  The
    range from "a.b" itself to "a.b/" comes first, as a condition of its
    own, so the primary key's index seeks it (within it, "a.b-c" is not below
    "a.b": the second condition leaves it out).
    """
    if not prefix:
        return []
    return _range(column, prefix, prefix + "/", prefix + ".")


def _range(column: Any, prefix: Any, end: Any, below: Any) -> list[ColumnElement[bool]]:
    return [column >= prefix, column < end, sa.or_(column == prefix, column >= below)]


def _under_values(prefix: str) -> dict[str, str]:
    """The values of `_listing`'s namespace range."""
    return {"prefix": prefix, "prefix_end": prefix + "/", "prefix_below": prefix + "."}


@lru_cache(maxsize=128)
def _conditions(
    prefixed: bool, shape: ValueShape
) -> tuple[tuple[ColumnElement[bool], ...], tuple[ColumnElement[bool], ...]]:
    """A search's conditions, built once per shape: on the items, and the same scope on their vectors.

    The live items of an agent (under a namespace, if `prefixed`) whose
    values match a filter of that shape (`value_filter`), with named
    parameters: tenant, agent and now, those `_under_values` names and
    those `value_filter` names.
    """
    named: list[Any] = [sa.bindparam(name) for name in _under_values("")]
    items: tuple[ColumnElement[bool], ...] = (
        _I.c.tenant == sa.bindparam("tenant"),
        _I.c.agent_id == sa.bindparam("agent"),
        _LIVE,
    )
    vectors: tuple[ColumnElement[bool], ...] = (
        _V.c.tenant == sa.bindparam("tenant"),
        _V.c.agent_id == sa.bindparam("agent"),
    )
    if prefixed:
        items += (*_range(_I.c.namespace, *named),)
        vectors += (*_range(_V.c.namespace, *named),)
    return (*items, *shaped_conditions(_I.c.value, shape)), vectors


@lru_cache(maxsize=128)
def _listing(prefixed: bool, shape: ValueShape) -> sa.Select[Any]:
    """A search without a query, built once per shape (`_conditions`): newest update first, a page."""
    return (
        sa.select(*_READ)
        .where(*_conditions(prefixed, shape)[0])
        .order_by(_I.c.updated_at.desc(), _I.c.namespace, _I.c.key)
        .limit(sa.bindparam("limit", type_=sa.Integer))
        .offset(sa.bindparam("offset", type_=sa.Integer))
    )


def _item(row: Any, score: float | None = None) -> StoredItem:
    namespace, key, value, created, updated, ttl = row[:6]
    return StoredItem(namespace, key, value, created, updated, ttl, score)


def _expiry(now: datetime, ttl_minutes: float | None) -> datetime | None:
    return None if ttl_minutes is None else now + timedelta(minutes=ttl_minutes)


def _cutoff(now: datetime, expired: bool) -> datetime:
    """The time an item must outlive to be read: `now`, or with `expired` the earliest time memorm stores.

    Every item expires after it was written, so nothing has expired at
    `MIN_TIME`: the statements stay the same, and keep their cached plans.
    """
    return MIN_TIME if expired else now


class StoreRepository(Repository):
    """An agent's long-term store: items under namespaces and keys, their embeddings, their expiry."""

    def _agent(self, table: sa.Table, agent_id: uuid.UUID | str) -> list[ColumnElement[bool]]:
        return [*self._own(table), table.c.agent_id == as_uuid(agent_id, "agent_id")]

    def _live(self, agent_id: uuid.UUID | str, now: datetime) -> list[ColumnElement[bool]]:
        """The agent's items that have not expired at `now`."""
        return [*self._agent(_I, agent_id), sa.or_(_I.c.expires_at.is_(None), _I.c.expires_at > now)]

    async def get(
        self,
        agent_id: uuid.UUID | str,
        keys: Sequence[tuple[str, str]],
        *,
        now: datetime,
        expired: bool = False,
    ) -> dict[tuple[str, str], StoredItem]:
        """The live items among `(namespace, key)`s, by their pair (`expired`: and unswept expired ones)."""
        found: dict[tuple[str, str], StoredItem] = {}
        wanted = sorted(set(keys))
        now = _cutoff(now, expired)
        if len(wanted) == 1:  # one get: the statement built once
            (namespace, key), agent = wanted[0], as_uuid(agent_id, "agent_id")
            params = {"tenant": self._owner, "agent": agent, "namespace": namespace, "key": key, "now": now}
            async with guarded(self.link):
                for row in await fetch(self.link, _GET_ONE, params):
                    found[row[0], row[1]] = _item(row)
            return found
        for start in range(0, len(wanted), _KEYS_PER_STATEMENT):
            batch = wanted[start : start + _KEYS_PER_STATEMENT]
            query = sa.select(*_READ).where(
                *self._live(agent_id, now), sa.tuple_(_I.c.namespace, _I.c.key).in_(batch)
            )
            rows: builtins.list[Any] = [tuple(row) for row in await self._execute(query)]
            for row in rows:
                found[row[0], row[1]] = _item(row)
        return found

    async def put(
        self, agent_id: uuid.UUID | str, items: Sequence[NewItem], *, now: datetime, locked: bool = False
    ) -> None:
        """Store `items` (replacing those under their keys, whose `created_at` stays), with their vectors.

        An item's old embeddings are dropped; its `vectors`, if any, stored.
        Several items are locked first (`lock`), unless the caller has (`locked`).
        """
        if not items:
            return
        owner, agent = self._owner, as_uuid(agent_id, "agent_id")
        first = items[0]
        if len(items) == 1 and self._one_server_postgres:
            # One statement, one round trip (alone in its unit of work: no BEGIN/COMMIT either).
            params = {
                "tenant": owner,
                "agent": agent,
                "namespace": first.namespace,
                "key": first.key,
                "value": first.value,
                "now": now,
                "expires_at": _expiry(now, first.ttl_minutes),
                "ttl_minutes": first.ttl_minutes,
                "fields": list(first.vectors or {}),
                "embeddings": list((first.vectors or {}).values()),
            }
            check_writable(self.link)
            try:
                async with guarded(self.link):
                    await fetch(self.link, _PUT_ONE, params)
            except NotFoundError as error:  # the item's one foreign key: its agent
                raise NotFoundError(f"no agent {agent}") from error
            return
        pairs = sorted({(item.namespace, item.key) for item in items})
        if len(pairs) > 1:
            if not locked:
                await self.lock(agent, pairs)
            await self._delete_vectors(agent, pairs)
        rows = [
            (
                owner,
                agent,
                item.namespace,
                item.key,
                item.value,
                now,  # a replaced item keeps its own (`keep`)
                now,
                _expiry(now, item.ttl_minutes),
                item.ttl_minutes,
            )
            for item in items
        ]
        vectors = [
            (owner, agent, item.namespace, item.key, field, vector)
            for item in items
            for field, vector in (item.vectors or {}).items()
        ]
        # One item's old embeddings are deleted in the inserts' own call (on SQLite, one hop).
        drop = None if len(pairs) > 1 else (_DELETE_VECTORS_OF, self._one_item(agent, *pairs[0]))
        try:
            await insert_many(
                self.link,
                [
                    Insert(_I, _ITEM_COLUMNS, rows, "update", keep=("created_at",)),
                    Insert(_V, _VECTOR_COLUMNS, vectors, "update"),
                ],
                first=drop,
            )
        except NotFoundError as error:  # the items' one foreign key: their agent
            raise NotFoundError(f"no agent {agent}") from error

    def _one_item(self, agent: uuid.UUID, namespace: str, key: str) -> dict[str, Any]:
        """The parameters of `_one`: one item of the agent's."""
        return {"tenant": self._owner, "agent": agent, "namespace": namespace, "key": key}

    async def _delete_vectors(self, agent: uuid.UUID, pairs: Sequence[tuple[str, str]]) -> None:
        unique = sorted(set(pairs))
        if len(unique) == 1:  # one item: the statement built once
            check_writable(self.link)
            async with guarded(self.link):
                await fetch(self.link, _DELETE_VECTORS_OF, self._one_item(agent, *unique[0]))
            return
        for start in range(0, len(unique), _KEYS_PER_STATEMENT):
            batch = unique[start : start + _KEYS_PER_STATEMENT]
            await self._rowcount(
                sa.delete(_V).where(*self._agent(_V, agent), sa.tuple_(_V.c.namespace, _V.c.key).in_(batch))
            )

    async def lock(self, agent_id: uuid.UUID | str, keys: Sequence[tuple[str, str]]) -> None:
        """Lock the items at `(namespace, key)`s that exist, in key order, until the unit of work ends.

        Postgres (SQLite writes one transaction at a time).  Every write of
        several items locks them first, and a unit of work that writes in
        several statements locks all its keys at once (passing `locked` to
        them), so two that write the same keys (puts, deletes, refreshes, a
        sweep, in any order) wait for each other instead of deadlocking.
        """
        if self.link.sqlite:
            return
        unique = sorted(set(keys))
        for start in range(0, len(unique), _KEYS_PER_STATEMENT):
            batch = unique[start : start + _KEYS_PER_STATEMENT]
            await self._execute(
                sa.select(_I.c.key)
                .where(*self._agent(_I, agent_id), sa.tuple_(_I.c.namespace, _I.c.key).in_(batch))
                .order_by(_I.c.namespace, _I.c.key)
                .with_for_update()
            )

    async def delete(
        self, agent_id: uuid.UUID | str, keys: Sequence[tuple[str, str]], *, locked: bool = False
    ) -> int:
        """Delete the items at `(namespace, key)`s, with their embeddings; how many there were.

        Several items are locked first (`lock`), unless the caller has (`locked`).
        """
        unique, deleted = sorted(set(keys)), 0
        agent = as_uuid(agent_id, "agent_id")
        if len(unique) > 1 and not locked:
            await self.lock(agent, unique)
        await self._delete_vectors(agent, unique)  # the foreign key would too; this keeps SQLite's work small
        for start in range(0, len(unique), _KEYS_PER_STATEMENT):
            batch = unique[start : start + _KEYS_PER_STATEMENT]
            deleted += await self._rowcount(
                sa.delete(_I).where(*self._agent(_I, agent), sa.tuple_(_I.c.namespace, _I.c.key).in_(batch))
            )
        return deleted

    async def refresh(
        self,
        agent_id: uuid.UUID | str,
        items: Sequence[StoredItem],
        *,
        now: datetime,
        expired: bool = False,
        locked: bool = False,
    ) -> None:
        """Move the expiry of `items` (those with a TTL and not expired) to their TTL from `now`.

        `expired`: expired items not yet swept are moved too (they live again).
        Several items are locked first (`lock`), unless the caller has (`locked`).
        """
        cutoff = _cutoff(now, expired)
        timed = {(item.namespace, item.key) for item in items if item.ttl_minutes is not None}
        if len(timed) > 1 and not locked:
            await self.lock(agent_id, list(timed))
        by_ttl: dict[float, builtins.list[tuple[str, str]]] = {}
        for item in items:
            if item.ttl_minutes is not None:
                by_ttl.setdefault(item.ttl_minutes, []).append((item.namespace, item.key))
        for ttl, pairs in by_ttl.items():
            unique = sorted(set(pairs))
            for start in range(0, len(unique), _KEYS_PER_STATEMENT):
                batch = unique[start : start + _KEYS_PER_STATEMENT]
                await self._rowcount(
                    sa.update(_I)
                    .where(
                        *self._live(agent_id, cutoff),
                        _I.c.ttl_minutes.is_not(None),
                        sa.tuple_(_I.c.namespace, _I.c.key).in_(batch),
                    )
                    .values(expires_at=_expiry(now, ttl))
                )

    async def search(
        self,
        agent_id: uuid.UUID | str,
        prefix: str,
        *,
        where: Mapping[str, Any] | None,
        now: datetime,
        limit: int,
        offset: int,
        query: builtins.list[float] | None = None,
        distance: str = "cosine",
        approximate: bool = False,
        expired: bool = False,
    ) -> builtins.list[StoredItem]:
        """The live items in namespace `prefix` (and below) whose values match `where`.

        `expired`: the expired items that no sweep has deleted yet too.

        Without `query`, newest update first; with it (an embedding), by
        their best field's score (`memorm.search.store_vectors`), then the
        items without embeddings, unscored, newest first (as LangGraph's
        in-memory store).  `approximate`: on Postgres, through the HNSW index
        (`ensure_index`; `memorm.search.store_vectors.nearest_items`).
        """
        size = check_int(limit, "limit", minimum=1, maximum=MAX_PAGE)
        skip = check_int(offset, "offset", minimum=0, maximum=2**62)
        shape, values = value_filter(self.link.dialect.name, where, "filter") if where else ((), {})
        agent = as_uuid(agent_id, "agent_id")
        params = {"tenant": self._owner, "agent": agent, "now": _cutoff(now, expired), **values}
        params.update(_under_values(prefix) if prefix else {})
        if query is None:  # a statement built once per filter's shape, sent on the driver
            async with guarded(self.link):
                rows = await fetch(
                    self.link, _listing(bool(prefix), shape), {**params, "limit": size, "offset": skip}
                )
            return [_item(row) for row in rows]
        conditions, scope = _conditions(bool(prefix), shape)
        async with guarded(self.link):
            hits = await nearest_items(
                self.link,
                conditions,
                scope,
                _READ,
                query,
                params,
                distance=distance,
                limit=size,
                offset=skip,
                approximate=approximate,
            )
        scored = [_item(row, score) for row, score in hits]
        if len(hits) == size:
            return scored
        # Past the scored items come those without embeddings (index=False), unscored, newest first.
        dims = len(query)
        before = skip + len(hits) if hits else await scored_count(self.link, conditions, scope, dims, params)
        statement = (
            sa.select(*_READ)
            .where(*conditions, unscored(self.link, scope, dims))
            .order_by(_I.c.updated_at.desc(), _I.c.namespace, _I.c.key)
            .limit(size - len(hits))
            .offset(max(0, skip - before))
        )
        return scored + [_item(tuple(row)) for row in await self._execute(statement, params)]

    async def ensure_index(
        self, dims: int, distance: str = "cosine", *, m: int = 16, ef_construction: int = 64
    ) -> str:
        """Build the HNSW index for the stores' vectors of `dims` dimensions, if missing; its name.

        Postgres only (a no-op on SQLite, which searches exactly).  One index
        serves every agent's store of that shape and distance; searches that
        ask for it (`approximate`) use it.  Needs the tables' owner, and
        `CREATE INDEX` blocks writes to the table while it builds.
        """
        async with guarded(self.link):
            return await ensure_store_index(self.link, dims, distance, m=m, ef_construction=ef_construction)

    async def has_index(self, dims: int, distance: str = "cosine") -> bool:
        """Whether the HNSW index for this shape and distance exists (never on SQLite)."""
        async with guarded(self.link):
            return await store_index_exists(self.link, dims, distance)

    async def namespaces(
        self,
        agent_id: uuid.UUID | str,
        prefix: str,
        *,
        now: datetime,
        limit: int,
        offset: int = 0,
        after: str | None = None,
        expired: bool = False,
    ) -> builtins.list[str]:
        """The distinct namespaces with live items, at or below `prefix`, in byte order.

        A page: `offset` skips so many; `after` starts after that namespace.
        `expired`: namespaces of expired items not yet swept count too.
        """
        size = check_int(limit, "limit", minimum=1, maximum=MAX_PAGE * 10)
        conditions = [*self._live(agent_id, _cutoff(now, expired)), *under(_I.c.namespace, prefix)]
        if after is not None:
            conditions.append(_I.c.namespace > after)
        statement = (
            sa.select(_I.c.namespace)
            .where(*conditions)
            .group_by(_I.c.namespace)
            .order_by(_I.c.namespace)
            .limit(size)
            .offset(check_int(offset, "offset", minimum=0, maximum=2**62))
        )
        return [row[0] for row in await self._execute(statement)]

    async def sweep(self, agent_id: uuid.UUID | str, *, now: datetime, batch: int = MAX_PAGE) -> int:
        """Delete up to `batch` of the agent's items expired at `now` (with their embeddings); how many."""
        agent = as_uuid(agent_id, "agent_id")
        expired = (
            sa.select(_I.c.namespace, _I.c.key)
            .where(*self._agent(_I, agent), _I.c.expires_at.is_not(None), _I.c.expires_at <= now)
            .limit(batch)
        )
        pairs = [(row[0], row[1]) for row in (tuple(found) for found in await self._execute(expired))]
        return await self.delete(agent, pairs) if pairs else 0
