"""What a LangGraph saver does in memorm: each call one unit of work on its agent's sessions.

A thread is a session of the saver's agent (its key, the thread id), made
by the thread's first write; the saver remembers the sessions it made or
found, so that a write needs no lookup.
"""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta

from memorm.compat._extras import missing_extra

try:
    from langgraph.checkpoint.base import CheckpointTuple
except ImportError as error:
    raise missing_extra(__name__, "langgraph", error) from error

from memorm.compat.langgraph_agent import AgentRef
from memorm.compat.langgraph_codec import CheckpointCodec, Loaded, describe_checkpoint
from memorm.compat.langgraph_config import Listing, ThreadConfig
from memorm.compat.langgraph_retention import ThreadPurges
from memorm.db import Database
from memorm.errors import NotFoundError, ValidationError
from memorm.repositories.checkpoint_records import CheckpointKey, StoredCheckpoint, StoredWrite, Value
from memorm.uow import UnitOfWork

__all__ = ["PAGE", "CheckpointStorage"]

PAGE = 100
"""Checkpoints read per query when listing."""

_SESSIONS_KEPT = 4096  # threads whose session id a saver remembers (then it starts again)


class CheckpointStorage(CheckpointCodec):
    """The part of `MemormSaver` that reads and writes: its units of work, given checked arguments."""

    db: Database
    ttl: timedelta | None
    _agent: AgentRef  # the agent given, or the default one once found or made
    _sessions: dict[str, uuid.UUID]  # thread key -> session id (see `MemormSaver.__init__`)
    _purges: ThreadPurges | None  # with a retention policy: its count of writes per thread

    @property
    def agent_id(self) -> uuid.UUID:
        """The id of the agent whose sessions hold the threads (`AgentRef.id`: `NotFoundError`
        while the default agent is not yet found or made)."""
        return self._agent.id

    async def _known_agent(self, db: Database, *, make: bool) -> bool:
        """Whether the saver's agent exists (the default one looked up, or made when `make`)."""
        return await self._agent.find(db, make=make) is not None

    async def _page(self, db: Database, query: Listing) -> builtins.list[CheckpointTuple]:
        """The next page of a listing; marks the listing done after its last page."""
        if not await self._known_agent(db, make=False):
            query.done = True  # no agent yet, so no checkpoints
            return []
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
    ) -> Loaded:
        """The checkpoints with their channel values and pending writes (unless given), read in `uow`.

        `known`: one checkpoint's channel values, read with it (`find`).
        """
        checkpoints = [self._load(stored.value, describe_checkpoint(stored)) for stored in found]
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
        await self._known_agent(db, make=True)
        known = self._sessions.get(key)
        # Known, with no expiry to move: the write is the unit of work's one statement.
        alone = known is not None and self.ttl is None
        try:
            async with UnitOfWork(db.backend, tenant=db.tenant, one_statement=alone) as uow:
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
        self, db: Database, where: ThreadConfig, stored: StoredCheckpoint, blobs: dict[tuple[str, str], Value]
    ) -> None:
        async def write(uow: UnitOfWork, session: uuid.UUID) -> None:
            key = stored.key._replace(session_id=session)
            await uow.checkpoints.put(self.agent_id, stored._replace(key=key), blobs)

        await self._in_session(db, where.key, write)
        if self._purges is not None:
            await self._purges.after_put(db, self.agent_id, where.key, self._sessions.get(where.key))

    async def _put_writes(
        self, db: Database, where: ThreadConfig, rows: builtins.list[StoredWrite], replace: bool
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
        if not await self._known_agent(db, make=False):
            return
        async with db.unit_of_work() as uow:
            chat = await uow.sessions.get_by_key(self.agent_id, key)
            if chat is not None:
                await uow.checkpoints.delete_session(self.agent_id, chat.id)

    async def _delete_runs(self, db: Database, run_ids: builtins.list[str]) -> None:
        if run_ids and await self._known_agent(db, make=False):
            async with db.unit_of_work() as uow:
                await uow.checkpoints.delete_runs(self.agent_id, run_ids)

    async def _copy_thread(self, db: Database, source: str, target: str) -> None:
        if not await self._known_agent(db, make=False):
            return  # no agent, so no source thread
        async with db.unit_of_work() as uow:
            chat = await uow.sessions.get_by_key(self.agent_id, source)
            if chat is None:
                return  # nothing to copy: the target is left as it is
            into = await self._session(uow, target)
            if into != chat.id:
                await uow.checkpoints.copy_session(self.agent_id, chat.id, into)

    async def _prune(self, db: Database, thread: str, strategy: str) -> None:
        if not await self._known_agent(db, make=False):
            return
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
                versions = (
                    self._load(head.value, describe_checkpoint(head)).get("channel_versions") or {}
                ).items()
                keep[head.key.checkpoint_ns] = (
                    head.key.checkpoint_id,
                    [(channel, str(version)) for channel, version in versions],
                )
            await uow.checkpoints.prune(self.agent_id, chat.id, keep)
