"""LangGraph on memorm: a checkpointer (extra `langgraph`).

[`MemormSaver`][memorm.compat.langgraph.MemormSaver] keeps a graph's
checkpoints, pending writes and channel values in memorm's tables, beside
the agents, sessions and messages:

```python
from memorm.compat.langgraph import MemormSaver

graph = builder.compile(checkpointer=MemormSaver(db, agent=agent.id))
graph.invoke(inputs, {"configurable": {"thread_id": "user-42"}})
```

A LangGraph thread is a memorm session of the saver's agent: the thread id
is the session's key (`uow.sessions.get_or_create(agent, thread_id)`), made
by the first checkpoint.  So deleting the session (or its agent), its
expiry (`ttl`, `purge_expired`), and its tenant (`db.for_tenant`) cover the
graph's state too.  Values are serialized by LangGraph's serializer, held by
memorm to build only the types LangGraph's graphs store and those allowed
(`StrictSerializer`: no code from data), and stored as memorm sees them:
opaque bytes.

Its long-term store, [`MemormStore`][memorm.compat.langgraph_store.MemormStore]
(LangGraph's `BaseStore`), is importable from here too.

Importing `memorm` never imports LangGraph; only this module does.
"""

from __future__ import annotations

import builtins
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any, TypeVar, cast

import anyio

from memorm.compat._extras import missing_extra

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        get_serializable_checkpoint_metadata,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
except ImportError as error:
    raise missing_extra(__name__, "langgraph", error) from error

from memorm.compat._sync import BlockingCallError, blocking_flag, run_off_loop
from memorm.compat.langgraph_serde import StrictSerializer, check_serde, reading_strictly
from memorm.compat.langgraph_store import MemormStore
from memorm.db import Database
from memorm.errors import DatabaseError, NotFoundError, UnsafeValueError, ValidationError
from memorm.graph_values import AllowedType
from memorm.models import Agent
from memorm.progress import Reporter, Silent
from memorm.repositories.checkpoints import (
    CheckpointKey,
    StoredCheckpoint,
    StoredWrite,
    Value,
    check_state_key,
)
from memorm.search.filters import check_json_keys
from memorm.uow import UnitOfWork
from memorm.validation import MAX_COUNT, as_uuid, check_duration, check_int, check_name, check_text, shown

__all__ = ["PAGE", "BlockingCallError", "MemormSaver", "MemormStore", "StrictSerializer", "copy_checkpoints"]

PAGE = 100
"""Checkpoints read per query when listing."""

_EMPTY = "empty"  # a channel that had no value at a version (LangGraph's savers use the same tag)
_LARGE = 64 * 1024  # bytes of values above which (de)serializing moves to a worker thread
_SESSIONS_KEPT = 4096  # threads whose session id a saver remembers (then it starts again)


_T = TypeVar("_T")

_Loaded = list[tuple[StoredCheckpoint, Checkpoint, dict[tuple[str, str], Value], list[StoredWrite]]]
"""Checkpoints as read, with their channel values and pending writes."""


class _Thread:
    """Where a config points: its thread (a session key), namespace and checkpoint id, checked."""

    __slots__ = ("checkpoint_id", "key", "ns", "thread_id")

    def __init__(self, config: object, *, field: str = "config") -> None:
        configurable = config.get("configurable") if isinstance(config, Mapping) else None
        if not isinstance(configurable, Mapping):
            raise ValidationError(f"{field}: expected a RunnableConfig with a 'configurable' dict")
        thread = configurable.get("thread_id")
        if isinstance(thread, bool) or not isinstance(thread, (str, int, uuid.UUID)):
            raise ValidationError(f"{field}: configurable.thread_id must be a string (or an int or a UUID)")
        self.thread_id: Any = thread
        self.key = _key(thread, f"{field}.configurable.thread_id")
        ns = configurable.get("checkpoint_ns", "")
        if not isinstance(ns, str):
            raise ValidationError(f"{field}: configurable.checkpoint_ns must be a string")
        self.ns: str = check_state_key(ns, f"{field}: configurable.checkpoint_ns")
        checkpoint = configurable.get("checkpoint_id")
        if checkpoint is not None and not isinstance(checkpoint, str):
            raise ValidationError(f"{field}: configurable.checkpoint_id must be a string")
        if checkpoint:
            check_state_key(checkpoint, f"{field}: configurable.checkpoint_id")
        self.checkpoint_id: str | None = checkpoint or None

    def config(self, checkpoint_id: str) -> RunnableConfig:
        return {
            "configurable": {
                "thread_id": self.thread_id,
                "checkpoint_ns": self.ns,
                "checkpoint_id": checkpoint_id,
            }
        }


