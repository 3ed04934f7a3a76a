"""`uow.sessions`: an agent's conversations."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from memorm.errors import ConflictError, NotFoundError
from memorm.models import AGENTS, MESSAGES, SESSIONS, Session
from memorm.page import Page
from memorm.removal import DEFAULT_BATCH, Removed, check_batch
from memorm.repositories.base import Repository
from memorm.repositories.session_locks import lock_expired_sessions
from memorm.types import utcnow
from memorm.validation import (
    as_uuid,
    check_aware,
    check_duration,
    check_flag,
    check_json_object,
    check_name,
    check_text,
    later,
)

__all__ = ["SessionRepository"]


def _check_key(key: object) -> str:
    return check_name(key, "key", blank=True)  # a framework's id: any non-empty string


Lifetime = timedelta | float | int
"""A session's time to live: a `timedelta` or a number of seconds."""


class SessionRepository(Repository):
    """Chat sessions: create, read, page per agent, expire, delete."""

    async def create(
        self,
        agent_id: uuid.UUID | str,
        *,
        title: str | None = None,
        key: str | None = None,
        meta: Mapping[str, Any] | None = None,
        ttl: Lifetime | None = None,
    ) -> Session:
        """A new session of the agent (`NotFoundError` for an unknown agent).

        `key` is an optional external name (a framework's session id), unique
        per agent: a taken key raises `ConflictError`.  The session expires
        `ttl` after its creation (a `timedelta` or seconds), else after the
        agent's `retention`, else never.
        """
        owner = as_uuid(agent_id, "agent_id")
        lifetime = None if ttl is None else check_duration(ttl, "ttl")
        chat = Session(
            tenant=self._required_tenant,
            agent_id=owner,
            title=check_text(title, "title", optional=True),
            key=None if key is None else _check_key(key),
            meta=check_json_object(meta, "meta"),
        )
        found = (
            await self._execute(
                sa.select(AGENTS.c.retention).where(AGENTS.c.id == owner, *self._tenant_filter(AGENTS))
            )
        ).first()
        if found is None:
            raise NotFoundError(f"no agent {owner}")
        if lifetime is None and found.retention is not None:
            lifetime = check_duration(found.retention, "the agent's retention")
        if lifetime is not None:
            chat.expires_at = later(chat.created_at, lifetime, "ttl")
        # The agent may vanish meanwhile: FK -> NotFoundError.
        async with self._savepoint({"agent_id": owner, "key": chat.key}):
            self.session.add(chat)
            await self.session.flush()
        self._remember_agent(chat.id, owner)
        return chat

    async def get_or_create(
        self,
        agent_id: uuid.UUID | str,
        key: str,
        *,
        title: str | None = None,
        meta: Mapping[str, Any] | None = None,
        ttl: Lifetime | None = None,
    ) -> Session:
        """The agent's session with this external `key`, created on first use.

        Safe under concurrency: two units of work racing to create the same key
        both end up with the one session.  `title`, `meta` and `ttl` apply
        only to a session created here.
        """
        owner = as_uuid(agent_id, "agent_id")
        name = _check_key(key)
        found = await self.get_by_key(owner, name)
        if found is not None:
            return found
        try:
            return await self.create(owner, title=title, key=name, meta=meta, ttl=ttl)
        except ConflictError:  # created meanwhile by another unit of work
            found = await self.get_by_key(owner, name)
            if found is None:
                raise
            return found

    async def get_by_key(self, agent_id: uuid.UUID | str, key: str) -> Session | None:
        """The agent's session with this external `key`, or None."""
        owner = as_uuid(agent_id, "agent_id")
        chat: Session | None = await self._scalar(
            sa.select(Session)
            .where(
                *self._tenant_filter(SESSIONS),
                SESSIONS.c.agent_id == owner,
                SESSIONS.c.key == _check_key(key),
            )
            .execution_options(populate_existing=True)
        )
        if chat is not None:
            self._remember_agent(chat.id, owner)
        return chat

    async def get(self, session_id: uuid.UUID | str) -> Session:
        """The session with this id; `NotFoundError` if there is none."""
        key = as_uuid(session_id, "session_id")
        agent = await self._row_agent(key)
        chat: Session | None = await self._scalar(
            sa.select(Session).where(
                SESSIONS.c.id == key,
                *self._tenant_filter(SESSIONS),
                *self._agent_filter_if_known(SESSIONS, agent),
            )
        )
        if chat is None:
            raise NotFoundError(f"no session {key}")
        self._remember_agent(chat.id, chat.agent_id)
        return chat

    async def list(self, agent_id: uuid.UUID | str, *, limit: int = 50, offset: int = 0) -> Page[Session]:
        """The agent's sessions, oldest first."""
        key = as_uuid(agent_id, "agent_id")
        query = (
            sa.select(Session)
            .where(*self._tenant_filter(SESSIONS), SESSIONS.c.agent_id == key)
            .order_by(SESSIONS.c.created_at, SESSIONS.c.id)
        )
        return await self._page(query, limit=limit, offset=offset)

    async def delete(self, session_id: uuid.UUID | str) -> None:
        """Delete the session and its messages."""
        key = as_uuid(session_id, "session_id")
        agent = await self._row_agent(key)
        deleted = await self._rowcount(
            sa.delete(Session)
            .where(
                SESSIONS.c.id == key,
                *self._tenant_filter(SESSIONS),
                *self._agent_filter_if_known(SESSIONS, agent),
            )
            .execution_options(synchronize_session=False)
        )
        if deleted == 0:
            raise NotFoundError(f"no session {key}")
        self._forget_agent(key)

    # -- expiry ---------------------------------------------------------------

    async def touch(
        self, session_id: uuid.UUID | str, *, ttl: Lifetime | None, now: datetime | None = None
    ) -> Session:
        """Set the session to expire `ttl` from now (`None`: never); returns it.

        Call it as the session is used to keep active sessions alive, as a TTL
        refresh does in Redis.  `now` defaults to the current UTC time.
        """
        key = as_uuid(session_id, "session_id")
        lifetime = None if ttl is None else check_duration(ttl, "ttl")
        instant = utcnow() if now is None else check_aware(now, "now")
        expires_at = None if lifetime is None else later(instant, lifetime, "now + ttl")
        agent = await self._row_agent(key)
        statement = (
            sa.update(Session)
            .where(
                SESSIONS.c.id == key,
                *self._tenant_filter(SESSIONS),
                *self._agent_filter_if_known(SESSIONS, agent),
            )
            .values(expires_at=expires_at, updated_at=utcnow())
            .returning(Session)
            .execution_options(populate_existing=True, synchronize_session=False)
        )
        chat: Session | None = (await self._execute(statement)).scalars().first()
        if chat is None:
            raise NotFoundError(f"no session {key}")
        return chat

    async def purge_expired(
        self, *, now: datetime | None = None, batch: int = DEFAULT_BATCH, dry_run: bool = False
    ) -> Removed:
        """Delete every session that expired at or before `now`, with its messages.

        A session expires at its `expires_at`: one that expires at exactly
        `now` goes.  Deletes `batch` sessions per statement, all in this
        unit of work; to commit every batch (for a long purge beside live
        traffic) use [`memorm.retention.purge_expired`][memorm.retention.purge_expired].  On Postgres,
        sessions locked by a concurrent unit of work (an append in flight) are
        skipped and left for the next purge.  With `dry_run`, only counts.
        """
        instant = utcnow() if now is None else check_aware(now, "now")
        size = check_batch(batch)
        if check_flag(dry_run, "dry_run"):
            expired = sa.select(SESSIONS.c.tenant, SESSIONS.c.id).where(
                *self._tenant_filter_if_any(SESSIONS), SESSIONS.c.expires_at <= instant
            )
            messages = sa.select(MESSAGES.c.id).where(
                *self._tenant_filter_if_any(MESSAGES),
                sa.tuple_(MESSAGES.c.tenant, MESSAGES.c.session_id).in_(expired),
            )
            return Removed(sessions=await self._count(expired), messages=await self._count(messages))
        total = Removed()
        while True:
            removed = await self._purge_batch(instant, size)
            if removed.sessions == 0:
                return total
            total += removed

    async def _purge_batch(self, instant: datetime, size: int) -> Removed:
        """Delete up to `size` sessions expired at `instant`, soonest expired first."""
        # (tenant, id) pairs: across tenants, an id alone may name two sessions.
        expired = (
            sa.select(SESSIONS.c.tenant, SESSIONS.c.id)
            .where(*self._tenant_filter_if_any(SESSIONS), SESSIONS.c.expires_at <= instant)
            .order_by(SESSIONS.c.expires_at)
            .limit(size)
        )
        ids = await lock_expired_sessions(self.link, expired, SESSIONS.c.expires_at <= instant)
        if not ids:
            return Removed()
        # Messages first (the cascade would delete them too, but not count them).
        messages = await self._rowcount(
            sa.delete(MESSAGES).where(
                *self._tenant_filter_if_any(MESSAGES),
                sa.tuple_(MESSAGES.c.tenant, MESSAGES.c.session_id).in_(ids),
            )
        )
        sessions = await self._rowcount(
            sa.delete(SESSIONS).where(
                *self._tenant_filter_if_any(SESSIONS), sa.tuple_(SESSIONS.c.tenant, SESSIONS.c.id).in_(ids)
            )
        )
        return Removed(sessions=sessions, messages=messages)
