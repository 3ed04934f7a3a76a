"""What `uow.checkpoints` stores and returns: a graph's checkpoints, writes and values as records.

The keys of graph state are checked here (`check_state_key`): the repository,
the LangGraph saver and database copies hold them to the same limit.
"""

from __future__ import annotations

import uuid
from typing import Any, NamedTuple

from memorm.errors import ValidationError
from memorm.validation import check_text

__all__ = [
    "MAX_STATE_KEY_BYTES",
    "CheckpointKey",
    "FoundCheckpoint",
    "StoredCheckpoint",
    "StoredWrite",
    "Value",
    "check_state_key",
    "checked_key",
    "stored_checkpoint",
]

MAX_STATE_KEY_BYTES = 512
"""The longest text, in UTF-8 bytes, of a graph-state key: a namespace, checkpoint id, task id,
channel or version.  A row's key holds three of them beside its tenant (up to 512 bytes) and two
UUIDs: 2,100 bytes at most, within the 2,704 a Postgres btree entry may take (SQLite has no limit,
so without this one a database of longer keys could not move to Postgres)."""


def check_state_key(value: object, field: str) -> str:
    """A graph-state key: text without NUL (which Postgres cannot store), of `MAX_STATE_KEY_BYTES` at most.

    Raises:
        ValidationError: not a string, a NUL or lone surrogate in it, or too long.
    """
    text = check_text(value, field) or ""
    if len(text) * 4 > MAX_STATE_KEY_BYTES and len(text.encode()) > MAX_STATE_KEY_BYTES:
        raise ValidationError(
            f"{field}: {len(text.encode()):,} bytes, more than the {MAX_STATE_KEY_BYTES} a graph-state "
            "key may have"
        )
    return text


Value = tuple[str, bytes | None]
"""A stored value: the name of its format and its bytes (None for a channel with no value)."""


class CheckpointKey(NamedTuple):
    """Where a checkpoint is: its session, (sub)graph namespace and id."""

    session_id: uuid.UUID
    checkpoint_ns: str
    checkpoint_id: str


class StoredCheckpoint(NamedTuple):
    """A checkpoint as stored: its key, parent, serialized value and metadata, and its session's key.

    `versions`: the versions of the channels it holds (channel -> version),
    written with it so one statement finds their values (`find`).
    """

    key: CheckpointKey
    parent_checkpoint_id: str | None
    value: Value
    meta: dict[str, Any]
    session_key: str | None = None
    versions: dict[str, str] | None = None


class FoundCheckpoint(NamedTuple):
    """What `find` returns: a checkpoint, its pending writes, and its channels' stored values.

    `values` maps `(channel, version)` to the value; None for a checkpoint
    stored without its `versions` (before revision 0014): `blobs` reads them.
    """

    checkpoint: StoredCheckpoint
    writes: list[StoredWrite]
    values: dict[tuple[str, str], Value] | None


class StoredWrite(NamedTuple):
    """A pending write as stored."""

    task_id: str
    channel: str
    value: Value
    task_path: str
    idx: int


def checked_key(key: CheckpointKey) -> CheckpointKey:
    """`key`, its namespace and checkpoint id checked (`check_state_key`)."""
    check_state_key(key.checkpoint_ns, "checkpoint_ns")
    check_state_key(key.checkpoint_id, "checkpoint_id")
    return key


def stored_checkpoint(row: Any) -> StoredCheckpoint:
    """A checkpoint read as `(session, ns, id, parent, value type, value, meta, session key)`."""
    session, ns, checkpoint, parent, kind, value, meta, key = row
    return StoredCheckpoint(CheckpointKey(session, ns, checkpoint), parent, (kind, value), meta, key)
