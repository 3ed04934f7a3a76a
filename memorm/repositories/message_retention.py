"""Deleting chat history by age: ``uow.messages.delete_before``.

A message goes when it was created before the cutoff.  So that no session is
left with a tool answer whose call is gone (chat APIs reject such a log), the
answers of a deleted message go with it: the ``tool`` messages that follow it
up to the session's next message of another role.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql import ColumnElement

from memorm.errors import NotFoundError
from memorm.models import AGENTS, MESSAGES, SESSIONS
from memorm.repositories.base import Repository
from memorm.validation import as_uuid, check_aware

__all__ = ["MessageRetention"]

OLD_BATCH = 10_000  # messages per DELETE in delete_before
_IDS_PER_STATEMENT = 5_000  # bound parameters stay far below asyncpg's 32,767


def _old(owner: uuid.UUID, instant: datetime, chat: uuid.UUID | None) -> ColumnElement[bool]:
    scope = [MESSAGES.c.agent_id == owner, MESSAGES.c.created_at < instant]
    if chat is not None:
        scope.append(MESSAGES.c.session_id == chat)
    return sa.and_(*scope)


def _previous(answer: sa.FromClause, column: str) -> sa.ScalarSelect[Any]:
    """``column`` of the message before ``answer`` (by ``seq``) whose role is not ``tool``."""
    head = MESSAGES.alias("head")
    return (
        sa.select(head.c[column])
        .where(head.c.session_id == answer.c.session_id, head.c.seq < answer.c.seq, head.c.role != "tool")
        .order_by(head.c.seq.desc())
        .limit(1)
        .scalar_subquery()
    )


class MessageRetention(Repository):
    """The age-based deletion of :class:`~memorm.repositories.MessageRepository`."""

    async def delete_before(
        self,
        agent_id: uuid.UUID | str,
        cutoff: datetime,
        *,
        session_id: uuid.UUID | str | None = None,
        dry_run: bool = False,
    ) -> int:
        """Delete the agent's messages created before ``cutoff`` (of one session, if given).

        System messages too.  The tool answers of a deleted message go with it
        (they follow it, up to the next message of another role), so no session
        is left with a tool answer whose call is gone.  Sessions stay, even
        when emptied.  Returns how many messages were deleted (with
        ``dry_run``, how many would be).  For a long purge that commits as it
        goes, see :func:`memorm.retention.purge_older_than`.
        """
        owner = as_uuid(agent_id, "agent_id")
        instant = check_aware(cutoff, "cutoff")
        chat = None if session_id is None else as_uuid(session_id, "session_id")
        await self._scope_owner(owner, chat)
        if dry_run:
            return await self._count_old(owner, instant, chat)
        deleted = 0
        while count := await self._delete_old_batch(owner, instant, chat, OLD_BATCH):
            deleted += count
        return deleted

    async def _scope_owner(self, owner: uuid.UUID, chat: uuid.UUID | None) -> None:
        """Check the agent exists and owns the session (``NotFoundError`` otherwise)."""
        if chat is None:
            if await self._scalar(sa.select(AGENTS.c.id).where(AGENTS.c.id == owner)) is None:
                raise NotFoundError(f"no agent {owner}")
        elif await self._scalar(sa.select(SESSIONS.c.agent_id).where(SESSIONS.c.id == chat)) != owner:
            raise NotFoundError(f"agent {owner} has no session {chat}")

    async def _count_old(
        self, owner: uuid.UUID, instant: datetime, chat: uuid.UUID | None, expired_at: datetime | None = None
    ) -> int:
        """How many messages ``delete_before`` would delete.

        ``expired_at``: leave out sessions expired at that instant (a purge of
        expired sessions runs first and takes their messages).
        """
        answer = MESSAGES.alias("answer")
        live: list[ColumnElement[bool]] = []
        live_answers: list[ColumnElement[bool]] = []
        if expired_at is not None:
            expired = sa.select(SESSIONS.c.id).where(SESSIONS.c.expires_at <= expired_at).scalar_subquery()
            live.append(MESSAGES.c.session_id.not_in(expired))
            live_answers.append(answer.c.session_id.not_in(expired))
        old = await self._scalar(sa.select(sa.func.count()).where(_old(owner, instant, chat), *live))
        # Plus the answers (themselves newer) of the old messages.
        answers = await self._scalar(
            sa.select(sa.func.count())
            .select_from(answer)
            .where(
                answer.c.agent_id == owner,
                answer.c.role == "tool",
                answer.c.created_at >= instant,
                *([answer.c.session_id == chat] if chat is not None else []),
                *live_answers,
                _previous(answer, "created_at") < instant,
            )
        )
        return int(old) + int(answers)

    async def _delete_old_batch(
        self, owner: uuid.UUID, instant: datetime, chat: uuid.UUID | None, size: int
    ) -> int:
        """Delete up to ``size`` old messages, oldest first, with their answers; returns how many went."""
        rows = (
            await self._execute(
                sa.select(MESSAGES.c.id, MESSAGES.c.role, MESSAGES.c.session_id)
                .where(_old(owner, instant, chat))
                .order_by(MESSAGES.c.created_at)
                .limit(size)
            )
        ).all()
        doomed: set[uuid.UUID] = {row.id for row in rows}
        heads = [row for row in rows if row.role != "tool"]
        answer = MESSAGES.alias("answer")
        for start in range(0, len(heads), _IDS_PER_STATEMENT):
            chunk = heads[start : start + _IDS_PER_STATEMENT]
            # Each tool message of these sessions looks back to its block's head (one
            # index step): it goes if that head is among the doomed.
            found = await self._execute(
                sa.select(answer.c.id).where(
                    answer.c.session_id.in_(sorted({row.session_id for row in chunk})),
                    answer.c.role == "tool",
                    _previous(answer, "id").in_([row.id for row in chunk]),
                )
            )
            doomed.update(found.scalars())
        deleted = 0
        for ids in _chunks(sorted(doomed)):
            result = await self._execute(sa.delete(MESSAGES).where(MESSAGES.c.id.in_(ids)))
            deleted += int(result.rowcount)  # type: ignore[attr-defined]
        return deleted


def _chunks(ids: Sequence[uuid.UUID]) -> list[Sequence[uuid.UUID]]:
    return [ids[start : start + _IDS_PER_STATEMENT] for start in range(0, len(ids), _IDS_PER_STATEMENT)]
