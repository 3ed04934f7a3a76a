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
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from itertools import groupby
from typing import Any, TypeVar

import sqlalchemy as sa

from memorm.driver import insert_rows
from memorm.models import CHECKPOINT_BLOBS, CHECKPOINT_TABLES, CHECKPOINT_WRITES, CHECKPOINTS, SESSIONS
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
from memorm.repositories.checkpoint_retention import RetainedRow, check_retention, plan_purge
from memorm.repositories.checkpoint_write_statements import WRITE_COLUMNS, write_checkpoint
from memorm.repositories.session_locks import lock_sessions
from memorm.search.filters import json_key_conditions
from memorm.types import UUIDType, utcnow
from memorm.types.lists import TextList, in_list
from memorm.validation import as_uuid, check_flag, check_json_object, check_text

Place = TypeVar("Place", bound=Hashable)

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
        """Delete these checkpoints and their writes: a list of ids per namespace, which an index finds."""
        places = (((key.session_id, key.checkpoint_ns), key.checkpoint_id) for key in keys)
        for (session, ns), ids in _by_place(places):
            for table in (CHECKPOINT_WRITES, CHECKPOINTS):
                in_place = (*self._session_filter(table, agent_id, session), table.c.checkpoint_ns == ns)
                await self._rowcount(sa.delete(table).where(*in_place, in_list(table.c.checkpoint_id, ids)))

    async def purge(
        self,
        agent_id: uuid.UUID | str,
        session_id: uuid.UUID | str,
        *,
        keep_last: int | None = None,
        before: datetime | None = None,
        dry_run: bool = False,
    ) -> int:
        """Delete a session's old checkpoints, with their writes and the values only they held.

        In each (sub)graph namespace the newest checkpoint stays, with the
        newest `keep_last` and those made at or after `before`, and the
        parents a kept checkpoint's `DeltaChannel`s are rebuilt from (see
        `memorm.repositories.checkpoint_retention`).  Returns the number of
        checkpoints deleted (that would be, with `dry_run`).  The session is
        locked first: a concurrent write to it waits for the purge.
        """
        last, cutoff = check_retention(keep_last, before)
        check_flag(dry_run, "dry_run")
        agent, session = as_uuid(agent_id, "agent_id"), as_uuid(session_id, "session_id")
        if not dry_run:
            await lock_sessions(
                self.link,
                *self._tenant_filter(SESSIONS),
                SESSIONS.c.agent_id == agent,
                SESSIONS.c.id == session,
            )
        columns = (
            CHECKPOINTS.c.checkpoint_ns,
            CHECKPOINTS.c.checkpoint_id,
            CHECKPOINTS.c.parent_checkpoint_id,
            CHECKPOINTS.c.created_at,
            CHECKPOINTS.c.meta,
            CHECKPOINTS.c.channel_versions,
        )
        found = await self._execute(
            sa.select(*columns).where(*self._session_filter(CHECKPOINTS, agent, session))
        )
        plan = plan_purge([RetainedRow._make(row) for row in found], keep_last=last, before=cutoff)
        if dry_run or not plan.removed:
            return len(plan.removed)
        await self._delete_checkpoints(agent, [CheckpointKey(session, ns, key) for ns, key in plan.removed])
        for ns, ids in _by_place(plan.orphaned):
            in_place = (*self._session_filter(CHECKPOINTS, agent, session), CHECKPOINTS.c.checkpoint_ns == ns)
            await self._rowcount(
                sa.update(CHECKPOINTS)
                .where(*in_place, in_list(CHECKPOINTS.c.checkpoint_id, ids))
                .values(parent_checkpoint_id=None)
            )
        blob = (CHECKPOINT_BLOBS.c.checkpoint_ns, CHECKPOINT_BLOBS.c.channel, CHECKPOINT_BLOBS.c.version)
        of_session = self._session_filter(CHECKPOINT_BLOBS, agent, session)
        held: builtins.list[Any] = list(await self._execute(sa.select(*blob).where(*of_session)))
        unused = [
            ((row[0], row[1]), row[2])  # (namespace, channel), version
            for row in held
            if (kept := plan.values_kept.get(row[0], set())) is not None and (row[1], row[2]) not in kept
        ]
        for (ns, channel), versions in _by_place(unused):
            in_place = (
                *of_session,
                CHECKPOINT_BLOBS.c.checkpoint_ns == ns,
                CHECKPOINT_BLOBS.c.channel == channel,
            )
            await self._rowcount(
                sa.delete(CHECKPOINT_BLOBS).where(*in_place, in_list(CHECKPOINT_BLOBS.c.version, versions))
            )
        return len(plan.removed)

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


def _by_place(pairs: Iterable[tuple[Place, str]]) -> Iterator[tuple[Place, sa.BindParameter[Any]]]:
    """`(place, keys)`: each place (a namespace, say) and its keys, for `in_list(column, keys)`.

    The keys are one parameter (`in_list`): a lookup per key in the primary
    key, where a list of `(namespace, id)` pairs would be compared with each
    row, and one statement for any number of keys (many bound parameters
    cost more to compile and prepare than to delete the rows).
    """
    for place, group in groupby(sorted(pairs), key=lambda pair: pair[0]):
        keys = sa.bindparam("keys", [key for _, key in group], type_=TextList())
        yield place, keys
