"""`uow.checkpoints`: the graph state of an agent's sessions (checkpoints, pending writes, channel values).

The rows a graph framework saves after every step (`memorm.compat.langgraph`
for LangGraph): memorm stores them and finds them, and leaves their values
opaque, bytes with the name of their format.  Every call names the agent,
and every session-scoped call the session, so it stays on one shard of a
distributed database.

The reads are `CheckpointQueries`' (`memorm.repositories.checkpoint_queries`);
the records they take and return, `memorm.repositories.checkpoint_records`.
"""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from memorm.driver import insert_rows
from memorm.models import CHECKPOINT_BLOBS, CHECKPOINT_TABLES, CHECKPOINT_WRITES, CHECKPOINTS
from memorm.repositories.checkpoint_queries import CheckpointQueries
from memorm.repositories.checkpoint_read_statements import KEY_COLUMNS
from memorm.repositories.checkpoint_records import (
    MAX_STATE_KEY_BYTES,
    CheckpointKey,
    FoundCheckpoint,
    StoredCheckpoint,
    StoredWrite,
    Value,
    check_state_key,
    checked_key,
)
from memorm.repositories.checkpoint_write_statements import WRITE_COLUMNS, write_checkpoint
from memorm.search.filters import json_key_conditions
from memorm.types import UUIDType, utcnow
from memorm.validation import MAX_PAGE, as_uuid, check_json_object, check_text

__all__ = [
    "MAX_STATE_KEY_BYTES",
    "CheckpointKey",
    "CheckpointRepository",
    "FoundCheckpoint",
    "StoredCheckpoint",
    "StoredWrite",
    "check_state_key",
]


