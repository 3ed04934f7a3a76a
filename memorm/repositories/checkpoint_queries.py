"""Reading a graph's state: `uow.checkpoints`' listings, lookups, writes and channel values.

`CheckpointQueries` is the read half of
[`CheckpointRepository`][memorm.repositories.CheckpointRepository]; its
statements are built once (`memorm.repositories.checkpoint_read_statements`).
"""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql import ColumnElement

from memorm.driver import fetch
from memorm.models import CHECKPOINTS, SESSIONS
from memorm.repositories.base import Repository
from memorm.repositories.checkpoint_read_statements import (
    IN_SESSION,
    LISTED,
    WRITES_OF,
    blobs_of,
    listing,
    padded,
    thread_reads,
    writes_of,
)
from memorm.repositories.checkpoint_records import (
    CheckpointKey,
    FoundCheckpoint,
    StoredCheckpoint,
    StoredWrite,
    Value,
    stored_checkpoint,
)
from memorm.search.filters import json_key_conditions
from memorm.translate import guarded
from memorm.validation import MAX_PAGE, as_uuid, check_int, check_name

__all__ = ["CheckpointQueries"]


class CheckpointQueries(Repository):
    """The reads of checkpoints, pending writes and channel values of an agent's sessions."""

    def _agent_filter(self, table: sa.Table, agent_id: uuid.UUID | str) -> list[ColumnElement[bool]]:
        return [*self._tenant_filter(table), table.c.agent_id == as_uuid(agent_id, "agent_id")]

    def _session_filter(
        self, table: sa.Table, agent_id: uuid.UUID | str, session_id: uuid.UUID | str
    ) -> list[ColumnElement[bool]]:
        return [*self._agent_filter(table, agent_id), table.c.session_id == as_uuid(session_id, "session_id")]

    async def list(
        self,
        agent_id: uuid.UUID | str,
        session_id: uuid.UUID | str | None = None,
        *,
        session_key: str | None = None,
        checkpoint_ns: str | None = None,
        checkpoint_id: str | None = None,
        meta: Mapping[str, Any] | None = None,
        before: str | None = None,
        after: CheckpointKey | None = None,
        limit: int = 100,
    ) -> builtins.list[StoredCheckpoint]:
        """The agent's checkpoints, newest first (by `checkpoint_id`), `limit` at most.

        Narrowed to a session (by id, or by its `session_key`: a LangGraph
        thread id), a namespace, one id, those whose metadata holds every
        key of `meta`, and those before the id `before`.  `after` is the
        last checkpoint of the previous page: the page starts after it.
        """
        size = check_int(limit, "limit", minimum=1, maximum=MAX_PAGE)
        agent = as_uuid(agent_id, "agent_id")
        params: dict[str, Any] = {"tenant": self._required_tenant, "agent": agent, "limit": size}
        if session_id is not None:
            params["session_id"] = as_uuid(session_id, "session_id")
        if session_key is not None:
            params["key"] = check_name(session_key, "session_key", blank=True)
        if checkpoint_ns is not None:
            params["ns"] = checkpoint_ns
        if checkpoint_id is not None:
            params["checkpoint_id"] = checkpoint_id
        if before is not None:
            params["before"] = before
        if after is not None:
            params.update(
                after_checkpoint_id=after.checkpoint_id,
                after_session_id=after.session_id,
                after_checkpoint_ns=after.checkpoint_ns,
            )
        query = listing(
            session_id is not None,
            session_key is not None,
            checkpoint_ns is not None,
            checkpoint_id is not None,
            before is not None,
            after is not None,
        )
        if meta:  # a filter's conditions vary with its keys and values: built for this call
            conditions = json_key_conditions(self.link, CHECKPOINTS.c.meta, meta, "filter")
            return [stored_checkpoint(row) for row in await self._execute(query.where(*conditions), params)]
        async with guarded(self.link):
            return [stored_checkpoint(row) for row in await fetch(self.link, query, params)]

    async def find(
        self, agent_id: uuid.UUID | str, session_key: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> FoundCheckpoint | None:
        """The checkpoint of the agent's session with this key (newest without an id), writes and values.

        None if there is none.  One statement: the session is found by its
        key in it, and the writes and the channels' values come along.
        """
        key = check_name(session_key, "session_key", blank=True)
        params = {
            "tenant": self._required_tenant,
            "agent": as_uuid(agent_id, "agent_id"),
            "key": key,
            "ns": checkpoint_ns,
        }
        latest, by_id = thread_reads(self.link)
        if checkpoint_id is None:
            rows = await fetch(self.link, latest, params)
        else:
            rows = await fetch(self.link, by_id, {**params, "checkpoint_id": checkpoint_id})
        if not rows:
            return None
        writes, values = [], {}
        for row in rows:
            part, first, second, kind, value, path, idx = row[9:]
            if part == "b":
                if kind is not None:  # (a version whose value is not stored has none)
                    values[first, second] = (kind, value)
            elif first is not None:
                writes.append(StoredWrite(first, second, (kind, value), path, idx))
        unknown = rows[0][8]
        return FoundCheckpoint(stored_checkpoint(rows[0][:8]), writes, None if unknown else values)

    async def heads(
        self, agent_id: uuid.UUID | str, session_id: uuid.UUID | str
    ) -> builtins.list[StoredCheckpoint]:
        """The newest checkpoint of each namespace of a session."""
        where = self._session_filter(CHECKPOINTS, agent_id, session_id)
        newest = (
            sa.select(CHECKPOINTS.c.checkpoint_ns, sa.func.max(CHECKPOINTS.c.checkpoint_id).label("newest"))
            .where(*where)
            .group_by(CHECKPOINTS.c.checkpoint_ns)
            .subquery()
        )
        query = (
            sa.select(*LISTED, CHECKPOINTS.c.meta, SESSIONS.c.key)
            .join(SESSIONS, IN_SESSION)
            .join(
                newest,
                sa.and_(
                    newest.c.checkpoint_ns == CHECKPOINTS.c.checkpoint_ns,
                    newest.c.newest == CHECKPOINTS.c.checkpoint_id,
                ),
            )
            .where(*where)
        )
        return [stored_checkpoint(row) for row in await self._execute(query)]

    async def blobs(
        self,
        agent_id: uuid.UUID | str,
        session_id: uuid.UUID,
        checkpoint_ns: str,
        wanted: Iterable[tuple[str, str]],
    ) -> dict[tuple[str, str], Value]:
        """The stored values of these `(channel, version)`s of a session's namespace (if stored)."""
        pairs = sorted(set(wanted))
        params: dict[str, Any] = {"tenant": self._required_tenant, "agent": as_uuid(agent_id, "agent_id")}
        params.update(session_id=session_id, ns=checkpoint_ns)
        found: dict[tuple[str, str], Value] = {}
        for size, named in padded(pairs, ("channel", "version")):
            for channel, version, kind, value in await fetch(self.link, blobs_of(size), {**params, **named}):
                found[channel, version] = (kind, value)
        return found

    async def writes(
        self, agent_id: uuid.UUID | str, keys: Iterable[CheckpointKey]
    ) -> dict[CheckpointKey, builtins.list[StoredWrite]]:
        """The pending writes of these checkpoints, each's in order of `(task_path, task_id, idx)`."""
        wanted = sorted(set(keys))
        found: dict[CheckpointKey, builtins.list[StoredWrite]] = {key: [] for key in wanted}
        if not wanted:
            return found
        if len(wanted) == 1:  # a graph's aget_tuple: the statement built once
            (session, ns, checkpoint), agent = wanted[0], as_uuid(agent_id, "agent_id")
            params = {"tenant": self._required_tenant, "agent": agent, "session_id": session, "ns": ns}
            written = await fetch(self.link, WRITES_OF, {**params, "checkpoint_id": checkpoint})
            found[wanted[0]] = [
                StoredWrite(task, channel, (kind, value), path, idx)
                for task, channel, kind, value, path, idx in written
            ]
            return found
        params = {"tenant": self._required_tenant, "agent": as_uuid(agent_id, "agent_id")}
        for size, named in padded(wanted, ("session", "ns", "checkpoint")):
            async with guarded(self.link):
                rows = await fetch(self.link, writes_of(size), {**params, **named})
            for session, ns, checkpoint, task, channel, kind, value, path, idx in rows:
                found[CheckpointKey(session, ns, checkpoint)].append(
                    StoredWrite(task, channel, (kind, value), path, idx)
                )
        return found

    async def sessions_with_state(self, agent_id: uuid.UUID | str) -> builtins.list[uuid.UUID]:
        """The agent's sessions that hold checkpoints (a graph's threads), in id order."""
        query = (
            sa.select(CHECKPOINTS.c.session_id)
            .where(*self._agent_filter(CHECKPOINTS, agent_id))
            .distinct()
            .order_by(CHECKPOINTS.c.session_id)
        )
        return [row[0] for row in await self._execute(query)]
