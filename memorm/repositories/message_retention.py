"""Deleting chat history by age: `uow.messages.delete_before`.

A message goes when it was created before the cutoff.  So that no session is
left with a tool answer whose call is gone (chat APIs reject such a log), the
answers of a deleted message go with it: the `tool` messages that follow it
up to the session's next message of another role.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql import ColumnElement

from memorm.models import MESSAGES, SESSIONS
from memorm.repositories.message_queries import MessageQueries
from memorm.repositories.session_locks import lock_sessions
from memorm.validation import as_uuid, check_aware, check_flag

__all__ = ["MessageRetention", "with_answers"]

OLD_BATCH = 10_000  # messages per DELETE in delete_before


def _old(tenant: str, owner: uuid.UUID, instant: datetime, chat: uuid.UUID | None) -> ColumnElement[bool]:
    scope = [MESSAGES.c.tenant == tenant, MESSAGES.c.agent_id == owner, MESSAGES.c.created_at < instant]
    if chat is not None:
        scope.append(MESSAGES.c.session_id == chat)
    return sa.and_(*scope)


def _previous(answer: sa.FromClause, column: str, agent: uuid.UUID | None = None) -> sa.ScalarSelect[Any]:
    """`column` of the message before `answer` (by `seq`) whose role is not `tool`.

    `agent`: `answer`'s agent when known.  Citus runs this correlated lookup
    on one shard only when its own table names the agent (a parameter);
    across agents it is joined on the agent, so that every shard runs it.
    """
    head = MESSAGES.alias("head")
    return (
        sa.select(head.c[column])
        .where(
            head.c.tenant == answer.c.tenant,
            head.c.agent_id == (answer.c.agent_id if agent is None else agent),  # implied by the session
            head.c.session_id == answer.c.session_id,
            head.c.seq < answer.c.seq,
            head.c.role != "tool",
        )
        .order_by(head.c.seq.desc())
        .limit(1)
        .scalar_subquery()
    )


def with_answers(doomed: ColumnElement[bool]) -> ColumnElement[bool]:
    """The messages matching `doomed` (a condition on `messages`), and their tool answers.

    The answers are found as
    [`MessageRetention.delete_before`][memorm.repositories.MessageRepository.delete_before]
    finds them: the `tool` messages whose block (the nearest earlier message of
    another role) starts with a doomed message, whatever their own columns hold.
    """
    answer = MESSAGES.alias("answer")
    # Uncorrelated: inside a DELETE FROM messages, these must still read the table afresh.
    # Rows are matched by (tenant, id): ids are unique only within a tenant.
    heads = sa.select(MESSAGES.c.tenant, MESSAGES.c.id).where(doomed).correlate(None)
    chats = sa.select(MESSAGES.c.tenant, MESSAGES.c.session_id).where(doomed).correlate(None)
    answers = sa.select(answer.c.tenant, answer.c.id).where(
        answer.c.role == "tool",
        sa.tuple_(answer.c.tenant, answer.c.session_id).in_(chats),
        sa.tuple_(answer.c.tenant, _previous(answer, "id")).in_(heads),
    )
    return sa.or_(doomed, sa.tuple_(MESSAGES.c.tenant, MESSAGES.c.id).in_(answers))


def _newer_answers(
    answer: sa.FromClause, tenant: str, owner: uuid.UUID, instant: datetime, chat: uuid.UUID | None
) -> ColumnElement[bool]:
    """`answer` is a tool message from `instant` on whose block's head is older.

    Each candidate looks back one step on the `(session_id, seq)` index to the
    nearest message of another role: the head of its tool-call block.
    """
    return sa.and_(
        answer.c.tenant == tenant,
        answer.c.agent_id == owner,
        answer.c.created_at >= instant,
        answer.c.role == "tool",
        *([answer.c.session_id == chat] if chat is not None else []),
        _previous(answer, "created_at", owner) < instant,
    )


def _in_expired(message: sa.FromClause, owner: uuid.UUID, instant: datetime) -> sa.Exists:
    """`message`, of agent `owner`, is in a session that expired at or before `instant`.

    An EXISTS that names the agent, not `session_id IN (SELECT …)`: Citus
    runs the first on the agent's shard, the second as a query of its own
    over every shard.
    """
    return sa.exists().where(
        SESSIONS.c.tenant == message.c.tenant,
        SESSIONS.c.agent_id == owner,
        SESSIONS.c.id == message.c.session_id,
        SESSIONS.c.expires_at <= instant,
    )


class MessageRetention(MessageQueries):
    """The age-based deletion of [`MessageRepository`][memorm.repositories.MessageRepository]."""

    async def delete_before(
        self,
        agent_id: uuid.UUID | str,
        cutoff: datetime,
        *,
        session_id: uuid.UUID | str | None = None,
        dry_run: bool = False,
    ) -> int:
        """Delete the agent's messages created before `cutoff` (of one session, if given).

        System messages too.  The tool answers of a deleted message go with it
        (they follow it, up to the next message of another role), so no session
        is left with a tool answer whose call is gone.  Sessions stay, even
        when emptied.  Returns how many messages were deleted (with
        `dry_run`, how many would be).  For a long purge that commits as it
        goes, see [`memorm.retention.purge_older_than`][memorm.retention.purge_older_than].
        """
        owner = as_uuid(agent_id, "agent_id")
        instant = check_aware(cutoff, "cutoff")
        chat = None if session_id is None else as_uuid(session_id, "session_id")
        check_flag(dry_run, "dry_run")
        await self._scope(owner, chat, None)  # NotFoundError for an unknown agent or another's session
        if dry_run:
            return await self._count_old(owner, instant, chat)
        deleted = await self._delete_answers(owner, instant, chat)
        while count := await self._delete_old_batch(owner, instant, chat, OLD_BATCH):
            deleted += count
        return deleted

    async def _count_old(
        self, owner: uuid.UUID, instant: datetime, chat: uuid.UUID | None, expired_at: datetime | None = None
    ) -> int:
        """How many messages `delete_before` would delete.

        `expired_at`: leave out sessions expired at that instant (a purge of
        expired sessions runs first and takes their messages).
        """
        answer = MESSAGES.alias("answer")
        tenant = self._required_tenant
        old = sa.select(sa.func.count()).where(_old(tenant, owner, instant, chat))
        answers = sa.select(sa.func.count()).where(_newer_answers(answer, tenant, owner, instant, chat))
        if expired_at is not None:
            old = old.where(~_in_expired(MESSAGES, owner, expired_at))
            answers = answers.where(~_in_expired(answer, owner, expired_at))
        return int(await self._scalar(old)) + int(await self._scalar(answers))

    async def _delete_answers(self, owner: uuid.UUID, instant: datetime, chat: uuid.UUID | None) -> int:
        """Delete the newer tool answers of old messages (before those go: the answers are found by them)."""
        answer = MESSAGES.alias("answer")
        tenant = self._required_tenant
        found = sa.select(answer.c.id).where(_newer_answers(answer, tenant, owner, instant, chat))
        sessions = sa.select(answer.c.session_id).where(_newer_answers(answer, tenant, owner, instant, chat))
        await lock_sessions(
            self.link,
            SESSIONS.c.tenant == tenant,
            SESSIONS.c.agent_id == owner,
            SESSIONS.c.id.in_(sessions.scalar_subquery()),
        )
        return await self._rowcount(
            sa.delete(MESSAGES).where(
                MESSAGES.c.tenant == tenant,
                MESSAGES.c.agent_id == owner,
                MESSAGES.c.id.in_(found.scalar_subquery()),
            )
        )

    async def _delete_old_batch(
        self, owner: uuid.UUID, instant: datetime, chat: uuid.UUID | None, size: int
    ) -> int:
        """Delete up to `size` messages created before `instant`, oldest first; returns how many."""
        tenant = self._required_tenant
        doomed = (
            sa.select(MESSAGES.c.id, MESSAGES.c.session_id)
            .where(_old(tenant, owner, instant, chat))
            .order_by(MESSAGES.c.created_at)
            .limit(size)
            .subquery()
        )
        await lock_sessions(
            self.link,
            SESSIONS.c.tenant == tenant,
            SESSIONS.c.agent_id == owner,
            SESSIONS.c.id.in_(sa.select(doomed.c.session_id).scalar_subquery()),
        )
        return await self._rowcount(
            sa.delete(MESSAGES).where(
                MESSAGES.c.tenant == tenant,
                MESSAGES.c.agent_id == owner,
                MESSAGES.c.id.in_(sa.select(doomed.c.id)),
            )
        )
