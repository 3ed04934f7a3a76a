"""How `MemormStore` runs a checked batch: embeds outside any transaction, then reads and writes in one.

`StoreBatches.run` takes the operations `check_op` let through
(`memorm.compat.langgraph_store_ops`): the last write to each key wins; the
puts' texts and the searches' queries are embedded first; then one unit of
work runs the reads and then the writes, every key written or refreshed
locked at once in key order.  A batch that Postgres aborts to break a
deadlock runs again.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import datetime

from memorm.compat._extras import missing_extra

try:
    from langgraph.store.base import GetOp, ListNamespacesOp, Result, SearchOp
except ImportError as error:
    raise missing_extra(__name__, "langgraph", error) from error

from memorm.compat.langgraph_agent import AgentRef
from memorm.compat.langgraph_store_ops import CheckedOp, CheckedPut, StoreIndex
from memorm.compat.langgraph_store_reads import as_item, as_search_item, list_namespaces
from memorm.db import Database
from memorm.errors import ConflictError, ValidationError
from memorm.repositories.store_items import NewItem, StoredItem
from memorm.translate import transient
from memorm.types import utcnow
from memorm.uow import UnitOfWork
from memorm.validation import check_vector

__all__ = ["StoreBatches"]

_ATTEMPTS = 5  # runs of a batch that Postgres aborts to break a deadlock

_Vectors = dict[tuple[str, str], dict[str, list[float]]]  # the embeddings of each put, by field


class StoreBatches:
    """Runs checked batches of one agent's store (`MemormStore`'s `abatch`, merged by its `Merger`).

    Args:
        agent: the agent whose store this is (the default one: found, or made by a write, by the
            first batch).
        index: the store's checked `IndexConfig` (None: no embeddings).
        omit_expired: whether reads skip expired items not yet swept, asked per
            run (the store's `ttl_config` may change, as LangGraph's).
    """

    def __init__(self, agent: AgentRef, index: StoreIndex | None, omit_expired: Callable[[], bool]) -> None:
        self.agent = agent
        self.index = index
        self.omit_expired = omit_expired
        # Whether the HNSW index for this store's shape exists (Postgres): asked once, on the first search.
        self.indexed: bool | None = None

    @property
    def agent_id(self) -> uuid.UUID:
        """The agent whose store this is (`AgentRef.id`)."""
        return self.agent.id

    async def run_merged(self, db: Database, calls: list[list[CheckedOp]]) -> list[list[Result]]:
        """The results of calls run together (`Merger`): their operations as one batch.

        Without an agent yet (the default one), a write makes it; reads find nothing.
        """
        writes = any(isinstance(op, CheckedPut) for call in calls for op in call)
        if await self.agent.find(db, make=writes) is None:
            return [
                [[] if isinstance(op, (SearchOp, ListNamespacesOp)) else None for op in call]
                for call in calls
            ]
        results = await self.run(db, [op for call in calls for op in call])
        split, start = [], 0
        for call in calls:
            split.append(results[start : start + len(call)])
            start += len(call)
        return split

    async def run(self, db: Database, checked: list[CheckedOp]) -> list[Result]:
        """Run checked operations in one unit of work: the reads, then the writes (the last to a key wins)."""
        puts: dict[tuple[str, str], CheckedPut] = {}  # the last write to each key wins
        for op in checked:
            if isinstance(op, CheckedPut):
                key = (op.item[0], op.item[1])
                puts.pop(key, None)
                puts[key] = op
        vectors = await self._embed_puts(list(puts.values()))
        queries = await self._embed_queries([op for op in checked if isinstance(op, SearchOp)])
        attempt = 1
        while True:
            try:
                return await self._transact(db, checked, puts, vectors, queries)
            except ConflictError as error:  # a deadlock with another writer of these keys: run it again
                if not transient(error) or attempt == _ATTEMPTS:
                    raise
                attempt += 1

    async def _transact(
        self,
        db: Database,
        checked: list[CheckedOp],
        puts: dict[tuple[str, str], CheckedPut],
        vectors: _Vectors,
        queries: dict[int, list[float]],
    ) -> list[Result]:
        """The statements of `run`: its reads, then its writes, in one unit of work."""
        now, expired = utcnow(), not self.omit_expired()
        results: list[Result] = [None] * len(checked)
        refresh: list[StoredItem] = []
        # One item stored (the common `aput`): the put's one driver call commits with it.
        alone = (
            len(checked) == 1 and isinstance(checked[0], CheckedPut) and isinstance(checked[0].item, NewItem)
        )
        unit = UnitOfWork(db.backend, tenant=db.tenant, one_statement=True) if alone else None
        async with unit or db.unit_of_work(read_only=not puts) as uow:
            for position, op in enumerate(checked):
                if not isinstance(op, CheckedPut):
                    found = await self._read(uow, op, queries.get(id(op)), now, expired, refresh)
                    results[position] = found
            if puts:
                # Every key written or refreshed, locked at once in key order (no deadlocks).
                timed = [(item.namespace, item.key) for item in refresh if item.ttl_minutes is not None]
                keys = {*puts, *timed}
                if len(keys) > 1:
                    await uow.graph_store.lock(self.agent_id, list(keys))
                if refresh:
                    await uow.graph_store.refresh(
                        self.agent_id, refresh, now=now, expired=expired, locked=True
                    )
                    refresh = []
                await self._write(uow, list(puts.values()), vectors, now)
        if refresh:
            async with db.unit_of_work() as uow:
                await uow.graph_store.refresh(self.agent_id, refresh, now=now, expired=expired)
        return results

    # -- embeddings (outside any transaction) -----------------------------------------

    async def _embed_puts(self, puts: list[CheckedPut]) -> _Vectors:
        wanted = [(put, field, text) for put in puts for field, text in put.texts.items()]
        if not wanted or self.index is None:
            return {}
        unique = list(dict.fromkeys(text for _, _, text in wanted))
        found = await self.index.embeddings.aembed_documents(unique)
        if not isinstance(found, Sequence) or len(found) != len(unique):
            raise ValidationError(f"index.embed: expected {len(unique)} embeddings, got {len(found)}")
        by_text = {
            text: self._vector(vector, "index.embed") for text, vector in zip(unique, found, strict=True)
        }
        vectors: _Vectors = {}
        for put, field, text in wanted:
            vectors.setdefault((put.item[0], put.item[1]), {})[field] = by_text[text]
        return vectors

    async def _embed_queries(self, searches: list[SearchOp]) -> dict[int, list[float]]:
        found: dict[int, list[float]] = {}
        if self.index is None:
            return found
        for op in searches:
            if op.query:
                found[id(op)] = self._vector(
                    await self.index.embeddings.aembed_query(op.query), "index.embed"
                )
        return found

    def _vector(self, vector: object, field: str) -> list[float]:
        assert self.index is not None
        checked = check_vector(vector, field)
        if len(checked) != self.index.dims:
            raise ValidationError(
                f"{field}: an embedding of {len(checked)} dimensions; index.dims is {self.index.dims}"
            )
        return checked

    # -- the work ---------------------------------------------------------------------

    async def _read(
        self,
        uow: UnitOfWork,
        op: GetOp | SearchOp | ListNamespacesOp,
        query: list[float] | None,
        now: datetime,
        expired: bool,
        refresh: list[StoredItem],
    ) -> Result:
        """`op`'s result (`expired`: unswept expired items are read too); items to refresh join `refresh`."""
        store = uow.graph_store
        if isinstance(op, GetOp):
            keys = [(".".join(op.namespace), op.key)]
            found = await store.get(self.agent_id, keys, now=now, expired=expired)
            stored = next(iter(found.values()), None)
            if stored is None:
                return None
            # BaseStore.get resolved refresh_ttl from ttl.refresh_on_read, unless given.
            if op.refresh_ttl and stored.ttl_minutes is not None:
                refresh.append(stored)
            return as_item(stored)
        if isinstance(op, SearchOp):
            if op.limit == 0:
                return []
            approximate = False
            if query is not None and self.index is not None:
                if self.indexed is None:
                    self.indexed = await store.has_index(self.index.dims, self.index.distance)
                approximate = self.indexed
            hits = await store.search(
                self.agent_id,
                ".".join(op.namespace_prefix),
                where=op.filter,
                now=now,
                limit=op.limit,
                offset=op.offset,
                query=query,
                distance=self.index.distance if self.index is not None else "cosine",
                approximate=approximate,
                expired=expired,
            )
            if op.refresh_ttl:
                refresh += [hit for hit in hits if hit.ttl_minutes is not None]
            return [as_search_item(hit) for hit in hits]
        return await list_namespaces(store, self.agent_id, op, now, expired)

    async def _write(self, uow: UnitOfWork, puts: list[CheckedPut], vectors: _Vectors, now: datetime) -> None:
        store = uow.graph_store
        deleted = [(put.item[0], put.item[1]) for put in puts if not isinstance(put.item, NewItem)]
        items = [
            put.item._replace(vectors=vectors.get((put.item.namespace, put.item.key)))
            for put in puts
            if isinstance(put.item, NewItem)
        ]
        if deleted:
            await store.delete(self.agent_id, deleted, locked=True)  # (`run` has locked them)
        if items:
            await store.put(self.agent_id, items, now=now, locked=True)
