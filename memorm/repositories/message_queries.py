"""Reading the chat log: single messages, counts, full-text and date search.

Also what every read of it shares (`_select`, `_require_session`, the
columns read).  The chat path's hot reads, windows and context budgets, are
`memorm.repositories.message_windows`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import date, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql import ColumnElement

from memorm.errors import NotFoundError
from memorm.models import MESSAGES, SESSIONS, Message, fields, hydrate_all
from memorm.page import Page
from memorm.repositories.base import Repository
from memorm.repositories.message_input import check_roles
from memorm.search.fts_ddl import MESSAGES_FTS
from memorm.search.text import search_page
from memorm.validation import INT32_MAX, INT32_MIN, as_instant, as_uuid, check_limit, check_text

__all__ = ["MessageQueries"]

_FIELDS = fields(MESSAGES)  # not the derived search words
_COLUMNS = tuple(column.name for column in _FIELDS)
SEQ_MAX = INT32_MAX  # seq is a 32-bit integer
SEQ_MIN = INT32_MIN


class MessageQueries(Repository):
    """The read side of [`MessageRepository`][memorm.repositories.MessageRepository]."""

    # -- reading ------------------------------------------------------------

    async def get(self, message_id: uuid.UUID | str) -> Message:
        """The message with this id; `NotFoundError` if there is none."""
        key = as_uuid(message_id, "message_id")
        found = await self._select(MESSAGES.c.id == key)
        if not found:
            raise NotFoundError(f"no message {key}")
        return found[0]

    async def count(self, session_id: uuid.UUID | str, *, roles: Iterable[str] | None = None) -> int:
        """How many messages the session holds (of these roles, if given)."""
        key = as_uuid(session_id, "session_id")
        wanted = check_roles(roles)
        query = sa.select(sa.func.count()).where(*await self._session_messages(key))
        if wanted is not None:
            query = query.where(MESSAGES.c.role.in_(wanted))
        total = int(await self._scalar(query) or 0)
        if not total:
            await self._require_session(key)
        return total

    async def search(
        self,
        agent_id: uuid.UUID | str,
        query: str,
        *,
        session_id: uuid.UUID | str | None = None,
        roles: Iterable[str] | None = None,
        limit: int = 10,
        offset: int = 0,
    ) -> Page[Message]:
        """Full-text search of the agent's messages (all words must match).

        Ordered by relevance, then newest first, then id; `total` counts every
        match.  Any string is safe: FTS operators and SQL are searched as words.

        Args:
            agent_id: the agent whose messages to search.
            query: the words to find.
            session_id: search only this session of the agent.
            roles: keep only those roles.
            limit: the page size.
            offset: how many matches to skip.
        """
        text = check_text(query, "query") or ""
        check_limit(limit, offset)
        agent = as_uuid(agent_id, "agent_id")
        narrowing = self._narrowing(session_id, roles)
        page = await search_page(
            self.link,
            MESSAGES_FTS,
            text,
            entity=Message,
            tenant=self._required_tenant,
            agent=agent,
            where=narrowing,
            limit=limit,
            offset=offset,
        )
        if not page.total:  # a match proves the agent (and session) exist: only no match asks
            await self._check_scope(agent, session_id)
        return page

    async def between(
        self,
        agent_id: uuid.UUID | str,
        start: datetime | date,
        end: datetime | date,
        *,
        session_id: uuid.UUID | str | None = None,
        roles: Iterable[str] | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> Page[Message]:
        """The agent's messages created from `start` to `end`, chronological.

        Args:
            agent_id: the agent whose messages to read.
            start: the first instant (inclusive), or a date (from its start, UTC).
            end: the last instant (inclusive), or a date, which includes that
                whole day (UTC).
            session_id: read only this session of the agent.
            roles: keep only those roles.
            limit: the page size.
            offset: how many messages to skip.
        """
        lower, _ = as_instant(start, "start", end=False)
        upper, inclusive = as_instant(end, "end", end=True)
        check_limit(limit, offset)
        where = await self._scope(agent_id, session_id, roles)
        where.append(MESSAGES.c.created_at >= lower)
        where.append(MESSAGES.c.created_at <= upper if inclusive else MESSAGES.c.created_at < upper)
        query = (
            sa.select(Message)
            .where(*where)
            .order_by(MESSAGES.c.created_at, MESSAGES.c.id)
            .execution_options(populate_existing=True)
        )
        return await self._page(query, limit=limit, offset=offset)

    # -- helpers ------------------------------------------------------------

    async def _scope(
        self,
        agent_id: uuid.UUID | str,
        session_id: uuid.UUID | str | None,
        roles: Iterable[str] | None,
    ) -> list[ColumnElement[bool]]:
        """Filters for one agent (and one of its sessions); NotFoundError for unknown ids."""
        agent = as_uuid(agent_id, "agent_id")
        narrowing = self._narrowing(session_id, roles)
        await self._check_scope(agent, session_id)
        return [*self._tenant_filter(MESSAGES), MESSAGES.c.agent_id == agent, *narrowing]

    def _narrowing(
        self, session_id: uuid.UUID | str | None, roles: Iterable[str] | None
    ) -> list[ColumnElement[bool]]:
        """Filters within an agent's messages: one session, some roles."""
        where: list[ColumnElement[bool]] = []
        if session_id is not None:
            where.append(MESSAGES.c.session_id == as_uuid(session_id, "session_id"))
        wanted = check_roles(roles)
        if wanted is not None:
            where.append(MESSAGES.c.role.in_(wanted))
        return where

    async def _check_scope(self, agent: uuid.UUID, session_id: uuid.UUID | str | None) -> None:
        """NotFoundError unless the agent exists (and the session is one of its own)."""
        if session_id is None:
            await self._require_agent(agent)
            return
        chat = as_uuid(session_id, "session_id")
        owner = await self._scalar(
            sa.select(SESSIONS.c.agent_id).where(
                SESSIONS.c.id == chat, SESSIONS.c.agent_id == agent, *self._tenant_filter(SESSIONS)
            )
        )
        if owner != agent:
            raise NotFoundError(f"no session {chat} for agent {agent}")

    async def _select(
        self, *where: ColumnElement[bool], order: Any = None, limit: int | None = None
    ) -> list[Message]:
        """Messages matching `where`, read with Core and built with `hydrate`.

        Of this tenant's rows only.  Several times cheaper per row than an ORM query, and never stale: the
        identity map is bypassed (Core UPDATEs, such as prepend moving the
        system message, would otherwise leave it holding old values).
        """
        query = sa.select(*_FIELDS).where(*self._tenant_filter(MESSAGES), *where)
        if order is not None:
            query = query.order_by(order)
        if limit is not None:
            query = query.limit(limit)
        result = await self._execute(query)
        return hydrate_all(Message, _COLUMNS, result)

    async def _require_session(self, key: uuid.UUID) -> None:
        if await self._scalar(sa.select(SESSIONS.c.id).where(*await self._session_row(key))) is None:
            raise NotFoundError(f"no session {key}")