class CheckpointRepository(CheckpointQueries):
    """Checkpoints, pending writes and channel values of an agent's sessions (a graph's threads)."""

    async def put(
        self,
        agent_id: uuid.UUID | str,
        checkpoint: StoredCheckpoint,
        blobs: Mapping[tuple[str, str], Value],
    ) -> None:
        """Store a checkpoint (replacing one under its key) and channel values new with it.

        `blobs` maps `(channel, version)` to its value; a value already stored
        for that version of the channel is kept.
        """
        owner, agent = self._required_tenant, as_uuid(agent_id, "agent_id")
        session, ns, checkpoint_id = checked_key(checkpoint.key)
        parent = checkpoint.parent_checkpoint_id
        if parent is not None:
            check_state_key(parent, "parent_checkpoint_id")
        for channel, version in blobs:
            check_state_key(channel, "channel")
            check_state_key(version, f"channel {channel!r}: version")
        kind, value = checkpoint.value
        meta = check_json_object(checkpoint.meta, "metadata")
        row = (
            owner,
            agent,
            session,
            ns,
            checkpoint_id,
            parent,
            kind,
            value,
            meta,
            utcnow(),
            checkpoint.versions,
        )
        await write_checkpoint(self.link, row, blobs)

    async def put_writes(
        self,
        agent_id: uuid.UUID | str,
        key: CheckpointKey,
        writes: Sequence[StoredWrite],
        *,
        replace: bool,
    ) -> None:
        """Store a task's writes after the checkpoint at `key`.

        A write whose `(task_id, idx)` is stored already replaces it when
        `replace`, else is dropped (a retried task writes the same again).
        """
        owner, agent = self._required_tenant, as_uuid(agent_id, "agent_id")
        checked_key(key)
        for write in writes:
            check_state_key(write.task_id, "task_id")
            check_text(write.task_path, "task_path")
            check_state_key(write.channel, "channel")
        rows = [
            (owner, agent, *key, w.task_id, w.idx, w.task_path, w.channel, w.value[0], w.value[1])
            for w in writes
        ]
        await insert_rows(
            self.link, CHECKPOINT_WRITES, WRITE_COLUMNS, rows, on_conflict="update" if replace else "ignore"
        )

    async def delete_session(self, agent_id: uuid.UUID | str, session_id: uuid.UUID | str) -> None:
        """Delete a session's graph state (the session and its messages stay)."""
        for table in CHECKPOINT_TABLES:
            await self._execute(sa.delete(table).where(*self._session_filter(table, agent_id, session_id)))

    async def delete_runs(self, agent_id: uuid.UUID | str, run_ids: Sequence[str]) -> int:
        """Delete the agent's checkpoints whose metadata names one of `run_ids`, with their writes."""
        runs = sorted(set(run_ids))
        if not runs:
            return 0
        matching = sa.or_(
            *(
                sa.and_(*json_key_conditions(self.link, CHECKPOINTS.c.meta, {"run_id": r}, "run_ids"))
                for r in runs
            )
        )
        found: builtins.list[Any] = list(
            await self._execute(
                sa.select(*KEY_COLUMNS).where(*self._agent_filter(CHECKPOINTS, agent_id), matching)
            )
        )
        doomed = [CheckpointKey(row[0], row[1], row[2]) for row in found]
        await self._delete_checkpoints(agent_id, doomed)
        return len(doomed)

    async def _delete_checkpoints(self, agent_id: uuid.UUID | str, keys: Sequence[CheckpointKey]) -> None:
        for start in range(0, len(keys), MAX_PAGE):
            batch = keys[start : start + MAX_PAGE]
            for table in (CHECKPOINT_WRITES, CHECKPOINTS):
                key = (table.c.session_id, table.c.checkpoint_ns, table.c.checkpoint_id)
                await self._rowcount(
                    sa.delete(table).where(*self._agent_filter(table, agent_id), sa.tuple_(*key).in_(batch))
                )

    async def copy_session(
        self, agent_id: uuid.UUID | str, source: uuid.UUID | str, target: uuid.UUID | str
    ) -> None:
        """Copy a session's graph state into another session of the agent (rows it has are kept)."""
        into = sa.literal(as_uuid(target, "target"), UUIDType())
        for table in CHECKPOINT_TABLES:
            there = table.alias("there")
            key = [column.name for column in table.primary_key.columns if column.name != "session_id"]
            taken = sa.exists().where(
                there.c.session_id == into, *(there.c[name] == table.c[name] for name in key)
            )
            names = [column.name for column in table.c]
            rows = sa.select(*(into if name == "session_id" else table.c[name] for name in names)).where(
                *self._session_filter(table, agent_id, source), ~taken
            )
            await self._execute(sa.insert(table).from_select(names, rows))

    async def prune(
        self,
        agent_id: uuid.UUID | str,
        session_id: uuid.UUID | str,
        keep: Mapping[str, tuple[str, Iterable[tuple[str, str]]]],
    ) -> None:
        """Delete a session's checkpoints but those in `keep`, with their writes and unused values.

        `keep` maps each namespace to the checkpoint kept in it and the
        `(channel, version)`s that checkpoint holds; a namespace left out
        loses everything.  Kept checkpoints lose their parent.
        """
        in_session = self._session_filter(CHECKPOINTS, agent_id, session_id)
        kept = sorted((ns, checkpoint) for ns, (checkpoint, _) in keep.items())
        for table in (CHECKPOINT_WRITES, CHECKPOINTS):
            pair = sa.tuple_(table.c.checkpoint_ns, table.c.checkpoint_id)
            where = self._session_filter(table, agent_id, session_id)
            await self._rowcount(sa.delete(table).where(*where, *([pair.not_in(kept)] if kept else [])))
        if kept:
            await self._rowcount(sa.update(CHECKPOINTS).where(*in_session).values(parent_checkpoint_id=None))
        values = sorted((ns, channel, version) for ns, (_, held) in keep.items() for channel, version in held)
        blob = (CHECKPOINT_BLOBS.c.checkpoint_ns, CHECKPOINT_BLOBS.c.channel, CHECKPOINT_BLOBS.c.version)
        unused = [sa.tuple_(*blob).not_in(values)] if values else []
        await self._rowcount(
            sa.delete(CHECKPOINT_BLOBS).where(
                *self._session_filter(CHECKPOINT_BLOBS, agent_id, session_id), *unused
            )
        )
