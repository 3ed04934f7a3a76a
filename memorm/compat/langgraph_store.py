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

Importing `memorm` never imports LangGraph; only this module does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import logging
import threading
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, cast

import anyio

from memorm.compat._extras import missing_extra

try:
    from langchain_core.embeddings import Embeddings
    from langgraph.store.base import (
        BaseStore,
        GetOp,
        IndexConfig,
        InvalidNamespaceError,
        Item,
        ListNamespacesOp,
        MatchCondition,
        Op,
        PutOp,
        Result,
        SearchItem,
        SearchOp,
        TTLConfig,
        ensure_embeddings,
        get_text_at_path,
        tokenize_path,
    )
except ImportError as error:
    raise missing_extra(__name__, "langgraph", error) from error

from memorm.compat._sync import BRIDGE, blocking_flag, run_off_loop
from memorm.concurrency import Merger, protect
from memorm.db import Database
from memorm.errors import ConflictError, MemormError, ValidationError
from memorm.models import Agent
from memorm.repositories.store import MAX_KEY_BYTES, NewItem, StoredItem, check_minutes
from memorm.search.filters import check_value_filter
from memorm.search.store_vectors import DISTANCES
from memorm.translate import transient
from memorm.types import utcnow
from memorm.uow import UnitOfWork
from memorm.validation import MAX_DIMENSIONS, MAX_PAGE, as_uuid, check_json_object, check_text, check_vector

__all__ = ["InvalidNamespace", "MemormStore"]

_LIST_PAGE = 1000  # namespaces read at a time when a listing filters them in Python
_SWEEP_BATCH = 1000  # expired items deleted per transaction by a sweep
_AT_ONCE = 4  # calls of a store that run at once on an event loop, before calls wait and merge
_MERGED_MOST = 500  # calls merged into one unit of work at most
_ATTEMPTS = 5  # runs of a batch that Postgres aborts to break a deadlock
_SWEEP_EVERY = 5.0  # minutes between the sweeper's sweeps, unless the TTL config or the call says

_log = logging.getLogger(__name__)


class InvalidNamespace(ValidationError, InvalidNamespaceError):
    """A namespace LangGraph refuses: memorm's `ValidationError` and LangGraph's `InvalidNamespaceError`."""


def _labels(namespace: object, field: str) -> tuple[str, ...]:
    if not isinstance(namespace, (tuple, list)):
        raise InvalidNamespace(f"{field}: expected a tuple of labels, got {type(namespace).__name__}")
    for label in namespace:
        if not isinstance(label, str):
            raise InvalidNamespace(
                f"{field}: a label is a string, got {type(label).__name__} in {namespace!r}"
            )
        if not label or "." in label or "\x00" in label:
            raise InvalidNamespace(
                f"{field}: labels are non-empty, without '.' or NUL; got {label!r} in {namespace!r}"
            )
        check_text(label, field)
    joined = ".".join(namespace)
    if len(joined.encode()) > MAX_KEY_BYTES:
        raise InvalidNamespace(f"{field}: a namespace is at most {MAX_KEY_BYTES} bytes joined")
    return tuple(namespace)


def _key(key: object) -> str:
    if not isinstance(key, str):
        raise ValidationError(f"key: expected a string, got {type(key).__name__}")
    check_text(key, "key")
    if len(key.encode()) > MAX_KEY_BYTES:
        raise ValidationError(f"key: at most {MAX_KEY_BYTES} bytes")
    return key