def _key(thread: object, field: str) -> str:
    if isinstance(thread, bool) or not isinstance(thread, (str, int, uuid.UUID)):
        raise ValidationError(f"{field}: a thread id is a string (or an int or a UUID)")
    return check_name(str(thread), field, blank=True)


def _threads(thread_ids: object, field: str) -> list[str]:
    if isinstance(thread_ids, (str, bytes)) or not isinstance(thread_ids, Sequence):
        raise ValidationError(f"{field}: expected a list of thread ids, not {type(thread_ids).__name__}")
    return [_key(thread, f"{field}[{index}]") for index, thread in enumerate(thread_ids)]


class MemormSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer over a memorm [`Database`][memorm.db.Database].

    Args:
        db: the shared database (a [`for_tenant`][memorm.db.Database.for_tenant]
            view keeps the graphs' state in that tenant).  The saver holds no
            connection: each call is one unit of work.
        agent: the memorm agent (or its id) whose sessions the threads are.
            One saver serves one agent; make one per agent (they are cheap).
        serde: the serializer (default: `StrictSerializer(allowed_types=...)`,
            LangGraph's msgpack, building only the types LangGraph's graphs
            store and `allowed_types`).  One that would run code from data
            is refused: a pickle fallback, or a `JsonPlusSerializer` that
            allows every type (LangGraph's default); give yours a
            `StrictSerializer` (e.g. inside an `EncryptedSerializer`).
        allowed_types: your own types in the graph's state (pydantic models,
            dataclasses, enums, named tuples): classes, `(module, name)`
            pairs or `"module.Name"`.  A stored value naming any other
            callable is refused when loaded (`UnsafeValueError`), never
            called.  With `serde`, give them to that serializer instead.
        ttl: a `timedelta` or seconds: every checkpoint moves the thread's
            session expiry to `ttl` from then, so a thread idle that long is
            deleted, with its state, by the next `purge_expired`.  Without
            it, the agent's `retention` applies to new sessions, if any.
        allow_blocking: let the sync methods run on a thread whose event loop
            is running, blocking that loop until done.  By default they raise
            `BlockingCallError` there (an `asyncio.InvalidStateError`), as
            LangGraph's async savers do.

    It implements LangGraph's whole `BaseCheckpointSaver`: `aput`,
    `aput_writes`, `aget_tuple`, `alist` (`filter` on metadata, `before`,
    `limit`), `adelete_thread`, `adelete_for_runs`, `acopy_thread` and
    `aprune`, and the sync methods, which run on memorm's sync loop (see
    `memorm.compat.langchain`), so a sync graph (`graph.invoke`) works
    from any thread that is not running an event loop.  Bad input raises `memorm.errors.ValidationError`; an
    unknown agent `NotFoundError` on the first write.  A read that meets a
    value naming a callable not allowed raises `memorm.errors.UnsafeValueError`
    (a `ValidationError`) naming the value, its checkpoint and the callable,
    and returns none of that checkpoint: a graph resumed without the value,
    or with its raw arguments in place of the object, would run on wrong state.  `adelete_thread`
    deletes the graph's state and keeps the session (and any messages other
    code keeps in it); deleting the session deletes both.

    Example:
        ```python
        saver = MemormSaver(db, agent=agent.id)
        graph = builder.compile(checkpointer=saver)
        await graph.ainvoke({"messages": [...]}, {"configurable": {"thread_id": "t-1"}})
        ```
    """

    def __init__(
        self,
        db: Database,
        *,
        agent: Agent | uuid.UUID | str,
        serde: SerializerProtocol | None = None,
        allowed_types: Iterable[AllowedType] | None = None,
        ttl: timedelta | float | None = None,
        allow_blocking: bool = False,
    ) -> None:
        if serde is None:
            serde = StrictSerializer(allowed_types=allowed_types)
        elif allowed_types is not None:
            raise ValidationError(
                "allowed_types: with serde, give them to that serializer: StrictSerializer(allowed_types=...)"
            )
        else:
            check_serde(serde)
        super().__init__(serde=serde)
        if not isinstance(db, Database):
            raise ValidationError(f"db: expected a memorm Database, got {type(db).__name__}")
        self.db = db
        self.agent_id = as_uuid(agent.id if isinstance(agent, Agent) else agent, "agent")
        self.ttl = None if ttl is None else check_duration(ttl, "ttl")
        self.allow_blocking = blocking_flag(allow_blocking)
        # Thread key -> session id, of sessions this saver made or found: a write
        # needs no lookup.  A session deleted since fails the write's foreign key
        # (or its expiry's update) and is looked up again (`_in_session`).
        self._sessions: dict[str, uuid.UUID] = {}
        self._large = False  # the last values serialized were large: serialize the next in a thread

    def __repr__(self) -> str:
        return f"MemormSaver(agent={self.agent_id})"

    def get_next_version(self, current: str | None, channel: None) -> str:
        """The channel's next version: a counter, padded to sort as text, and a random tail.

        Raises:
            ValidationError: `current` is no version: neither None nor a
                counter (an int, or text starting with one, as this returns).
        """
        try:
            number = 0 if current is None else int(str(current).split(".")[0])
        except ValueError:  # also an int of more digits than Python converts
            raise ValidationError(
                f"current: {shown(current, 60)} is not a channel version (a counter, then '.' and a tail)"
            ) from None
        return f"{number + 1:032}.{random.random():016}"  # noqa: S311 (not a secret: ties between forks)

    # -- async ------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint `config` names (the thread's newest without a `checkpoint_id`), or None."""
        where = _Thread(config)
        async with self.db.unit_of_work(read_only=True) as uow:
            found = await uow.checkpoints.find(self.agent_id, where.key, where.ns, where.checkpoint_id)
            if found is None:
                return None
            stored, writes, values = found
            loaded = await self._complete(uow, [stored], {stored.key: writes}, values)
        tuples = await self._tuples(loaded, {stored.key.session_id: where.thread_id})
        return tuples[0]

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """The checkpoints matching, newest first, read `PAGE` at a time.

        `config` narrows to a thread (and its namespace and checkpoint id,
        when given); None lists every thread of the agent.  `filter` keeps
        checkpoints whose metadata holds each key with its value; `before`,
        those older than its checkpoint; `limit`, the first so many.
        """
        query = _Listing(config, filter, before, limit)
        while not query.done:
            for item in await self._page(self.db, query):
                yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint and the channel values new in it; the config that names it."""
        where, stored, blobs = await self._dump_checkpoint(config, checkpoint, metadata, new_versions)
        await self._put(self.db, where, stored, blobs)
        return where.config(checkpoint["id"])

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's writes after the checkpoint `config` names."""
        where, rows, replace = await self._dump_writes(config, writes, task_id, task_path)
        await self._put_writes(self.db, where, rows, replace)

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete a thread's checkpoints, writes and values (its memorm session stays)."""
        await self._delete_thread(self.db, _key(thread_id, "thread_id"))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the agent's checkpoints made by these runs (metadata `run_id`), with their writes."""
        await self._delete_runs(self.db, _run_ids(run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, write and value of a thread into another (made if new)."""
        source, target = (
            _key(source_thread_id, "source_thread_id"),
            _key(target_thread_id, "target_thread_id"),
        )
        await self._copy_thread(self.db, source, target)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune threads: `"keep_latest"` keeps each namespace's newest checkpoint, `"delete"` nothing.

        A kept checkpoint keeps its writes and the channel values it holds.
        A thread whose graph uses a `DeltaChannel` (its checkpoints count
        updates since a snapshot) cannot lose its history: `keep_latest`
        refuses it (`ValidationError`), as LangGraph's Postgres saver does.
        """
        threads = _threads(thread_ids, "thread_ids")
        if strategy not in ("keep_latest", "delete"):
            raise ValidationError(f"strategy: expected 'keep_latest' or 'delete', got {strategy!r}")
        for thread in threads:
            await self._prune(self.db, thread, strategy)

    # -- sync: on memorm's sync loop (memorm.compat._sync) ------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """`aget_tuple` for sync code."""
        return run_off_loop(self, "get_tuple", lambda _: self.aget_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """`alist` for sync code: a page at a time, each read on memorm's sync loop."""
        query = _Listing(config, filter, before, limit)
        while not query.done:
            yield from run_off_loop(self, "list", lambda db: self._page(db, query))

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """`aput` for sync code."""
        return run_off_loop(self, "put", lambda _: self.aput(config, checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """`aput_writes` for sync code."""
        run_off_loop(self, "put_writes", lambda _: self.aput_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        """`adelete_thread` for sync code."""
        run_off_loop(self, "delete_thread", lambda _: self.adelete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """`adelete_for_runs` for sync code."""
        run_off_loop(self, "delete_for_runs", lambda _: self.adelete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """`acopy_thread` for sync code."""
        run_off_loop(self, "copy_thread", lambda _: self.acopy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """`aprune` for sync code."""
        run_off_loop(self, "prune", lambda _: self.aprune(thread_ids, strategy=strategy))

    # -- the work -------------------------------------------------------------------

    async def _page(self, db: Database, query: _Listing) -> builtins.list[CheckpointTuple]:
        """The next page of a listing; marks the listing done after its last page."""
        size = PAGE if query.left is None else min(PAGE, query.left)
        async with db.unit_of_work(read_only=True) as uow:
            found = await uow.checkpoints.list(
                self.agent_id,
                session_key=None if query.where is None else query.where.key,
                checkpoint_ns=None if query.where is None or query.ns_any else query.where.ns,
                checkpoint_id=None if query.where is None else query.where.checkpoint_id,
                meta=query.filter,
                before=query.before,
                after=query.after,
                limit=size,
            )
            loaded = await self._complete(uow, found)
        if len(found) < size or (query.left is not None and query.left <= len(found)):
            query.done = True
        if found:
            query.after = found[-1].key
        if query.left is not None:
            query.left -= len(found)
        threads = (
            {} if query.where is None else {stored.key.session_id: query.where.thread_id for stored in found}
        )
        return await self._tuples(loaded, threads)

    async def _complete(
        self,
        uow: UnitOfWork,
        found: builtins.list[StoredCheckpoint],
        writes: Mapping[CheckpointKey, builtins.list[StoredWrite]] | None = None,
        known: dict[tuple[str, str], Value] | None = None,
    ) -> _Loaded:
        """The checkpoints with their channel values and pending writes (unless given), read in `uow`.

        `known`: one checkpoint's channel values, read with it (`find`).
        """
        checkpoints = [self._load(stored.value, _where(stored)) for stored in found]
        if known is not None and writes is not None and len(found) == 1:
            return [(found[0], checkpoints[0], known, writes[found[0].key])]
        if writes is None:
            writes = await uow.checkpoints.writes(self.agent_id, [stored.key for stored in found])
        groups: dict[tuple[uuid.UUID, str], set[tuple[str, str]]] = {}
        for stored, checkpoint in zip(found, checkpoints, strict=True):
            versions = checkpoint.get("channel_versions") or {}
            wanted = groups.setdefault((stored.key.session_id, stored.key.checkpoint_ns), set())
            wanted.update((channel, str(version)) for channel, version in versions.items())
        values: dict[tuple[uuid.UUID, str], dict[tuple[str, str], Value]] = {}
        for (session, ns), wanted in groups.items():
            values[session, ns] = await uow.checkpoints.blobs(self.agent_id, session, ns, wanted)
        return [
            (stored, checkpoint, values[stored.key.session_id, stored.key.checkpoint_ns], writes[stored.key])
            for stored, checkpoint in zip(found, checkpoints, strict=True)
        ]

    async def _tuples(
        self,
        loaded: _Loaded,
        threads: Mapping[uuid.UUID, Any],
    ) -> builtins.list[CheckpointTuple]:
        size = sum(len(value or b"") for _, _, blobs, _ in loaded for _, value in blobs.values())
        size += sum(len(write.value[1] or b"") for *_, writes in loaded for write in writes)
        if size > _LARGE:
            return await anyio.to_thread.run_sync(self._build, loaded, threads)
        return self._build(loaded, threads)

    def _build(
        self,
        loaded: _Loaded,
        threads: Mapping[uuid.UUID, Any],
    ) -> builtins.list[CheckpointTuple]:
        tuples = []
        for stored, checkpoint, blobs, writes in loaded:
            session, ns, checkpoint_id = stored.key
            thread = threads.get(session, stored.session_key)
            values = {}
            for channel, version in (checkpoint.get("channel_versions") or {}).items():
                value = blobs.get((channel, str(version)))
                if value is not None and value[0] != _EMPTY:
                    values[channel] = self._load(value, f"channel {channel!r} of {_where(stored)}")
            config: RunnableConfig = {
                "configurable": {"thread_id": thread, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}
            }
            parent: RunnableConfig | None = None
            if stored.parent_checkpoint_id:
                parent = {
                    "configurable": {
                        "thread_id": thread,
                        "checkpoint_ns": ns,
                        "checkpoint_id": stored.parent_checkpoint_id,
                    }
                }
            pending = [
                (w.task_id, w.channel, self._load(w.value, f"a write to {w.channel!r} of {_where(stored)}"))
                for w in writes
            ]
            full = cast(Checkpoint, {**checkpoint, "channel_values": values})
            tuples.append(
                CheckpointTuple(config, full, cast(CheckpointMetadata, stored.meta), parent, pending)
            )
        return tuples

    def _load(self, value: Value, what: str) -> Any:
        kind, data = value
        try:
            return self.serde.loads_typed((kind, data or b""))
        except UnsafeValueError as error:
            raise UnsafeValueError(f"{what}: {error}") from None
        except Exception as error:  # the serializer's own errors, whichever they are
            raise DatabaseError(f"{what} stored as {kind!r} could not be read: {error}") from error

    def _dump(self, value: Any, what: str) -> tuple[str, bytes]:
        try:
            return self.serde.dumps_typed(value)
        except Exception as error:  # msgpack's TypeError for an object it cannot encode, and the like
            raise ValidationError(f"{what}: LangGraph's serializer cannot store it: {error}") from error

    async def _dump_checkpoint(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> tuple[_Thread, StoredCheckpoint, dict[tuple[str, str], Value]]:
        where = _Thread(config)
        if (
            not isinstance(checkpoint, Mapping)
            or not isinstance(checkpoint.get("id"), str)
            or not checkpoint["id"]
        ):
            raise ValidationError("checkpoint: expected a Checkpoint dict with a non-empty string 'id'")
        if not isinstance(new_versions, Mapping):
            raise ValidationError(f"new_versions: expected a dict, got {type(new_versions).__name__}")
        if not isinstance(metadata, Mapping):
            raise ValidationError(f"metadata: expected a dict, got {type(metadata).__name__}")
        values = checkpoint.get("channel_values") or {}
        versions = checkpoint.get("channel_versions") or {}
        if not isinstance(versions, Mapping) or not all(isinstance(channel, str) for channel in versions):
            raise ValidationError("checkpoint: channel_versions must map channel names to versions")
        check_state_key(checkpoint["id"], "checkpoint: id")
        for channel, version in (*versions.items(), *new_versions.items()):
            check_state_key(channel, "checkpoint: a channel")
            check_state_key(str(version), f"checkpoint: channel {channel!r}: version")
        bare = {**checkpoint, "channel_values": {}}
        meta = dict(get_serializable_checkpoint_metadata(config, metadata))

        def dump() -> tuple[tuple[str, bytes], dict[tuple[str, str], Value]]:
            blobs: dict[tuple[str, str], Value] = {}
            for channel, version in new_versions.items():
                blobs[channel, str(version)] = (
                    self._dump(values[channel], f"channel {channel!r}")
                    if channel in values
                    else (_EMPTY, None)
                )
            return self._dump(bare, "checkpoint"), blobs

        value, blobs = await self._serialize(
            dump, lambda done: len(done[0][1]) + sum(len(blob or b"") for _, blob in done[1].values())
        )
        key = CheckpointKey(uuid.UUID(int=0), where.ns, checkpoint["id"])  # the session is known once stored
        held = {channel: str(version) for channel, version in versions.items()}
        return where, StoredCheckpoint(key, where.checkpoint_id, value, meta, versions=held), blobs

    async def _dump_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str
    ) -> tuple[_Thread, builtins.list[StoredWrite], bool]:
        where = _Thread(config)
        if where.checkpoint_id is None:
            raise ValidationError(
                "config: writes belong to a checkpoint: configurable.checkpoint_id is missing"
            )
        task = check_name(check_state_key(task_id, "task_id"), "task_id", blank=True)
        if not isinstance(task_path, str):
            raise ValidationError("task_path: expected a string")
        check_text(task_path, "task_path")
        items = list(writes) if isinstance(writes, Sequence) and not isinstance(writes, str) else None
        if items is None or any(not isinstance(w, (tuple, list)) or len(w) != 2 for w in items):
            raise ValidationError("writes: expected a list of (channel, value) pairs")
        check_int(len(items), "writes", minimum=0, maximum=MAX_COUNT)
        for channel, _ in items:
            if not isinstance(channel, str):
                raise ValidationError(f"writes: a channel is a string, got {type(channel).__name__}")
            check_state_key(channel, "writes: a channel")

        def dump() -> builtins.list[StoredWrite]:
            return [
                StoredWrite(
                    task,
                    channel,
                    self._dump(value, f"write to {channel!r}"),
                    task_path,
                    WRITES_IDX_MAP.get(channel, idx),
                )
                for idx, (channel, value) in enumerate(items)
            ]

        rows = await self._serialize(dump, lambda done: sum(len(row.value[1] or b"") for row in done))
        return where, rows, all(channel in WRITES_IDX_MAP for channel, _ in items)

    async def _serialize(self, dump: Callable[[], _T], size: Callable[[_T], int]) -> _T:
        """Run `dump` (the serializer's work) here, or in a worker thread after a large one.

        A thread's values tend to stay the size they are: small ones cost less
        than the hop to a thread, large ones must not hold up the event loop.
        """
        done = await anyio.to_thread.run_sync(dump) if self._large else dump()
        self._large = size(done) > _LARGE
        return done

    async def _session(self, uow: UnitOfWork, key: str, known: uuid.UUID | None = None) -> uuid.UUID:
        """The thread's session (`known`: its id as remembered), made on its first write.

        With a `ttl`, its expiry moves to `ttl` from now.
        """
        if known is not None:
            if self.ttl is None:
                return known
            try:
                await uow.sessions.touch(known, ttl=self.ttl)
                return known
            except NotFoundError:  # deleted since: found or made again below
                pass
        chat = await uow.sessions.get_or_create(self.agent_id, key, ttl=self.ttl)
        if self.ttl is not None:
            await uow.sessions.touch(chat.id, ttl=self.ttl)
        return chat.id

    async def _in_session(
        self, db: Database, key: str, write: Callable[[UnitOfWork, uuid.UUID], Awaitable[None]]
    ) -> None:
        """Run `write` in a unit of work, with the thread's session (made if need be).

        The session's id is remembered once committed (LangGraph writes a
        step's checkpoint and writes concurrently: another unit of work must
        not see an id before its row).  A remembered session deleted since
        fails the write (its foreign key): the write runs again in a new unit
        of work, the session looked up anew.
        """
        known = self._sessions.get(key)
        # Known, with no expiry to move: the write is the unit of work's one statement.
        alone = known is not None and self.ttl is None
        try:
            async with UnitOfWork(db, tenant=db.tenant, one_statement=alone) as uow:
                session = await self._session(uow, key, known)
                await write(uow, session)
        except NotFoundError:
            if known is None:
                raise
            self._sessions.pop(key, None)
            async with db.unit_of_work() as uow:
                session = await self._session(uow, key)
                await write(uow, session)
        if session != known:
            if len(self._sessions) >= _SESSIONS_KEPT:
                self._sessions.clear()
            self._sessions[key] = session

    async def _put(
        self, db: Database, where: _Thread, stored: StoredCheckpoint, blobs: dict[tuple[str, str], Value]
    ) -> None:
        async def write(uow: UnitOfWork, session: uuid.UUID) -> None:
            key = stored.key._replace(session_id=session)
            await uow.checkpoints.put(self.agent_id, stored._replace(key=key), blobs)

        await self._in_session(db, where.key, write)

    async def _put_writes(
        self, db: Database, where: _Thread, rows: builtins.list[StoredWrite], replace: bool
    ) -> None:
        if not rows:
            return
        checkpoint_id = where.checkpoint_id
        assert checkpoint_id is not None

        async def write(uow: UnitOfWork, session: uuid.UUID) -> None:
            key = CheckpointKey(session, where.ns, checkpoint_id)
            await uow.checkpoints.put_writes(self.agent_id, key, rows, replace=replace)

        await self._in_session(db, where.key, write)

    async def _delete_thread(self, db: Database, key: str) -> None:
        async with db.unit_of_work() as uow:
            chat = await uow.sessions.get_by_key(self.agent_id, key)
            if chat is not None:
                await uow.checkpoints.delete_session(self.agent_id, chat.id)

    async def _delete_runs(self, db: Database, run_ids: builtins.list[str]) -> None:
        if run_ids:
            async with db.unit_of_work() as uow:
                await uow.checkpoints.delete_runs(self.agent_id, run_ids)

    async def _copy_thread(self, db: Database, source: str, target: str) -> None:
        async with db.unit_of_work() as uow:
            chat = await uow.sessions.get_by_key(self.agent_id, source)
            if chat is None:
                return  # nothing to copy: the target is left as it is
            into = await self._session(uow, target)
            if into != chat.id:
                await uow.checkpoints.copy_session(self.agent_id, chat.id, into)

    async def _prune(self, db: Database, thread: str, strategy: str) -> None:
        async with db.unit_of_work() as uow:
            chat = await uow.sessions.get_by_key(self.agent_id, thread)
            if chat is None:
                return
            if strategy == "delete":
                await uow.checkpoints.delete_session(self.agent_id, chat.id)
                return
            keep: dict[str, tuple[str, builtins.list[tuple[str, str]]]] = {}
            for head in await uow.checkpoints.heads(self.agent_id, chat.id):
                if "counters_since_delta_snapshot" in head.meta:
                    raise ValidationError(
                        f"thread {thread!r} uses a DeltaChannel: keep_latest would lose its history"
                    )
                versions = (self._load(head.value, _where(head)).get("channel_versions") or {}).items()
                keep[head.key.checkpoint_ns] = (
                    head.key.checkpoint_id,
                    [(channel, str(version)) for channel, version in versions],
                )
            await uow.checkpoints.prune(self.agent_id, chat.id, keep)


async def copy_checkpoints(
    source: BaseCheckpointSaver[Any],
    target: MemormSaver,
    config: RunnableConfig | None = None,
    *,
    reporter: Reporter | None = None,
    allowed_types: Iterable[AllowedType] | None = None,
) -> int:
    """Copy the checkpoints (with their writes) of another LangGraph saver into a `MemormSaver`.

    The way from `langgraph-checkpoint-sqlite` or `-postgres` to memorm:
    every checkpoint `source.alist(config)` gives (all threads when
    `config` is None) is stored by `target` under the same thread, namespace
    and id, with its parent, metadata, channel values and pending writes.
    Copying again stores nothing new.  Returns the checkpoints copied.

    `reporter` (a [`Reporter`][memorm.progress.Reporter]) is told of each
    checkpoint stored (`advance("checkpoints", 1)`) and of its pending
    writes (`advance("writes", n)`); the caller, who knows the totals,
    starts both tasks (`memorm import-langgraph` counts the source's rows).

    The source is read through memorm's `StrictSerializer` in place of
    LangGraph's serializer (a copy of `source`; yours, if it is not
    LangGraph's, as it is): a value naming a callable that is neither a type
    LangGraph's graphs store nor one of `allowed_types` raises
    `UnsafeValueError` and stops the copy there, uncalled.  (`memorm
    import-langgraph` checks every value before it copies any.)
    """
    report = reporter or Silent()
    copied = 0
    async for item in reading_strictly(source, allowed_types).alist(config):
        where = dict(item.config["configurable"])
        parent = (item.parent_config or {}).get("configurable", {}).get("checkpoint_id")
        put_config: RunnableConfig = {"configurable": {**where, "checkpoint_id": parent}}
        checkpoint = item.checkpoint
        stored = await target.aput(
            put_config, checkpoint, item.metadata, dict(checkpoint["channel_versions"])
        )
        by_task: dict[str, builtins.list[tuple[str, Any]]] = {}
        for task_id, channel, value in item.pending_writes or ():
            by_task.setdefault(task_id, []).append((channel, value))
        for task_id, writes in by_task.items():
            await target.aput_writes(stored, writes, task_id)
        copied += 1
        report.advance("checkpoints", 1)
        if item.pending_writes:
            report.advance("writes", len(item.pending_writes))
    return copied


class _Listing:
    """A listing's arguments, checked, and where its paging stands."""

    def __init__(
        self,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> None:
        self.where = None if config is None else _Thread(config)
        # A config without a namespace lists every namespace of the thread.
        self.ns_any = config is not None and "checkpoint_ns" not in (config.get("configurable") or {})
        self.filter = None if filter is None else dict(check_json_keys(filter, "filter")) or None
        self.before = None if before is None else _Thread(before, field="before").checkpoint_id
        self.left = None if limit is None else check_int(limit, "limit", minimum=0, maximum=2**62)
        self.after: CheckpointKey | None = None
        self.done = self.left == 0


def _where(stored: StoredCheckpoint) -> str:
    """A checkpoint, as messages name it."""
    ns = f", namespace {stored.key.checkpoint_ns!r}" if stored.key.checkpoint_ns else ""
    return f"checkpoint {stored.key.checkpoint_id!r} of thread {stored.session_key!r}{ns}"


def _run_ids(run_ids: object) -> list[str]:
    if isinstance(run_ids, (str, bytes)) or not isinstance(run_ids, Sequence):
        raise ValidationError(f"run_ids: expected a list of run ids, not {type(run_ids).__name__}")
    found = []
    for index, run in enumerate(run_ids):
        if not isinstance(run, (str, uuid.UUID)):
            raise ValidationError(f"run_ids[{index}]: expected a string, got {type(run).__name__}")
        found.append(str(run))
    return found
