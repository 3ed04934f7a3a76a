"""`MemormSaver`: LangGraph's checkpointer over a memorm `Database`, and its async methods.

What it is made of, bottom up: `CheckpointCodec` (values to rows and back),
`CheckpointStorage` (the units of work), `SyncCheckpointMethods` (the sync
twins); this module checks a call's arguments and hands them down.  Import
it from `memorm.compat.langgraph`.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from datetime import timedelta
from typing import Any

from memorm.compat._extras import missing_extra

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import ChannelVersions, Checkpoint, CheckpointMetadata, CheckpointTuple
    from langgraph.checkpoint.serde.base import SerializerProtocol
except ImportError as error:
    raise missing_extra(__name__, "langgraph", error) from error

from memorm.compat._open import Opened
from memorm.compat._sync import blocking_flag, run_off_loop
from memorm.compat.langgraph_agent import AgentRef
from memorm.compat.langgraph_config import Listing, ThreadConfig, checked_run_ids, thread_key, thread_keys
from memorm.compat.langgraph_retention import CheckpointRetention, ThreadPurges
from memorm.compat.langgraph_serde import StrictSerializer, check_serde
from memorm.compat.langgraph_sync import SyncCheckpointMethods
from memorm.db import Database
from memorm.errors import ValidationError
from memorm.graph_values import AllowedType
from memorm.models import Agent
from memorm.validation import check_duration, shown

__all__ = ["MemormSaver"]


class MemormSaver(SyncCheckpointMethods):
    """A LangGraph checkpointer over a memorm [`Database`][memorm.db.Database].

    Args:
        db: the shared database (a [`for_tenant`][memorm.db.Database.for_tenant]
            view keeps the graphs' state in that tenant).  The saver holds no
            connection: each call is one unit of work.
        agent: the memorm agent (or its id) whose sessions the threads are.
            One saver serves one agent; make one per agent (they are cheap).
            None: the agent named `"langgraph"` (of the view's tenant), made
            by the saver's first write.
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
        retention: a `CheckpointRetention`: the saver purges each thread's
            old checkpoints as it writes (the newest `keep_last` of each
            namespace stay, or those younger than `max_age`, with what they
            need), so a long-lived thread's state stops growing.  None: every
            checkpoint stays until the thread goes.
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

    # What a refused sync call says to do where a graph called it (`run_off_loop`): in a
    # notebook or an async server, the graph's own async methods.
    blocking_hint = (
        "; a graph on this loop (a notebook, an async server): await graph.ainvoke() or graph.astream()"
    )

    def __init__(
        self,
        db: Database,
        *,
        agent: Agent | uuid.UUID | str | None = None,
        serde: SerializerProtocol | None = None,
        allowed_types: Iterable[AllowedType] | None = None,
        ttl: timedelta | float | None = None,
        retention: CheckpointRetention | None = None,
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
        self._agent = AgentRef(agent, "saver")
        self.ttl = None if ttl is None else check_duration(ttl, "ttl")
        if retention is not None and not isinstance(retention, CheckpointRetention):
            raise ValidationError(
                f"retention: expected a CheckpointRetention, got {type(retention).__name__}"
            )
        self.retention = retention
        self._purges = None if retention is None else ThreadPurges(retention)
        self.allow_blocking = blocking_flag(allow_blocking)
        # Thread key -> session id, of sessions this saver made or found: a write
        # needs no lookup.  A session deleted since fails the write's foreign key
        # (or its expiry's update) and is looked up again (`_in_session`).
        self._sessions: dict[str, uuid.UUID] = {}
        self._large = False  # the last values serialized were large: serialize the next in a thread

    def __repr__(self) -> str:
        return f"MemormSaver(agent={self._agent})"

    @classmethod
    def from_conn_string(cls, url: str | None = None, **options: Any) -> Opened[MemormSaver]:
        """A saver on a `Database` of its own at `url`, for a `with` or `async with` block.

        As LangGraph's savers' `from_conn_string`: the block closes the
        database's connections as it ends; `setup()` (or `await asetup()`)
        migrates the schema.  `options` are the saver's (`agent`, `serde`,
        `ttl`, ...); without `agent`, the threads are sessions of the agent
        named "langgraph".
        """
        return Opened(url, lambda db: cls(db, **options))

    async def asetup(self) -> None:
        """Migrate the database to memorm's newest schema (idempotent), as LangGraph's `setup` makes tables.

        Needs the tables' owner; a deployment that migrates with
        `memorm db upgrade` need not call it.
        """
        await self.db.upgrade()

    def setup(self) -> None:
        """`asetup` for sync code."""
        run_off_loop(self, "setup", lambda db: db.upgrade())

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
        where = ThreadConfig(config)
        if not await self._known_agent(self.db, make=False):
            return None
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
        query = Listing(config, filter, before, limit)
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
        await self._delete_thread(self.db, thread_key(thread_id, "thread_id"))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the agent's checkpoints made by these runs (metadata `run_id`), with their writes."""
        await self._delete_runs(self.db, checked_run_ids(run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, write and value of a thread into another (made if new)."""
        source, target = (
            thread_key(source_thread_id, "source_thread_id"),
            thread_key(target_thread_id, "target_thread_id"),
        )
        await self._copy_thread(self.db, source, target)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune threads: `"keep_latest"` keeps each namespace's newest checkpoint, `"delete"` nothing.

        A kept checkpoint keeps its writes and the channel values it holds.
        A thread whose graph uses a `DeltaChannel` (its checkpoints count
        updates since a snapshot) cannot lose its history: `keep_latest`
        refuses it (`ValidationError`), as LangGraph's Postgres saver does.
        """
        threads = thread_keys(thread_ids, "thread_ids")
        if strategy not in ("keep_latest", "delete"):
            raise ValidationError(f"strategy: expected 'keep_latest' or 'delete', got {strategy!r}")
        for thread in threads:
            await self._prune(self.db, thread, strategy)