def _count(value: object, field: str, *, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ValidationError(f"{field}: expected an integer from {minimum} to {maximum}, got {value!r:.80}")
    return int(value)


def _ttl_config(ttl: object) -> TTLConfig | None:
    if ttl is None:
        return None
    if not isinstance(ttl, Mapping):
        raise ValidationError(f"ttl: expected a TTLConfig dict, got {type(ttl).__name__}")
    known = {"default_ttl", "refresh_on_read", "sweep_interval_minutes", "omit_expired"}
    unknown = set(ttl) - known
    if unknown:
        raise ValidationError(f"ttl: unknown keys {sorted(map(str, unknown))}")
    config = cast("TTLConfig", dict(ttl))
    check_minutes(config.get("default_ttl"), "ttl.default_ttl")
    check_minutes(config.get("sweep_interval_minutes"), "ttl.sweep_interval_minutes")
    for flag in ("refresh_on_read", "omit_expired"):
        if not isinstance(config.get(flag, False), bool):
            raise ValidationError(f"ttl.{flag}: expected a bool")
    return config


class _Sweeper:
    """A running TTL sweeper: its task (on the caller's loop or memorm's sync loop)."""

    __slots__ = ("ended", "handle", "task")

    def __init__(
        self, task: asyncio.Task[None], handle: asyncio.Task[None] | concurrent.futures.Future[None]
    ) -> None:
        self.task = task
        self.handle = handle  # what the start method returned
        self.ended = threading.Event()
        task.add_done_callback(lambda _: self.ended.set())

    def stop(self) -> None:
        """Cancel the task (a sweep under way finishes first), from any thread."""
        try:
            self.task.get_loop().call_soon_threadsafe(self.task.cancel)
        except RuntimeError:  # its loop has closed: the task is gone with it
            self.ended.set()


class _Index:
    """A checked `IndexConfig`: dimensions, embeddings, fields (tokenized) and distance."""

    def __init__(self, index: object) -> None:
        if not isinstance(index, Mapping):
            raise ValidationError(f"index: expected an IndexConfig dict, got {type(index).__name__}")
        self.dims = _count(index.get("dims"), "index.dims", minimum=1, maximum=MAX_DIMENSIONS)
        if index.get("embed") is None:
            raise ValidationError(
                "index.embed: expected Embeddings, an embedding function or a provider string"
            )
        try:
            embeddings = ensure_embeddings(index["embed"])
        except (ValueError, TypeError, ImportError) as error:
            raise ValidationError(f"index.embed: {error}") from error
        self.embeddings: Embeddings = embeddings
        fields = index.get("fields") or ["$"]
        if isinstance(fields, str) or not isinstance(fields, Sequence):
            raise ValidationError("index.fields: expected a list of field paths")
        self.fields = [(path, _path(path, "index.fields")) for path in fields]
        distance = index.get("distance_type", "cosine")
        if distance not in DISTANCES:
            raise ValidationError(f"index.distance_type: expected one of {', '.join(DISTANCES)}")
        self.distance: str = distance


def _path(path: object, field: str) -> str | list[str]:
    if not isinstance(path, str) or not path:
        raise ValidationError(f"{field}: a field path is a non-empty string, got {path!r:.80}")
    check_text(path, field)
    if path == "$":
        return path
    try:
        return tokenize_path(path)
    except (ValueError, IndexError) as error:
        raise ValidationError(f"{field}: {path!r} is not a field path: {error}") from error


class _Put:
    """A checked PutOp: an item to store (with the texts to embed), or a key to delete."""

    __slots__ = ("item", "texts")

    def __init__(self, item: NewItem | tuple[str, str], texts: dict[str, str]) -> None:
        self.item = item
        self.texts = texts


_Checked = GetOp | SearchOp | ListNamespacesOp | _Put  # an operation, checked (a put as `_Put`)


class MemormStore(BaseStore):
    """A LangGraph long-term store (`BaseStore`) over a memorm [`Database`][memorm.db.Database].

    Args:
        db: the shared database (a [`for_tenant`][memorm.db.Database.for_tenant]
            view keeps the items in that tenant).  A call is one unit of
            work (calls past four at once merge: `abatch`).
        agent: the memorm agent (or its id) whose store this is.  Deleting the
            agent deletes its items.  One store serves one agent.
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

    def __init__(
        self,
        db: Database,
        *,
        agent: Agent | uuid.UUID | str,
        index: IndexConfig | Mapping[str, Any] | None = None,
        ttl: TTLConfig | Mapping[str, Any] | None = None,
        allow_blocking: bool = False,
    ) -> None:
        if not isinstance(db, Database):
            raise ValidationError(f"db: expected a memorm Database, got {type(db).__name__}")
        self.db = db
        self.agent_id = as_uuid(agent.id if isinstance(agent, Agent) else agent, "agent")
        self._index = None if index is None else _Index(index)
        self.index_config: dict[str, Any] | None = None if index is None else dict(index)
        self.embeddings: Embeddings | None = None if self._index is None else self._index.embeddings
        self.ttl_config = _ttl_config(ttl)
        self.allow_blocking = blocking_flag(allow_blocking)
        self._merged = Merger(self._run_merged, width=_AT_ONCE, most=_MERGED_MOST)
        self._sweeper: _Sweeper | None = None
        self._sweeper_lock = threading.Lock()
        # Whether the HNSW index for this store's shape exists (Postgres): asked once, on the first search.
        self._indexed: bool | None = None

    def __repr__(self) -> str:
        return f"MemormStore(agent={self.agent_id})"

    # -- the batch ------------------------------------------------------------------

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Run `ops` (GetOp, PutOp, SearchOp, ListNamespacesOp); their results in order.

        Checked first, alone.  Up to four calls of a store run at once on an
        event loop, each in its own unit of work; calls that come while four
        run wait, and run next merged into one unit of work (as LangGraph's
        `AsyncBatchedBaseStore` merges concurrent calls): `concurrency.Merger`.
        """
        checked = [self._check(op, index) for index, op in enumerate(ops)]
        return await self._merged(checked)

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """`abatch` for sync code, on memorm's sync loop (from any thread without a running loop)."""
        listed = list(ops)
        return run_off_loop(self, "batch", lambda _: self.abatch(listed))

    @property
    def _omit_expired(self) -> bool:
        """Whether reads skip expired items not yet swept (read per call, as LangGraph's)."""
        config = self.ttl_config
        return bool(config and config.get("omit_expired"))

    async def asetup(self, *, m: int = 16, ef_construction: int = 64) -> None:
        """Build the HNSW index that searches by query use on Postgres (as the tables' owner).

        For a store with an `index` config; nothing to do otherwise, or on
        SQLite (which searches exactly).  Idempotent: run it at deploy time,
        beside `db.upgrade()`.  A search through the index is approximate
        (pgvector's HNSW); a page the index's candidates do not fill (a
        selective filter, a small namespace) is searched again exactly.
        Without the index every search is exact, and grows with the items
        under the namespace prefix searched.
        """
        if self._index is None:
            return
        async with self.db.unit_of_work() as uow:
            await uow.graph_store.ensure_index(
                self._index.dims, self._index.distance, m=m, ef_construction=ef_construction
            )
        self._indexed = self.db.dialect != "sqlite"

    def setup(self, *, m: int = 16, ef_construction: int = 64) -> None:
        """`asetup` for sync code."""
        run_off_loop(self, "setup", lambda _: self.asetup(m=m, ef_construction=ef_construction))

    async def asweep_ttl(self) -> int:
        """Delete the agent's expired items (with their embeddings), in batches; how many."""
        return await self._sweep(self.db)

    def sweep_ttl(self) -> int:
        """`asweep_ttl` for sync code."""
        return run_off_loop(self, "sweep_ttl", self._sweep)

    # -- the background sweeper -------------------------------------------------------

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
        seconds = self._sweep_seconds(sweep_interval_minutes)
        if seconds is None:
            finished: concurrent.futures.Future[None] = concurrent.futures.Future()
            finished.set_result(None)
            return finished
        with self._sweeper_lock:
            running = self._running_sweeper("start_ttl_sweeper")
            if running is not None:
                return cast("concurrent.futures.Future[None]", running.handle)
            task = BRIDGE.spawn(self.db, lambda db: self._sweep_every(db, seconds))
            future: concurrent.futures.Future[None] = concurrent.futures.Future()
            sweeper = self._sweeper = _Sweeper(task, future)
        task.add_done_callback(lambda done: _settle(future, done))
        future.add_done_callback(lambda done: sweeper.stop() if done.cancelled() else None)
        return future

    async def astart_ttl_sweeper(self, sweep_interval_minutes: float | None = None) -> asyncio.Task[None]:
        """`start_ttl_sweeper` as a task on the running loop (as `AsyncPostgresStore.start_ttl_sweeper`).

        The task ends when cancelled or stopped (`astop_ttl_sweeper`), or with its loop.
        """
        seconds = self._sweep_seconds(sweep_interval_minutes)
        loop = asyncio.get_running_loop()
        if seconds is None:
            return loop.create_task(asyncio.sleep(0))
        with self._sweeper_lock:
            running = self._running_sweeper("astart_ttl_sweeper")
            if running is not None:
                return cast("asyncio.Task[None]", running.handle)
            task = loop.create_task(self._sweep_every(self.db, seconds), name="memorm-ttl-sweeper")
            self._sweeper = _Sweeper(task, task)
        return task

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        """Stop the sweeper and wait up to `timeout` seconds (None: until it has); whether it has stopped.

        On the thread of a running event loop it asks the sweeper to stop and
        returns at once, without blocking that loop.
        """
        sweeper = self._sweeper
        if sweeper is None:
            return True
        sweeper.stop()
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            sweeper.ended.wait(timeout)
        return self._stopped(sweeper)

    async def astop_ttl_sweeper(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109 (LangGraph's)
        """`stop_ttl_sweeper` for async code: waits (up to `timeout` seconds) without blocking the loop."""
        sweeper = self._sweeper
        if sweeper is None:
            return True
        sweeper.stop()
        if sweeper.task.get_loop() is asyncio.get_running_loop():
            await asyncio.wait({sweeper.task}, timeout=timeout)
        else:
            with anyio.move_on_after(timeout):
                await anyio.to_thread.run_sync(sweeper.ended.wait, abandon_on_cancel=True)
        return self._stopped(sweeper)

    def _sweep_seconds(self, minutes: float | None) -> float | None:
        """The sweeper's period, checked; None when the store has no TTL config (nothing to sweep)."""
        checked = check_minutes(minutes, "sweep_interval_minutes")
        if self.ttl_config is None:
            return None
        configured = self.ttl_config.get("sweep_interval_minutes")
        return 60 * (checked or check_minutes(configured, "ttl.sweep_interval_minutes") or _SWEEP_EVERY)

    def _running_sweeper(self, method: str) -> _Sweeper | None:
        """The sweeper still running, if `method` may return it (started the same way)."""
        running = self._sweeper
        if running is None or running.ended.is_set():
            return None
        if isinstance(running.handle, asyncio.Task) != method.startswith("a"):
            other = "astart_ttl_sweeper" if method == "start_ttl_sweeper" else "start_ttl_sweeper"
            raise ConflictError(f"a sweeper started by {other}() is running: stop it first")
        return running

    def _stopped(self, sweeper: _Sweeper) -> bool:
        with self._sweeper_lock:
            if not sweeper.ended.is_set():
                return False
            if self._sweeper is sweeper:
                self._sweeper = None
            return True

    async def _sweep_every(self, db: Database, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await protect(self._sweep(db))  # stopped meanwhile: this sweep finishes first
            except MemormError as error:
                _log.warning("%r: a TTL sweep failed (the next is in %g s): %s", self, seconds, error)

    async def _sweep(self, db: Database) -> int:
        total = 0
        while True:
            async with db.unit_of_work() as uow:
                done = await uow.graph_store.sweep(self.agent_id, now=utcnow(), batch=_SWEEP_BATCH)
            total += done
            if done < _SWEEP_BATCH:
                return total

    async def _run_merged(self, calls: list[list[_Checked]]) -> list[list[Result]]:
        """The results of calls run together (`Merger`): their operations as one batch."""
        results = await self._batch(self.db, [op for call in calls for op in call])
        split, start = [], 0
        for call in calls:
            split.append(results[start : start + len(call)])
            start += len(call)
        return split

    async def _batch(self, db: Database, checked: list[_Checked]) -> list[Result]:
        """Run checked operations in one unit of work: the reads, then the writes (the last to a key wins)."""
        puts: dict[tuple[str, str], _Put] = {}  # the last write to each key wins
        for op in checked:
            if isinstance(op, _Put):
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
        checked: list[_Checked],
        puts: dict[tuple[str, str], _Put],
        vectors: dict[tuple[str, str], dict[str, list[float]]],
        queries: dict[int, list[float]],
    ) -> list[Result]:
        """The statements of `_batch`: its reads, then its writes, in one unit of work."""
        now, expired = utcnow(), not self._omit_expired
        results: list[Result] = [None] * len(checked)
        refresh: list[StoredItem] = []
        # One item stored (the common `aput`): the put's one driver call commits with it.
        alone = len(checked) == 1 and isinstance(checked[0], _Put) and isinstance(checked[0].item, NewItem)
        unit = UnitOfWork(db, tenant=db.tenant, one_statement=True) if alone else None
        async with unit or db.unit_of_work(read_only=not puts) as uow:
            for position, op in enumerate(checked):
                if not isinstance(op, _Put):
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

    # -- checks (before any statement) -------------------------------------------------

    def _check(self, op: object, position: int) -> _Checked:
        where = f"ops[{position}]"
        if isinstance(op, GetOp):
            _labels(op.namespace, f"{where}.namespace")
            _key(op.key)
            if not isinstance(op.refresh_ttl, bool):
                raise ValidationError(f"{where}.refresh_ttl: expected a bool")
            return op
        if isinstance(op, PutOp):
            return self._check_put(op, where)
        if isinstance(op, SearchOp):
            _labels(op.namespace_prefix, f"{where}.namespace_prefix")
            if op.filter is not None:
                check_value_filter(op.filter, f"{where}.filter")
            _count(op.limit, f"{where}.limit", minimum=0, maximum=MAX_PAGE)
            _count(op.offset, f"{where}.offset", minimum=0, maximum=2**62)
            if op.query is not None:
                check_text(op.query, f"{where}.query")
            if not isinstance(op.refresh_ttl, bool):
                raise ValidationError(f"{where}.refresh_ttl: expected a bool")
            return op
        if isinstance(op, ListNamespacesOp):
            for condition in op.match_conditions or ():
                if not isinstance(condition, MatchCondition) or condition.match_type not in (
                    "prefix",
                    "suffix",
                ):
                    raise ValidationError(
                        f"{where}.match_conditions: expected prefix or suffix MatchConditions"
                    )
                path = (condition.path,) if isinstance(condition.path, str) else condition.path
                _labels(path, f"{where}.match_conditions")
            if op.max_depth is not None:
                _count(op.max_depth, f"{where}.max_depth", minimum=1, maximum=2**31)
            _count(op.limit, f"{where}.limit", minimum=0, maximum=MAX_PAGE * 10)
            _count(op.offset, f"{where}.offset", minimum=0, maximum=2**62)
            return op
        raise ValidationError(f"{where}: unknown operation {type(op).__name__}")

    def _check_put(self, op: PutOp, where: str) -> _Put:
        namespace = _labels(op.namespace, f"{where}.namespace")
        if not namespace:
            raise InvalidNamespace(f"{where}.namespace: a namespace has at least one label")
        joined, key = ".".join(namespace), _key(op.key)
        if op.value is None:
            return _Put((joined, key), {})
        value = check_json_object(
            dict(op.value) if isinstance(op.value, Mapping) else op.value, f"{where}.value"
        )
        ttl = check_minutes(op.ttl, f"{where}.ttl")
        texts: dict[str, str] = {}
        if self._index is not None and op.index is not False:
            if op.index is None:
                paths = self._index.fields
            elif isinstance(op.index, list):
                paths = [(path, _path(path, f"{where}.index")) for path in op.index]
            else:
                raise ValidationError(f"{where}.index: expected False, None or a list of field paths")
            for path, tokens in paths:
                found = get_text_at_path(value, tokens)
                for number, text in enumerate(found):
                    texts[f"{path}.{number}" if len(found) > 1 else path] = text
        return _Put(NewItem(joined, key, value, ttl), texts)

    # -- embeddings (outside any transaction) -----------------------------------------

    async def _embed_puts(self, puts: list[_Put]) -> dict[tuple[str, str], dict[str, list[float]]]:
        wanted = [(put, field, text) for put in puts for field, text in put.texts.items()]
        if not wanted or self._index is None:
            return {}
        unique = list(dict.fromkeys(text for _, _, text in wanted))
        found = await self._index.embeddings.aembed_documents(unique)
        if not isinstance(found, Sequence) or len(found) != len(unique):
            raise ValidationError(f"index.embed: expected {len(unique)} embeddings, got {len(found)}")
        by_text = {
            text: self._vector(vector, "index.embed") for text, vector in zip(unique, found, strict=True)
        }
        vectors: dict[tuple[str, str], dict[str, list[float]]] = {}
        for put, field, text in wanted:
            vectors.setdefault((put.item[0], put.item[1]), {})[field] = by_text[text]
        return vectors

    async def _embed_queries(self, searches: list[SearchOp]) -> dict[int, list[float]]:
        found: dict[int, list[float]] = {}
        if self._index is None:
            return found
        for op in searches:
            if op.query:
                found[id(op)] = self._vector(
                    await self._index.embeddings.aembed_query(op.query), "index.embed"
                )
        return found

    def _vector(self, vector: object, field: str) -> list[float]:
        assert self._index is not None
        checked = check_vector(vector, field)
        if len(checked) != self._index.dims:
            raise ValidationError(
                f"{field}: an embedding of {len(checked)} dimensions; index.dims is {self._index.dims}"
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
            return _as_item(stored)
        if isinstance(op, SearchOp):
            if op.limit == 0:
                return []
            approximate = False
            if query is not None and self._index is not None:
                if self._indexed is None:
                    self._indexed = await store.has_index(self._index.dims, self._index.distance)
                approximate = self._indexed
            hits = await store.search(
                self.agent_id,
                ".".join(op.namespace_prefix),
                where=op.filter,
                now=now,
                limit=op.limit,
                offset=op.offset,
                query=query,
                distance=self._index.distance if self._index is not None else "cosine",
                approximate=approximate,
                expired=expired,
            )
            if op.refresh_ttl:
                refresh += [hit for hit in hits if hit.ttl_minutes is not None]
            return [_as_search_item(hit) for hit in hits]
        return await self._list(uow, op, now, expired)

    async def _list(
        self, uow: UnitOfWork, op: ListNamespacesOp, now: datetime, expired: bool
    ) -> list[tuple[str, ...]]:
        if op.limit == 0:
            return []
        conditions = list(op.match_conditions or ())
        fixed: tuple[str, ...] = ()
        for condition in conditions:
            if condition.match_type == "prefix":
                path = _path_of(condition)
                fixed = path[: path.index("*")] if "*" in path else path
                break
        plain = op.max_depth is None and all(
            c.match_type == "prefix" and "*" not in _path_of(c) and _path_of(c) == fixed for c in conditions
        )
        store = uow.graph_store
        if plain:
            found = await store.namespaces(
                self.agent_id, ".".join(fixed), now=now, limit=op.limit, offset=op.offset, expired=expired
            )
            return [tuple(namespace.split(".")) for namespace in found]
        # Filtered (wildcards, suffixes) or truncated (max_depth) in Python, a page of
        # namespaces at a time, keeping only the first `limit + offset` in byte order.
        want = op.limit + op.offset
        kept: list[_Last] = []
        held: set[str] = set()
        after: str | None = None
        while True:
            page = await store.namespaces(
                self.agent_id, ".".join(fixed), now=now, limit=_LIST_PAGE, after=after, expired=expired
            )
            for namespace in page:
                labels = tuple(namespace.split("."))
                if not all(_matches(condition, labels) for condition in conditions):
                    continue
                shown = ".".join(labels[: op.max_depth] if op.max_depth is not None else labels)
                if shown in held:
                    continue
                if len(kept) < want:
                    heapq.heappush(kept, _Last(shown))
                    held.add(shown)
                elif shown < kept[0].text:
                    held.discard(heapq.heapreplace(kept, _Last(shown)).text)
                    held.add(shown)
            if len(page) < _LIST_PAGE:
                break
            after = page[-1]
        ordered = sorted(entry.text for entry in kept)
        return [tuple(text.split(".")) for text in ordered[op.offset : op.offset + op.limit]]

    async def _write(
        self,
        uow: UnitOfWork,
        puts: list[_Put],
        vectors: dict[tuple[str, str], dict[str, list[float]]],
        now: datetime,
    ) -> None:
        store = uow.graph_store
        deleted = [(put.item[0], put.item[1]) for put in puts if not isinstance(put.item, NewItem)]
        items = [
            put.item._replace(vectors=vectors.get((put.item.namespace, put.item.key)))
            for put in puts
            if isinstance(put.item, NewItem)
        ]
        if deleted:
            await store.delete(self.agent_id, deleted, locked=True)  # (`_batch` has locked them)
        if items:
            await store.put(self.agent_id, items, now=now, locked=True)


def _settle(future: concurrent.futures.Future[None], task: asyncio.Task[None]) -> None:
    """Finish the sync sweeper's future as its task ended (unless the caller cancelled it first)."""
    try:
        if task.cancelled():
            future.cancel()
        elif task.exception() is not None:
            future.set_exception(cast("BaseException", task.exception()))
        else:
            future.set_result(None)
    except concurrent.futures.InvalidStateError:  # cancelled by its caller meanwhile
        pass


class _Last:
    """A namespace's text, ordered backwards: the heap's top is the last one kept."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __lt__(self, other: _Last) -> bool:
        return self.text > other.text


def _path_of(condition: MatchCondition) -> tuple[str, ...]:
    """A condition's labels (a lone string is one label)."""
    return (condition.path,) if isinstance(condition.path, str) else tuple(condition.path)


def _matches(condition: MatchCondition, labels: tuple[str, ...]) -> bool:
    path = _path_of(condition)
    if len(labels) < len(path):
        return False
    if condition.match_type == "suffix":
        labels, path = labels[::-1], path[::-1]
    return all(want == "*" or have == want for have, want in zip(labels, path, strict=False))


def _as_item(stored: StoredItem) -> Item:
    return Item(
        value=stored.value,
        key=stored.key,
        namespace=tuple(stored.namespace.split(".")),
        created_at=stored.created_at,
        updated_at=stored.updated_at,
    )


def _as_search_item(stored: StoredItem) -> SearchItem:
    return SearchItem(
        namespace=tuple(stored.namespace.split(".")),
        key=stored.key,
        value=stored.value,
        created_at=stored.created_at,
        updated_at=stored.updated_at,
        score=stored.score,
    )
