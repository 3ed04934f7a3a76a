"""LangGraph's long-term store on memorm: [`MemormStore`][memorm.compat.langgraph_store.MemormStore].

A graph's memories that outlive its threads (`store.put(("users", "42"),
"likes", {...})` in a node) are kept in memorm's `graph_store_items`, an
agent's rows like its sessions and passages: deleting the agent, or its
tenant, deletes them; `db.for_tenant` keeps them in a tenant.  With an
`index`, each item's fields are embedded and kept in `graph_store_vectors`
for semantic search (`store.search(ns, query="...")`); they are not
archival passages, and never appear among the agent's.

```python
from memorm.compat.langgraph import MemormSaver, MemormStore

store = MemormStore(db, agent=agent.id, index={"dims": 384, "embed": embed_texts})
graph = builder.compile(checkpointer=MemormSaver(db, agent=agent.id), store=store)
```

The adapter is here; beside it, `langgraph_store_ops` checks a batch's
operations before any statement, `langgraph_store_batch` runs them (its
reads' results from `langgraph_store_reads`) and `langgraph_store_ttl`
sweeps expired items.  Importing `memorm` never imports LangGraph; only
these modules do.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from typing_extensions import Self

from memorm.compat._extras import missing_extra

try:
    from langchain_core.embeddings import Embeddings
    from langgraph.store.base import BaseStore, IndexConfig, Op, Result, TTLConfig
except ImportError as error:
    raise missing_extra(__name__, "langgraph", error) from error

from memorm.compat._open import Opened
from memorm.compat._sync import blocking_flag, run_off_loop
from memorm.compat.langgraph_agent import AgentRef
from memorm.compat.langgraph_store_batch import StoreBatches
from memorm.compat.langgraph_store_ops import (
    CheckedOp,
    InvalidNamespace,
    StoreIndex,
    check_op,
    check_ttl_config,
)
from memorm.compat.langgraph_store_ttl import TTLSweeper, sweep_expired, sweep_seconds
from memorm.concurrency import Merger
from memorm.db import Database
from memorm.errors import ValidationError
from memorm.models import Agent

__all__ = ["AsyncMemormStore", "InvalidNamespace", "MemormStore"]

_AT_ONCE = 4  # calls of a store that run at once on an event loop, before calls wait and merge
_MERGED_MOST = 500  # calls merged into one unit of work at most


class MemormStore(BaseStore):
    """A LangGraph long-term store (`BaseStore`) over a memorm [`Database`][memorm.db.Database].

    Args:
        db: the shared database (a [`for_tenant`][memorm.db.Database.for_tenant]
            view keeps the items in that tenant).  A call is one unit of
            work (calls past four at once merge: `abatch`).
        agent: the memorm agent (or its id) whose store this is.  Deleting the
            agent deletes its items.  One store serves one agent.  None: the
            agent named `"langgraph"` (of the view's tenant), as
            `MemormSaver`'s default: made by the store's first write; reads
            find nothing until then.
        index: LangGraph's `IndexConfig` for semantic search: `dims`, `embed`
            (LangChain `Embeddings`, a sync or async function of a list of
            texts, or a provider string), `fields` (paths to embed; default
            `["$"]`, the whole value) and `distance_type` (`"cosine"`, the
            default, `"inner_product"` or `"l2"`).  Without it `search`
            ignores `query` and lists newest first.
        ttl: LangGraph's `TTLConfig`: `default_ttl` (minutes an item lives
            after its last write, or read with refresh), `refresh_on_read`
            (default True), `sweep_interval_minutes` (of the background
            sweeper, default 5) and `omit_expired`.  As in LangGraph's
            stores, an expired item is still read until a sweep deletes it
            (`start_ttl_sweeper`, or `sweep_ttl` when you choose), unless
            `omit_expired` is True: then reads skip it, and never refresh it.
        allow_blocking: let the sync methods run on a thread whose event
            loop is running, blocking that loop until they are done (as
            LangGraph's `InMemoryStore` runs anywhere).  By default they raise
            `BlockingCallError` (`memorm.compat.langgraph`) there, as LangGraph's `AsyncPostgresStore`
            does (an `asyncio.InvalidStateError`).

    Every operation of LangGraph's `BaseStore` works, async (`aget`, `aput`,
    `asearch` with `filter` and `query`, `alist_namespaces`, `abatch`…) and
    sync from any thread without a running event loop (on memorm's sync
    loop, as `MemormSaver`).  A batch
    is checked whole before any statement (bad namespaces raise
    `InvalidNamespace`, both memorm's `ValidationError` and LangGraph's
    `InvalidNamespaceError`; other bad input `ValidationError`), embeds
    outside any transaction, then runs its reads and then its writes in one
    unit of work.  Filters take values and `$eq`, `$ne`, `$gt`, `$gte`,
    `$lt`, `$lte` on top-level keys (`memorm.search.filters`).

    Example:
        ```python
        store = MemormStore(db, agent=agent.id, ttl={"default_ttl": 60 * 24})
        await store.aput(("users", "42"), "food", {"likes": "pizza"})
        item = await store.aget(("users", "42"), "food")
        ```
    """

    supports_ttl = True

    # What a refused sync call says to do where a graph's node called it (`run_off_loop`).
    blocking_hint = (
        "; a graph on this loop (a notebook, an async server): await graph.ainvoke() or graph.astream()"
    )

    def __init__(
        self,
        db: Database,
        *,
        agent: Agent | uuid.UUID | str | None = None,
        index: IndexConfig | Mapping[str, Any] | None = None,
        ttl: TTLConfig | Mapping[str, Any] | None = None,
        allow_blocking: bool = False,
    ) -> None:
        if not isinstance(db, Database):
            raise ValidationError(f"db: expected a memorm Database, got {type(db).__name__}")
        self.db = db
        self._agent = AgentRef(agent, "store")
        self._index = None if index is None else StoreIndex(index)
        self.index_config: dict[str, Any] | None = None if index is None else dict(index)
        self.embeddings: Embeddings | None = None if self._index is None else self._index.embeddings
        self.ttl_config = check_ttl_config(ttl)
        self.allow_blocking = blocking_flag(allow_blocking)
        self._batches = StoreBatches(self._agent, self._index, lambda: self._omit_expired)
        self._merged = Merger(self._run_merged, width=_AT_ONCE, most=_MERGED_MOST)
        self._sweeper = TTLSweeper(repr(self), self._agent.find)

    def __repr__(self) -> str:
        return f"MemormStore(agent={self._agent})"

    @property
    def agent_id(self) -> uuid.UUID:
        """The id of the agent whose store this is.

        Raises:
            NotFoundError: the store was given no agent, and no call has yet
                found or made its default agent (`DEFAULT_AGENT`).
        """
        return self._agent.id

    # -- the batch ------------------------------------------------------------------

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Run `ops` (GetOp, PutOp, SearchOp, ListNamespacesOp); their results in order.

        Checked first, alone.  Up to four calls of a store run at once on an
        event loop, each in its own unit of work; calls that come while four
        run wait, and run next merged into one unit of work (as LangGraph's
        `AsyncBatchedBaseStore` merges concurrent calls): `concurrency.Merger`.
        """
        checked = [check_op(op, index, self._index) for index, op in enumerate(ops)]
        return await self._merged(checked)

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """`abatch` for sync code, on memorm's sync loop (from any thread without a running loop)."""
        listed = list(ops)
        return run_off_loop(self, "batch", lambda _: self.abatch(listed))

    async def _run_merged(self, calls: list[list[CheckedOp]]) -> list[list[Result]]:
        """The results of calls run together (`Merger`): their operations as one batch."""
        return await self._batches.run_merged(self.db, calls)

    @property
    def _omit_expired(self) -> bool:
        """Whether reads skip expired items not yet swept (read per call, as LangGraph's)."""
        config = self.ttl_config
        return bool(config and config.get("omit_expired"))

    @classmethod
    def from_conn_string(cls, url: str | None = None, **options: Any) -> Opened[Self]:
        """A store on a `Database` of its own at `url`, for a `with` or `async with` block.

        As LangGraph's stores' `from_conn_string`: the block closes the
        database's connections as it ends.  `options` are the store's
        (`agent`, `index`, `ttl`, ...).
        """
        return Opened(url, lambda db: cls(db, **options))

    async def asetup(self, *, m: int | None = None, ef_construction: int | None = None) -> None:
        """Build the HNSW index that searches by query use on Postgres (as the tables' owner).

        For a store with an `index` config; nothing to do otherwise, on
        SQLite (which searches exactly), or for an index config whose
        `ann_index_config` says `"kind": "flat"`.  `m` and `ef_construction`
        default to the `ann_index_config`'s (else 16 and 64, pgvector's).  Idempotent: run it at deploy time,
        beside `db.upgrade()`.  A search through the index is approximate
        (pgvector's HNSW); a page the index's candidates do not fill (a
        selective filter, a small namespace) is searched again exactly.
        Without the index every search is exact, and grows with the items
        under the namespace prefix searched.
        """
        if self._index is None or not self._index.approximate:
            return
        build = self._index.build
        async with self.db.unit_of_work() as uow:
            await uow.graph_store.ensure_index(
                self._index.dims,
                self._index.distance,
                m=build["m"] if m is None else m,
                ef_construction=build["ef_construction"] if ef_construction is None else ef_construction,
            )
        self._batches.indexed = self.db.dialect != "sqlite"

    def setup(self, *, m: int | None = None, ef_construction: int | None = None) -> None:
        """`asetup` for sync code."""
        run_off_loop(self, "setup", lambda _: self.asetup(m=m, ef_construction=ef_construction))

    async def asweep_ttl(self) -> int:
        """Delete the agent's expired items (with their embeddings), in batches; how many."""
        agent = await self._agent.find(self.db)
        return 0 if agent is None else await sweep_expired(self.db, agent)

    def sweep_ttl(self) -> int:
        """`asweep_ttl` for sync code."""
        return run_off_loop(self, "sweep_ttl", lambda _: self.asweep_ttl())

    # -- the background sweeper (`memorm.compat.langgraph_store_ttl`) ------------------

    def start_ttl_sweeper(
        self, sweep_interval_minutes: float | None = None
    ) -> concurrent.futures.Future[None]:
        """Sweep expired items every `sweep_interval_minutes` (or the config's, or 5) on memorm's sync loop.

        As LangGraph's `PostgresStore.start_ttl_sweeper`: a future that is
        done when the sweeper stops (cancel it, or `stop_ttl_sweeper`);
        without a TTL config, a finished one.  A sweep that fails is logged
        (`memorm.compat.langgraph_store`) and the next one tried.  Stop the
        sweeper before disposing the database.
        """
        return self._sweeper.start(self.db, sweep_seconds(self.ttl_config, sweep_interval_minutes))

    async def astart_ttl_sweeper(self, sweep_interval_minutes: float | None = None) -> asyncio.Task[None]:
        """`start_ttl_sweeper` as a task on the running loop (as `AsyncPostgresStore.start_ttl_sweeper`).

        The task ends when cancelled or stopped (`astop_ttl_sweeper`), or with its loop.
        """
        return await self._sweeper.astart(self.db, sweep_seconds(self.ttl_config, sweep_interval_minutes))

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        """Stop the sweeper and wait up to `timeout` seconds (None: until it has); whether it has stopped.

        On the thread of a running event loop it asks the sweeper to stop and
        returns at once, without blocking that loop.
        """
        return self._sweeper.stop(timeout)

    async def astop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        """`stop_ttl_sweeper` for async code: waits (up to `timeout` seconds) without blocking the loop."""
        return await self._sweeper.astop(timeout)


class AsyncMemormStore(MemormStore):
    """A `MemormStore` whose `setup` and sweeper switches are coroutines, as `AsyncPostgresStore`'s.

    For code written against LangGraph's async Postgres store
    (`await store.setup()`, `await store.start_ttl_sweeper()`,
    `await store.stop_ttl_sweeper()`).  The rest is `MemormStore`'s.
    """

    async def setup(  # type: ignore[override]
        self, *, m: int | None = None, ef_construction: int | None = None
    ) -> None:
        """`asetup`."""
        await self.asetup(m=m, ef_construction=ef_construction)

    async def start_ttl_sweeper(  # type: ignore[override]
        self, sweep_interval_minutes: float | None = None
    ) -> asyncio.Task[None]:
        """`astart_ttl_sweeper`: a task on the running loop."""
        return await self.astart_ttl_sweeper(sweep_interval_minutes)

    async def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:  # type: ignore[override]
        """`astop_ttl_sweeper`."""
        return await self.astop_ttl_sweeper(timeout)
