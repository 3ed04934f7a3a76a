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
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql import ColumnElement

from memorm.driver import Insert, fetch, insert_many
from memorm.errors import NotFoundError
from memorm.models import STORE_ITEMS, STORE_VECTORS
from memorm.repositories.base import Repository
from memorm.repositories.session_locks import writes_in_one_statement
from memorm.repositories.store_items import NewItem, StoredItem, expiry_at, read_cutoff
from memorm.repositories.store_statements import (
    DELETE_VECTORS_OF,
    GET_ONE,
    ITEM_COLUMNS,
    PUT_ONE,
    READ,
    VECTOR_COLUMNS,
    listing_statement,
    lock_statement,
    needs_row_locks,
    search_conditions,
    stored_item,
    under,
    under_values,
)
from memorm.search.filters import value_filter
from memorm.search.store_index import ensure_store_index, store_index_exists
from memorm.search.store_vectors import nearest_items, scored_count, unscored
from memorm.translate import check_writable, guarded
from memorm.validation import MAX_PAGE, as_uuid, check_int

__all__ = ["StoreRepository"]

_I, _V = STORE_ITEMS, STORE_VECTORS
_KEYS_PER_STATEMENT = 500  # (namespace, key) pairs per IN list


class StoreRepository(Repository):
    """An agent's long-term store: items under namespaces and keys, their embeddings, their expiry."""

    def _agent(self, table: sa.Table, agent_id: uuid.UUID | str) -> list[ColumnElement[bool]]:
        return [*self._tenant_filter(table), table.c.agent_id == as_uuid(agent_id, "agent_id")]

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
        now = read_cutoff(now, expired)
        if len(wanted) == 1:  # one get: the statement built once
            (namespace, key), agent = wanted[0], as_uuid(agent_id, "agent_id")
            params = {
                "tenant": self._required_tenant,
                "agent": agent,
                "namespace": namespace,
                "key": key,
                "now": now,
            }
            async with guarded(self.link):
                for row in await fetch(self.link, GET_ONE, params):
                    found[row[0], row[1]] = stored_item(row)
            return found
        for start in range(0, len(wanted), _KEYS_PER_STATEMENT):
            batch = wanted[start : start + _KEYS_PER_STATEMENT]
            query = sa.select(*READ).where(
                *self._live(agent_id, now), sa.tuple_(_I.c.namespace, _I.c.key).in_(batch)
            )
            rows: builtins.list[Any] = [tuple(row) for row in await self._execute(query)]
            for row in rows:
                found[row[0], row[1]] = stored_item(row)
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
        owner, agent = self._required_tenant, as_uuid(agent_id, "agent_id")
        first = items[0]
        if len(items) == 1 and writes_in_one_statement(self.link):
            # One statement, one round trip (alone in its unit of work: no BEGIN/COMMIT either).
            params = {
                "tenant": owner,
                "agent": agent,
                "namespace": first.namespace,
                "key": first.key,
                "value": first.value,
                "now": now,
                "expires_at": expiry_at(now, first.ttl_minutes),
                "ttl_minutes": first.ttl_minutes,
                "fields": list(first.vectors or {}),
                "embeddings": list((first.vectors or {}).values()),
            }
            check_writable(self.link)
            try:
                async with guarded(self.link):
                    await fetch(self.link, PUT_ONE, params)
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
                expiry_at(now, item.ttl_minutes),
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
        drop = None if len(pairs) > 1 else (DELETE_VECTORS_OF, self._one_item(agent, *pairs[0]))
        try:
            await insert_many(
                self.link,
                [
                    Insert(_I, ITEM_COLUMNS, rows, "update", keep=("created_at",)),
                    Insert(_V, VECTOR_COLUMNS, vectors, "update"),
                ],
                first=drop,
            )
        except NotFoundError as error:  # the items' one foreign key: their agent
            raise NotFoundError(f"no agent {agent}") from error

    def _one_item(self, agent: uuid.UUID, namespace: str, key: str) -> dict[str, Any]:
        """The parameters of `DELETE_VECTORS_OF`: one item of the agent's."""
        return {"tenant": self._required_tenant, "agent": agent, "namespace": namespace, "key": key}

    async def _delete_vectors(self, agent: uuid.UUID, pairs: Sequence[tuple[str, str]]) -> None:
        unique = sorted(set(pairs))
        if len(unique) == 1:  # one item: the statement built once
            check_writable(self.link)
            async with guarded(self.link):
                await fetch(self.link, DELETE_VECTORS_OF, self._one_item(agent, *unique[0]))
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
        if not needs_row_locks(self.link):
            return
        unique = sorted(set(keys))
        for start in range(0, len(unique), _KEYS_PER_STATEMENT):
            batch = unique[start : start + _KEYS_PER_STATEMENT]
            await self._execute(lock_statement(self._agent(_I, agent_id), batch))

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
        cutoff = read_cutoff(now, expired)
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
                    .values(expires_at=expiry_at(now, ttl))
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
        params = {"tenant": self._required_tenant, "agent": agent, "now": read_cutoff(now, expired), **values}
        params.update(under_values(prefix) if prefix else {})
        if query is None:  # a statement built once per filter's shape, sent on the driver
            async with guarded(self.link):
                rows = await fetch(
                    self.link,
                    listing_statement(bool(prefix), shape),
                    {**params, "limit": size, "offset": skip},
                )
            return [stored_item(row) for row in rows]
        conditions, scope = search_conditions(bool(prefix), shape)
        async with guarded(self.link):
            hits = await nearest_items(
                self.link,
                conditions,
                scope,
                READ,
                query,
                params,
                distance=distance,
                limit=size,
                offset=skip,
                approximate=approximate,
            )
        scored = [stored_item(row, score) for row, score in hits]
        if len(hits) == size:
            return scored
        # Past the scored items come those without embeddings (index=False), unscored, newest first.
        dims = len(query)
        before = skip + len(hits) if hits else await scored_count(self.link, conditions, scope, dims, params)
        statement = (
            sa.select(*READ)
            .where(*conditions, unscored(self.link, scope, dims))
            .order_by(_I.c.updated_at.desc(), _I.c.namespace, _I.c.key)
            .limit(size - len(hits))
            .offset(max(0, skip - before))
        )
        return scored + [stored_item(tuple(row)) for row in await self._execute(statement, params)]

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
        conditions = [*self._live(agent_id, read_cutoff(now, expired)), *under(_I.c.namespace, prefix)]
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
