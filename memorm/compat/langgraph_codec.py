"""How a LangGraph saver turns checkpoints and writes into memorm's rows, and back.

LangGraph's serializer (the saver's `serde`) makes each value bytes with
the name of their format; memorm stores them as they are.  Large values are
(de)serialized in a worker thread, so that the event loop is not held up.
"""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Callable, Mapping, Sequence
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
except ImportError as error:
    raise missing_extra(__name__, "langgraph", error) from error

from memorm.compat.langgraph_config import ThreadConfig
from memorm.errors import DatabaseError, UnsafeValueError, ValidationError
from memorm.repositories.checkpoint_records import (
    CheckpointKey,
    StoredCheckpoint,
    StoredWrite,
    Value,
    check_state_key,
)
from memorm.validation import MAX_COUNT, check_int, check_name, check_text

__all__ = ["CheckpointCodec", "Loaded", "describe_checkpoint"]

_EMPTY = "empty"  # a channel that had no value at a version (LangGraph's savers use the same tag)
_LARGE = 64 * 1024  # bytes of values above which (de)serializing moves to a worker thread

_T = TypeVar("_T")

Loaded = list[tuple[StoredCheckpoint, Checkpoint, dict[tuple[str, str], Value], list[StoredWrite]]]
"""Checkpoints as read, with their channel values and pending writes."""


def describe_checkpoint(stored: StoredCheckpoint) -> str:
    """A checkpoint, as messages name it."""
    ns = f", namespace {stored.key.checkpoint_ns!r}" if stored.key.checkpoint_ns else ""
    return f"checkpoint {stored.key.checkpoint_id!r} of thread {stored.session_key!r}{ns}"


class CheckpointCodec(BaseCheckpointSaver[str]):
    """The part of `MemormSaver` that (de)serializes: checkpoints and writes to stored rows and back."""

    _large: bool  # the last values serialized were large: serialize the next in a thread

    async def _tuples(
        self,
        loaded: Loaded,
        threads: Mapping[uuid.UUID, Any],
    ) -> builtins.list[CheckpointTuple]:
        size = sum(len(value or b"") for _, _, blobs, _ in loaded for _, value in blobs.values())
        size += sum(len(write.value[1] or b"") for *_, writes in loaded for write in writes)
        if size > _LARGE:
            return await anyio.to_thread.run_sync(self._build, loaded, threads)
        return self._build(loaded, threads)

    def _build(
        self,
        loaded: Loaded,
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
                    values[channel] = self._load(
                        value, f"channel {channel!r} of {describe_checkpoint(stored)}"
                    )
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
                (
                    w.task_id,
                    w.channel,
                    self._load(w.value, f"a write to {w.channel!r} of {describe_checkpoint(stored)}"),
                )
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
    ) -> tuple[ThreadConfig, StoredCheckpoint, dict[tuple[str, str], Value]]:
        where = ThreadConfig(config)
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
    ) -> tuple[ThreadConfig, builtins.list[StoredWrite], bool]:
        where = ThreadConfig(config)
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
