"""``uow.sessions``: an agent's conversations."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from memorm.errors import ConflictError, NotFoundError, ValidationError
from memorm.models import AGENTS, SESSIONS, Session
from memorm.page import Page
from memorm.repositories.base import Repository
from memorm.validation import as_uuid, check_json_object, check_text

__all__ = ["SessionRepository"]


def _check_key(key: object) -> str:
    checked = check_text(key, "key") or ""
    if not checked:
        raise ValidationError("key: must not be empty")
    return checked


class SessionRepository(Repository):
    """Chat sessions: create, read, page per agent, delete."""

    async def create(
        self,
        agent_id: uuid.UUID | str,
        *,
        title: str | None = None,
        key: str | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> Session:
        """A new session of the agent (``NotFoundError`` for an unknown agent).

        ``key`` is an optional external name (a framework's session id), unique
        per agent: a taken key raises ``ConflictError``.
        """
        owner = as_uuid(agent_id, "agent_id")
        chat = Session(
            agent_id=owner,
            title=check_text(title, "title", optional=True),
            key=None if key is None else _check_key(key),
            meta=check_json_object(meta, "meta"),
        )
        if await self._scalar(sa.select(AGENTS.c.id).where(AGENTS.c.id == owner)) is None:
            raise NotFoundError(f"no agent {owner}")
        async with self._savepoint():  # the agent may vanish meanwhile: FK -> NotFoundError
            self.session.add(chat)
            await self.session.flush()
        return chat

    async def get_or_create(
        self,
        agent_id: uuid.UUID | str,
        key: str,
        *,
        title: str | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> Session:
        """The agent's session with this external ``key``, created on first use.

        Safe under concurrency: two units of work racing to create the same key
        both end up with the one session.
        """
        owner = as_uuid(agent_id, "agent_id")
        name = _check_key(key)
        found = await self.get_by_key(owner, name)
        if found is not None:
            return found
        try:
            return await self.create(owner, title=title, key=name, meta=meta)
        except ConflictError:  # created meanwhile by another unit of work
            found = await self.get_by_key(owner, name)
            if found is None:
                raise
            return found

    async def get_by_key(self, agent_id: uuid.UUID | str, key: str) -> Session | None:
        """The agent's session with this external ``key``, or None."""
        owner = as_uuid(agent_id, "agent_id")
        chat: Session | None = await self._scalar(
            sa.select(Session)
            .where(SESSIONS.c.agent_id == owner, SESSIONS.c.key == _check_key(key))
            .execution_options(populate_existing=True)
        )
        return chat

    async def get(self, session_id: uuid.UUID | str) -> Session:
        """The session with this id; ``NotFoundError`` if there is none."""
        key = as_uuid(session_id, "session_id")
        chat: Session | None = await self._scalar(sa.select(Session).where(SESSIONS.c.id == key))
        if chat is None:
            raise NotFoundError(f"no session {key}")
        return chat

    async def list(self, agent_id: uuid.UUID | str, *, limit: int = 50, offset: int = 0) -> Page[Session]:
        """The agent's sessions, oldest first."""
        key = as_uuid(agent_id, "agent_id")
        query = (
            sa.select(Session)
            .where(SESSIONS.c.agent_id == key)
            .order_by(SESSIONS.c.created_at, SESSIONS.c.id)
        )
        return await self._page(query, limit=limit, offset=offset)

    async def delete(self, session_id: uuid.UUID | str) -> None:
        """Delete the session and its messages."""
        key = as_uuid(session_id, "session_id")
        result = await self._execute(
            sa.delete(Session).where(SESSIONS.c.id == key).execution_options(synchronize_session=False)
        )
        if result.rowcount == 0:  # type: ignore[attr-defined]
            raise NotFoundError(f"no session {key}")
