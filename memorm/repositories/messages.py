"""``uow.messages``: the chat log (recall memory).

A session's messages are ordered by ``seq``.  Appends take numbers from the
session's ``next_seq`` counter (gap-free); :meth:`MessageRepository.prepend`
and :meth:`MessageRepository.replace_system` take numbers below the lowest one,
so no existing row is renumbered.  The *system message* is the session's first
message when its role is ``system``; context windows pin it, trims keep it and
prepends go right after it.

Tool calls travel in blocks: an assistant message with ``tool_calls`` followed
by the ``tool`` messages answering it.  Trims and context windows cut only
between blocks, never inside one.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import date, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql import ColumnElement

from memorm.driver import fetch, insert_rows
from memorm.errors import NotFoundError, ValidationError
from memorm.models import AGENTS, MESSAGES, SESSIONS, Message, hydrate
from memorm.page import Page
from memorm.repositories.base import Repository
from memorm.repositories.message_input import (
    MessageInput,
    as_instant,
    check_batch,
    check_int,
    check_message,
    check_roles,
)
from memorm.search.fts_ddl import MESSAGES_FTS
from memorm.search.text import search_page
from memorm.tokens import TokenCounter, estimate_tokens
from memorm.translate import check_writable, guarded
from memorm.types import utcnow
from memorm.validation import as_uuid, check_limit, check_text

__all__ = ["MessageRepository"]

_COLUMNS = tuple(column.name for column in MESSAGES.columns)
SEQ_MAX = 2**31 - 1  # seq is a 32-bit integer
SEQ_MIN = -(2**31)
_WINDOW_BACK = (  # the newest `limit` messages up to seq `bound`, newest first
    sa.select(*MESSAGES.c)
    .where(MESSAGES.c.session_id == sa.bindparam("session_id"), MESSAGES.c.seq <= sa.bindparam("bound"))
    .order_by(MESSAGES.c.seq.desc())
    .limit(sa.bindparam("limit"))
)
_WINDOW_FORWARD = (  # the oldest `limit` messages from seq `bound` on
    sa.select(*MESSAGES.c)
    .where(MESSAGES.c.session_id == sa.bindparam("session_id"), MESSAGES.c.seq >= sa.bindparam("bound"))
    .order_by(MESSAGES.c.seq)
    .limit(sa.bindparam("limit"))
)
_FIRST_SCAN = 256  # context(): rows whose tokens are summed first (~25k tokens of chat)
_ALLOCATE = (
    sa.update(SESSIONS)
    .where(SESSIONS.c.id == sa.bindparam("session_id"))
    .values(next_seq=SESSIONS.c.next_seq + sa.bindparam("count"), updated_at=sa.bindparam("now"))
    .returning(SESSIONS.c.agent_id, SESSIONS.c.next_seq)
)


class MessageRepository(Repository):
    """Messages of a session, ordered by ``seq``."""

    def __init__(self, session: AsyncSession, *, token_counter: TokenCounter = estimate_tokens) -> None:
        super().__init__(session)
        self.token_counter = token_counter

    # -- writing ------------------------------------------------------------

    async def append(
        self, session_id: uuid.UUID | str, messages: MessageInput | Sequence[MessageInput]
    ) -> list[Message]:
        """Append one message or a batch to the session, atomically.

        Messages are ``Message`` objects or dicts with the same fields; an
        assistant message with ``tool_calls`` and the ``tool`` messages answering
        it can come in one batch.  Sequence numbers come from the database (one
        ``UPDATE … RETURNING`` on the session's counter), so concurrent
        appenders never collide or leave gaps.  ``token_count`` is kept when
        given, else estimated by the database's token counter.

        Returns the stored messages in order; ``Message`` inputs are those same
        objects, filled in (``seq``, ``session_id``, ``agent_id``, timestamps).
        """
        key = as_uuid(session_id, "session_id")
        batch, rows = check_batch(messages)
        if not rows:
            await self._lock_session(key)
            return []
        agent_id, end = await self._allocate(key, len(rows))
        return await self._store(key, agent_id, batch, rows, first_seq=end - len(rows))

    async def prepend(
        self, session_id: uuid.UUID | str, messages: MessageInput | Sequence[MessageInput]
    ) -> list[Message]:
        """Insert messages right after the system message (or first, if there is none).

        For a summary of trimmed history, say.  The new messages take sequence
        numbers below the current ones (the system message moves down one
        block), so no other row is rewritten.
        """
        key = as_uuid(session_id, "session_id")
        batch, rows = check_batch(messages)
        agent_id, _ = await self._lock_session(key)
        if not rows:
            return []
        head = await self._head(key)
        if head is None:
            agent_id, end = await self._allocate(key, len(rows))
            return await self._store(key, agent_id, batch, rows, first_seq=end - len(rows))
        head_seq, head_role = head
        if head_role == "system":
            # The system message moves below the new block: one row updated.
            new_system_seq = head_seq - len(rows)
            await self._execute(
                sa.update(MESSAGES)
                .where(MESSAGES.c.session_id == key, MESSAGES.c.seq == head_seq)
                .values(seq=new_system_seq)
            )
            first = new_system_seq + 1
        else:
            first = head_seq - len(rows)
        return await self._store(key, agent_id, batch, rows, first_seq=first)

    async def replace_system(self, session_id: uuid.UUID | str, content: str) -> Message:
        """Swap the system message's content, or create the system message if there is none."""
        key = as_uuid(session_id, "session_id")
        row = check_message({"role": "system", "content": content}, 0)
        row["content"] = check_text(content, "content")
        agent_id, _ = await self._lock_session(key)
        head = await self._head(key)
        if head is not None and head[1] == "system":
            now = utcnow()
            tokens = self.token_counter(row)
            await self._execute(
                sa.update(MESSAGES)
                .where(MESSAGES.c.session_id == key, MESSAGES.c.seq == head[0])
                .values(content=row["content"], token_count=tokens, updated_at=now)
            )
            return (await self._select(MESSAGES.c.session_id == key, MESSAGES.c.seq == head[0]))[0]
        if head is None:
            agent_id, end = await self._allocate(key, 1)
            first = end - 1
        else:
            first = head[0] - 1
        return (await self._store(key, agent_id, [row], [row], first_seq=first))[0]

    async def trim(self, session_id: uuid.UUID | str, *, keep_last: int) -> int:
        """Delete the oldest messages, keeping the system message and the newest ``keep_last``.

        The cut never falls inside a tool-call block: when the oldest kept
        message would be a ``tool`` answer, the cut moves forward past the
        block's answers, so at most ``keep_last`` messages remain besides the
        system message.  Returns how many messages were deleted.
        """
        key = as_uuid(session_id, "session_id")
        keep = check_int(keep_last, "keep_last", minimum=0)
        await self._lock_session(key)
        head = await self._head(key)
        system_seq = head[0] if head is not None and head[1] == "system" else None
        body = [MESSAGES.c.session_id == key]
        if system_seq is not None:
            body.append(MESSAGES.c.seq != system_seq)
        if keep == 0:
            cut = None  # everything but the system message goes
        else:
            cut = await self._scalar(
                sa.select(MESSAGES.c.seq)
                .where(*body)
                .order_by(MESSAGES.c.seq.desc())
                .offset(keep - 1)
                .limit(1)
            )
            if cut is None:
                return 0  # fewer than keep_last messages
            # Move the cut past tool answers whose call would be deleted.
            cut = await self._scalar(
                sa.select(sa.func.min(MESSAGES.c.seq)).where(
                    *body, MESSAGES.c.seq >= cut, MESSAGES.c.role != "tool"
                )
            )
        doomed = sa.delete(MESSAGES).where(*body)
        if cut is not None:
            doomed = doomed.where(MESSAGES.c.seq < cut)
        result = await self._execute(doomed)
        return int(result.rowcount)  # type: ignore[attr-defined]

    async def delete(self, message_id: uuid.UUID | str) -> None:
        """Delete one message."""
        key = as_uuid(message_id, "message_id")
        result = await self._execute(sa.delete(MESSAGES).where(MESSAGES.c.id == key))
        if result.rowcount == 0:  # type: ignore[attr-defined]
            raise NotFoundError(f"no message {key}")

    async def delete_after(self, session_id: uuid.UUID | str, seq: int) -> int:
        """Delete every message after ``seq`` (rewinding a crashed step); returns how many.

        The session's counter rewinds too, so the next append continues at ``seq + 1``.
        """
        key = as_uuid(session_id, "session_id")
        after = check_int(seq, "seq")
        await self._lock_session(key)
        result = await self._execute(
            sa.delete(MESSAGES).where(MESSAGES.c.session_id == key, MESSAGES.c.seq > after)
        )
        await self._execute(
            sa.update(SESSIONS)
            .where(SESSIONS.c.id == key, SESSIONS.c.next_seq > after + 1)
            .values(next_seq=after + 1)
        )
        return int(result.rowcount)  # type: ignore[attr-defined]

    async def clear(self, session_id: uuid.UUID | str) -> int:
        """Delete every message of the session, the system message too; returns how many.

        The session's numbering starts again at 1.
        """
        key = as_uuid(session_id, "session_id")
        await self._lock_session(key)
        result = await self._execute(sa.delete(MESSAGES).where(MESSAGES.c.session_id == key))
        await self._execute(sa.update(SESSIONS).where(SESSIONS.c.id == key).values(next_seq=1))
        return int(result.rowcount)  # type: ignore[attr-defined]

    async def pop(self, session_id: uuid.UUID | str) -> Message | None:
        """Delete and return the session's newest message (None when it has none).

        The session stays locked until the unit of work ends, so concurrent pops
        never return the same message; the next append reuses its number.
        """
        key = as_uuid(session_id, "session_id")
        await self._lock_session(key)
        newest = await self._select(MESSAGES.c.session_id == key, order=MESSAGES.c.seq.desc(), limit=1)
        if not newest:
            return None
        await self.delete_after(key, newest[0].seq - 1)
        return newest[0]

    # -- reading ------------------------------------------------------------

    async def get(self, message_id: uuid.UUID | str) -> Message:
        """The message with this id; ``NotFoundError`` if there is none."""
        key = as_uuid(message_id, "message_id")
        found = await self._select(MESSAGES.c.id == key)
        if not found:
            raise NotFoundError(f"no message {key}")
        return found[0]

    async def window(
        self,
        session_id: uuid.UUID | str,
        *,
        limit: int = 50,
        before_seq: int | None = None,
        after_seq: int | None = None,
        roles: Iterable[str] | None = None,
    ) -> list[Message]:
        """Up to ``limit`` messages, oldest first.

        With neither cursor: the newest ``limit``.  ``before_seq``: the last
        ``limit`` before it (paging back).  ``after_seq``: the first ``limit``
        after it (paging forward).  ``roles`` keeps only those roles.
        """
        key = as_uuid(session_id, "session_id")
        check_limit(limit)
        wanted = check_roles(roles)
        if before_seq is not None and after_seq is not None:
            raise ValidationError("window: give before_seq or after_seq, not both")
        forward = after_seq is not None
        if forward:
            bound = check_int(after_seq, "after_seq") + 1
        else:
            bound = SEQ_MAX if before_seq is None else check_int(before_seq, "before_seq") - 1
        if wanted is None:  # the hot path: a precompiled statement, straight to the driver
            statement = _WINDOW_FORWARD if forward else _WINDOW_BACK
            async with guarded(self.session):
                found = await fetch(
                    self.session, statement, {"session_id": key, "bound": bound, "limit": limit}
                )
            rows = [hydrate(Message, dict(zip(_COLUMNS, row, strict=True))) for row in found]
        else:
            where = [MESSAGES.c.session_id == key, MESSAGES.c.role.in_(wanted)]
            if forward:
                rows = await self._select(*where, MESSAGES.c.seq >= bound, order=MESSAGES.c.seq, limit=limit)
            else:
                rows = await self._select(
                    *where, MESSAGES.c.seq <= bound, order=MESSAGES.c.seq.desc(), limit=limit
                )
        if not forward:
            rows.reverse()
        if not rows:
            await self._require_session(key)
        return rows

    async def context(
        self, session_id: uuid.UUID | str, *, max_tokens: int, pinned_system: bool = True
    ) -> list[Message]:
        """The messages to send a model: the system message plus the newest that fit ``max_tokens``.

        Chronological.  The system message's tokens count against the budget
        (with ``pinned_system=False`` it is an ordinary message).  The window
        never starts with a ``tool`` answer whose call was cut off.  The cut is
        found in SQL (a running sum of ``token_count``); only the kept rows are read.
        """
        key = as_uuid(session_id, "session_id")
        budget = check_int(max_tokens, "max_tokens", minimum=1)
        system: Message | None = None
        where: list[ColumnElement[bool]] = [MESSAGES.c.session_id == key]
        head = await self._fetch_window(key, forward=True, bound=SEQ_MIN, limit=1)
        if not head:
            await self._require_session(key)
            return []
        if pinned_system and head[0].role == "system":
            system = head[0]
            budget -= system.token_count or 0
            where.append(MESSAGES.c.seq > system.seq)
        if budget <= 0:
            return [system] if system is not None else []
        span = await self._budget_span(where, budget)
        if span is None:
            return [system] if system is not None else []
        first, last, rows = span
        # Bounded on both sides: rows appended meanwhile must not stretch the budget.
        fetched = await self._fetch_window(key, forward=True, bound=first, limit=rows)
        body = [message for message in fetched if message.seq <= last]
        while body and body[0].role == "tool":  # an answer whose call did not fit
            body.pop(0)
        return [system, *body] if system is not None else body

    async def _fetch_window(self, key: uuid.UUID, *, forward: bool, bound: int, limit: int) -> list[Message]:
        """Messages from ``bound`` on (``forward``) or up to it, ``limit`` of them, in scan order."""
        statement = _WINDOW_FORWARD if forward else _WINDOW_BACK
        async with guarded(self.session):
            found = await fetch(self.session, statement, {"session_id": key, "bound": bound, "limit": limit})
        return [hydrate(Message, dict(zip(_COLUMNS, row, strict=True))) for row in found]

    async def _budget_span(
        self, where: list[ColumnElement[bool]], budget: int
    ) -> tuple[int, int, int] | None:
        """``(first seq, last seq, rows)`` of the newest messages that fit in ``budget`` tokens, if any.

        The running total is a window function over the newest rows, so one
        row crosses the wire, whatever the history's length.  The scan starts
        with the newest :data:`_FIRST_SCAN` rows and doubles while every row it
        read still fitted.
        """
        tokens = sa.func.coalesce(MESSAGES.c.token_count, sa.func.length(MESSAGES.c.content) / 4 + 4)
        cap = min(budget + 1, _FIRST_SCAN)
        while True:
            newest = (
                sa.select(MESSAGES.c.seq.label("seq"), tokens.label("tokens"))
                .where(*where)
                .order_by(MESSAGES.c.seq.desc())
                .limit(cap)
                .subquery()
            )
            running = sa.select(
                newest.c.seq,
                sa.func.sum(newest.c.tokens).over(order_by=newest.c.seq.desc()).label("running"),
            ).subquery()
            fitted = (
                await self._execute(
                    sa.select(sa.func.min(running.c.seq), sa.func.max(running.c.seq), sa.func.count()).where(
                        running.c.running <= budget
                    )
                )
            ).one()
            first, last, fitting = tuple(fitted)
            if fitting < cap:  # the budget ran out (or the history did) inside the cap
                return None if fitting == 0 else (int(first), int(last), int(fitting))
            cap *= 2

    async def count(self, session_id: uuid.UUID | str, *, roles: Iterable[str] | None = None) -> int:
        """How many messages the session holds (of these roles, if given)."""
        key = as_uuid(session_id, "session_id")
        wanted = check_roles(roles)
        query = sa.select(sa.func.count()).where(MESSAGES.c.session_id == key)
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

        Ordered by relevance, then newest first, then id; ``total`` counts every
        match.  Any string is safe: FTS operators and SQL are searched as words.
        """
        text = check_text(query, "query") or ""
        where = await self._scope(agent_id, session_id, roles)
        return await search_page(
            self.session, MESSAGES_FTS, text, entity=Message, where=where, limit=limit, offset=offset
        )

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
        """The agent's messages created from ``start`` to ``end``, chronological.

        Datetimes are inclusive bounds; a date ``end`` includes that whole day (UTC).
        """
        lower, _ = as_instant(start, "start", end=False)
        upper, inclusive = as_instant(end, "end", end=True)
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
        wanted = check_roles(roles)
        where: list[ColumnElement[bool]] = [MESSAGES.c.agent_id == agent]
        if session_id is not None:
            chat = as_uuid(session_id, "session_id")
            owner = await self._scalar(sa.select(SESSIONS.c.agent_id).where(SESSIONS.c.id == chat))
            if owner != agent:
                raise NotFoundError(f"no session {chat} for agent {agent}")
            where.append(MESSAGES.c.session_id == chat)
        elif await self._scalar(sa.select(AGENTS.c.id).where(AGENTS.c.id == agent)) is None:
            raise NotFoundError(f"no agent {agent}")
        if wanted is not None:
            where.append(MESSAGES.c.role.in_(wanted))
        return where

    async def _select(
        self, *where: ColumnElement[bool], order: Any = None, limit: int | None = None
    ) -> list[Message]:
        """Messages matching ``where``, read with Core and built with :func:`hydrate`.

        Several times cheaper per row than an ORM query, and never stale: the
        identity map is bypassed (Core UPDATEs, such as prepend moving the
        system message, would otherwise leave it holding old values).
        """
        query = sa.select(*MESSAGES.c).where(*where)
        if order is not None:
            query = query.order_by(order)
        if limit is not None:
            query = query.limit(limit)
        result = await self._execute(query)
        return [hydrate(Message, dict(zip(_COLUMNS, row, strict=True))) for row in result]

    async def _allocate(self, key: uuid.UUID, count: int) -> tuple[uuid.UUID, int]:
        """Take ``count`` numbers from the session's counter; returns (agent_id, new next_seq).

        The UPDATE locks the session row (Postgres) until the unit of work ends,
        so concurrent appenders queue here and their numbers never interleave.
        """
        check_writable(self.session)
        async with guarded(self.session):
            rows = await fetch(self.session, _ALLOCATE, {"session_id": key, "count": count, "now": utcnow()})
        if not rows:
            raise NotFoundError(f"no session {key}")
        agent_id, end = rows[0]
        return agent_id, int(end)

    async def _lock_session(self, key: uuid.UUID) -> tuple[uuid.UUID, int]:
        """Lock the session row (as appends do) for a multi-statement edit."""
        return await self._allocate(key, 0)

    async def _head(self, key: uuid.UUID) -> tuple[int, str] | None:
        """``(seq, role)`` of the session's first message."""
        row = (
            await self._execute(
                sa.select(MESSAGES.c.seq, MESSAGES.c.role)
                .where(MESSAGES.c.session_id == key)
                .order_by(MESSAGES.c.seq)
                .limit(1)
            )
        ).first()
        if row is None:
            return None
        seq, role = tuple(row)
        return seq, role

    async def _store(
        self,
        key: uuid.UUID,
        agent_id: uuid.UUID,
        batch: Sequence[MessageInput],
        rows: list[dict[str, Any]],
        *,
        first_seq: int,
    ) -> list[Message]:
        """Number, complete and insert checked rows; returns them as ``Message`` objects."""
        now = utcnow()
        stored: list[Message] = []
        for seq, (item, row) in enumerate(zip(batch, rows, strict=True), start=first_seq):
            row.update(session_id=key, agent_id=agent_id, seq=seq, updated_at=now)
            if row["created_at"] is None:
                row["created_at"] = now
            if row["token_count"] is None:
                row["token_count"] = self.token_counter(row)
            if isinstance(item, Message):
                item.__dict__.update(row)  # transient object: plain writes are enough
                stored.append(item)
            else:
                stored.append(hydrate(Message, row))
        await insert_rows(self.session, MESSAGES, _COLUMNS, [[row[c] for c in _COLUMNS] for row in rows])
        return stored

    async def _require_session(self, key: uuid.UUID) -> None:
        if await self._scalar(sa.select(SESSIONS.c.id).where(SESSIONS.c.id == key)) is None:
            raise NotFoundError(f"no session {key}")
