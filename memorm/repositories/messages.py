"""`uow.messages`: the chat log (recall memory).

A session's messages are ordered by `seq`.  Appends take numbers from the
session's `next_seq` counter (gap-free);
[`MessageRepository.prepend`][memorm.repositories.MessageRepository.prepend] and
[`MessageRepository.replace_system`][memorm.repositories.MessageRepository.replace_system]
take numbers below the lowest one, so no existing row is renumbered.  The
*system message* is the session's first message when its role is `system`;
context windows pin it, trims keep it and prepends go right after it.

Tool calls travel in blocks: an assistant message with `tool_calls` followed
by the `tool` messages answering it.  Trims and context windows cut only
between blocks, never inside one.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from functools import cache
from typing import Any

import sqlalchemy as sa

from memorm.driver import fetch, insert_rows
from memorm.errors import NotFoundError
from memorm.link import Link
from memorm.models import MESSAGES, SEARCH_WORDS, SESSIONS, Message, hydrate
from memorm.repositories.message_input import MessageInput, check_batch, check_message, count_tokens
from memorm.repositories.message_queries import _COLUMNS, SEQ_MAX, SEQ_MIN
from memorm.repositories.message_retention import MessageRetention
from memorm.tenancy import DEFAULT_TENANT
from memorm.tokens import TokenCounter, estimate_tokens
from memorm.translate import check_writable, guarded
from memorm.types import utcnow
from memorm.validation import INT64_MAX, INT64_MIN, MAX_COUNT, as_uuid, check_int, check_text

__all__ = ["MessageRepository"]

_ALLOCATE = (
    sa.update(SESSIONS)
    .where(SESSIONS.c.tenant == sa.bindparam("of_tenant"), SESSIONS.c.id == sa.bindparam("session_id"))
    .values(next_seq=SESSIONS.c.next_seq + sa.bindparam("count"), updated_at=sa.bindparam("now"))
    .returning(SESSIONS.c.agent_id, SESSIONS.c.next_seq)
)
_ALLOCATE_ROUTED = _ALLOCATE.where(SESSIONS.c.agent_id == sa.bindparam("of_agent"))  # the agent known
_FROM_COUNTER = ("agent_id", "seq")  # a folded append's columns that come from the session's counter


@cache
def _append_one(*, routed: bool) -> sa.Insert:
    """One message appended in one statement (Postgres): the counter's UPDATE feeds the INSERT.

    `INSERT … SELECT` from a data-modifying CTE: the session's `next_seq`
    moves and the message takes the number, in one round trip instead of
    two.  No session, no row: `RETURNING` comes back empty.
    """
    counter = sa.update(SESSIONS).where(
        SESSIONS.c.tenant == sa.bindparam("of_tenant"), SESSIONS.c.id == sa.bindparam("session_id")
    )
    if routed:
        counter = counter.where(SESSIONS.c.agent_id == sa.bindparam("of_agent"))
    taken = (
        counter.values(next_seq=SESSIONS.c.next_seq + 1, updated_at=sa.bindparam("updated_at"))
        .returning(SESSIONS.c.agent_id, SESSIONS.c.next_seq)
        .cte("taken")
    )
    names = [*_COLUMNS, SEARCH_WORDS]
    values = [
        taken.c.agent_id
        if name == "agent_id"
        else taken.c.next_seq - 1
        if name == "seq"
        else sa.bindparam(name, type_=MESSAGES.c[name].type)
        for name in names
    ]
    return (
        sa.insert(MESSAGES)
        .from_select(names, sa.select(*values).select_from(taken))
        .returning(MESSAGES.c.agent_id, MESSAGES.c.seq)
    )


class MessageRepository(MessageRetention):
    """Messages of a session, ordered by `seq`."""

    def __init__(
        self,
        link: Link,
        tenant: str | None = DEFAULT_TENANT,
        *,
        token_counter: TokenCounter = estimate_tokens,
    ) -> None:
        super().__init__(link, tenant)
        self.token_counter = token_counter

    # -- writing ------------------------------------------------------------

    async def append(
        self, session_id: uuid.UUID | str, messages: MessageInput | Sequence[MessageInput]
    ) -> list[Message]:
        """Append one message or a batch to the session, atomically.

        Messages are `Message` objects or dicts with the same fields; an
        assistant message with `tool_calls` and the `tool` messages answering
        it can come in one batch.  Sequence numbers come from the database (one
        `UPDATE … RETURNING` on the session's counter), so concurrent
        appenders never collide or leave gaps.  `token_count` is kept when
        given, else estimated by the database's token counter.

        Returns the stored messages in order; `Message` inputs are those same
        objects, filled in (`seq`, `session_id`, `agent_id`, timestamps).
        """
        key = as_uuid(session_id, "session_id")
        batch, rows = check_batch(messages)
        count_tokens(self.token_counter, rows)  # the counter's answers are checked too, before any write
        if not rows:
            await self._lock_session(key)
            return []
        if len(rows) == 1 and self._one_server_postgres:
            return [await self._append_one(key, batch[0], rows[0])]
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
        count_tokens(self.token_counter, rows)
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
                .where(*await self._chat(key), MESSAGES.c.seq == head_seq)
                .values(seq=new_system_seq)
            )
            first = new_system_seq + 1
        else:
            first = head_seq - len(rows)
        return await self._store(key, agent_id, batch, rows, first_seq=first)

    async def replace_system(self, session_id: uuid.UUID | str, content: str) -> Message:
        """Swap the system message's content, or create the system message if there is none."""
        key = as_uuid(session_id, "session_id")
        row = check_message({"role": "system", "content": check_text(content, "content")}, 0)
        count_tokens(self.token_counter, [row])
        agent_id, _ = await self._lock_session(key)
        head = await self._head(key)
        if head is not None and head[1] == "system":
            await self._execute(
                sa.update(MESSAGES)
                .where(*await self._chat(key), MESSAGES.c.seq == head[0])
                .values(content=row["content"], token_count=row["token_count"], updated_at=utcnow())
                .values(search_words=row["content"])  # the derived words follow the text
            )
            return (await self._select(*await self._chat(key), MESSAGES.c.seq == head[0]))[0]
        if head is None:
            agent_id, end = await self._allocate(key, 1)
            first = end - 1
        else:
            first = head[0] - 1
        return (await self._store(key, agent_id, [row], [row], first_seq=first))[0]

    async def trim(self, session_id: uuid.UUID | str, *, keep_last: int) -> int:
        """Delete the oldest messages, keeping the system message and the newest `keep_last`.

        The cut never falls inside a tool-call block: when the oldest kept
        message would be a `tool` answer, the cut moves forward past the
        block's answers, so at most `keep_last` messages remain besides the
        system message.  Returns how many messages were deleted.
        """
        key = as_uuid(session_id, "session_id")
        keep = check_int(keep_last, "keep_last", minimum=0, maximum=MAX_COUNT)
        await self._lock_session(key)
        head = await self._head(key)
        system_seq = head[0] if head is not None and head[1] == "system" else None
        body = await self._chat(key)
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
        return await self._rowcount(doomed)

    async def delete(self, message_id: uuid.UUID | str) -> None:
        """Delete one message."""
        key = as_uuid(message_id, "message_id")
        if await self._rowcount(sa.delete(MESSAGES).where(MESSAGES.c.id == key, *self._own(MESSAGES))) == 0:
            raise NotFoundError(f"no message {key}")

    async def delete_after(self, session_id: uuid.UUID | str, seq: int) -> int:
        """Delete every message after `seq` (rewinding a crashed step); returns how many.

        The session's counter rewinds too, so the next append continues at
        `seq + 1`.  `seq` is any 64-bit integer; seqs are 32-bit, so one
        below them all deletes everything (numbering restarts at the lowest
        seq) and one at or above the highest deletes nothing.
        """
        key = as_uuid(session_id, "session_id")
        # The first seq to delete, clamped to the seqs that can exist (a bound
        # past 32 bits would fail on Postgres and match differently on SQLite).
        first = max(check_int(seq, "seq", minimum=INT64_MIN, maximum=INT64_MAX) + 1, SEQ_MIN)
        await self._lock_session(key)
        if first > SEQ_MAX:
            return 0
        deleted = await self._rowcount(
            sa.delete(MESSAGES).where(*await self._chat(key), MESSAGES.c.seq >= first)
        )
        await self._execute(
            sa.update(SESSIONS)
            .where(*await self._session_row(key), SESSIONS.c.next_seq > first)
            .values(next_seq=first)
        )
        return deleted

    async def clear(self, session_id: uuid.UUID | str) -> int:
        """Delete every message of the session, the system message too; returns how many.

        The session's numbering starts again at 1.
        """
        key = as_uuid(session_id, "session_id")
        await self._lock_session(key)
        deleted = await self._rowcount(sa.delete(MESSAGES).where(*await self._chat(key)))
        await self._execute(sa.update(SESSIONS).where(*await self._session_row(key)).values(next_seq=1))
        return deleted

    async def pop(self, session_id: uuid.UUID | str) -> Message | None:
        """Delete and return the session's newest message (None when it has none).

        The session stays locked until the unit of work ends, so concurrent pops
        never return the same message; the next append reuses its number.
        """
        key = as_uuid(session_id, "session_id")
        await self._lock_session(key)
        newest = await self._select(*await self._chat(key), order=MESSAGES.c.seq.desc(), limit=1)
        if not newest:
            return None
        await self.delete_after(key, newest[0].seq - 1)
        return newest[0]

    # -- helpers ------------------------------------------------------------

    async def _allocate(self, key: uuid.UUID, count: int) -> tuple[uuid.UUID, int]:
        """Take `count` numbers from the session's counter; returns (agent_id, new next_seq).

        The UPDATE locks the session row (Postgres) until the unit of work ends,
        so concurrent appenders queue here and their numbers never interleave.
        """
        check_writable(self.link)
        agent = await self._row_agent(key)  # the session's row: by its key
        async with guarded(self.link):
            params = {"of_tenant": self._owner, "session_id": key, "count": count, "now": utcnow()}
            if agent is None:
                rows = await fetch(self.link, _ALLOCATE, params)
            else:
                rows = await fetch(self.link, _ALLOCATE_ROUTED, {**params, "of_agent": agent})
        if not rows:
            raise NotFoundError(f"no session {key}")
        agent_id, end = rows[0]
        self._route(key, agent_id)
        return agent_id, int(end)

    async def _append_one(self, key: uuid.UUID, item: MessageInput, row: dict[str, Any]) -> Message:
        """Append one checked message in one statement (`_append_one`, Postgres)."""
        check_writable(self.link)
        agent = await self._row_agent(key)  # the session's row: by its key
        now = utcnow()
        row.update(tenant=self._owner, session_id=key, updated_at=now)
        if row["created_at"] is None:
            row["created_at"] = now
        params = {name: row[name] for name in _COLUMNS if name not in _FROM_COUNTER}
        params.update(of_tenant=self._owner, search_words=row["content"] or "")
        if agent is not None:
            params["of_agent"] = agent
        async with guarded(self.link):
            found = await fetch(self.link, _append_one(routed=agent is not None), params)
        if not found:
            raise NotFoundError(f"no session {key}")
        row["agent_id"], row["seq"] = found[0]
        self._route(key, row["agent_id"])
        if isinstance(item, Message):
            item.__dict__.update(row)  # transient object: plain writes are enough
            return item
        return hydrate(Message, row)

    async def _lock_session(self, key: uuid.UUID) -> tuple[uuid.UUID, int]:
        """Lock the session row (as appends do) for a multi-statement edit."""
        return await self._allocate(key, 0)

    async def _head(self, key: uuid.UUID) -> tuple[int, str] | None:
        """`(seq, role)` of the session's first message."""
        row = (
            await self._execute(
                sa.select(MESSAGES.c.seq, MESSAGES.c.role)
                .where(*await self._chat(key))
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
        """Number, complete and insert checked rows (token counts filled in); returns `Message` objects."""
        now = utcnow()
        shared = {"tenant": self._owner, "session_id": key, "agent_id": agent_id, "updated_at": now}
        stored: list[Message] = []
        for seq, (item, row) in enumerate(zip(batch, rows, strict=True), start=first_seq):
            row.update(shared)
            row["seq"] = seq
            if row["created_at"] is None:
                row["created_at"] = now
            if isinstance(item, Message):
                item.__dict__.update(row)  # transient object: plain writes are enough
                stored.append(item)
            else:
                stored.append(hydrate(Message, row))
        await insert_rows(self.link, MESSAGES, _COLUMNS, rows)
        return stored
