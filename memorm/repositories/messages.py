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

An append is safe to retry with the same message ids (`memorm.repositories.message_replay`):
the statement that numbers it takes no number when an id the caller chose
is stored, so a retry of a committed append writes nothing and returns
what is stored, and a first append makes no read of its own (see
`_append_one_claimed` and `_not_stored` in `memorm.repositories.message_append_sql`).

An id names one message of the tenant, whichever agent holds it: an id
another agent's message has is refused as an id of another session is
(`memorm.repositories.id_claims`; on a distributed database, the ids the
caller chose are locked and looked up on every shard first).

This module holds the edits (prepends, trims, deletes); the repository's
other parts are its siblings: `message_append` (numbering and storing),
`message_windows` (windows, context), `message_queries` (other reads) and
`message_retention` (deletion by age).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import sqlalchemy as sa

from memorm.errors import NotFoundError
from memorm.link import Link
from memorm.models import MESSAGES, SESSIONS, Message
from memorm.repositories.id_claims import refuse_held
from memorm.repositories.message_append import MessageAppends, chosen_ids
from memorm.repositories.message_append_sql import claims_ids_first
from memorm.repositories.message_input import MessageInput, check_batch, check_message, count_tokens
from memorm.repositories.message_queries import SEQ_MAX, SEQ_MIN
from memorm.repositories.message_retention import MessageRetention
from memorm.repositories.message_windows import MessageWindows
from memorm.tenancy import DEFAULT_TENANT
from memorm.tokens import TokenCounter, estimate_tokens
from memorm.types import utcnow
from memorm.validation import INT64_MAX, INT64_MIN, MAX_COUNT, as_uuid, check_int, check_text

__all__ = ["MessageRepository"]


class MessageRepository(MessageAppends, MessageWindows, MessageRetention):
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

        **Retries.** An append whose commit acknowledgement was lost may have
        been committed; run again with the same message ids (give each
        message its `id`, or pass the same `Message` objects), it stores
        nothing and returns the stored messages, with their stored `seq` and
        timestamps, when the whole batch is stored as sent (what "the same"
        means: `memorm.repositories.message_replay`).  An id stored with
        other content, in another session (another agent's too: an id names
        one message of the tenant), or a batch only partly stored raises
        `ConflictError` before anything is written; the unit of work can go
        on.  A retry that meets its first attempt still committing waits for
        it and finds its messages, except a batch on Postgres, which may
        fail with `DatabaseError` (its unit of work rolled back) and, retried
        again, finds them; so may two agents' appends of one id at once,
        the second then refused.  See docs/reliability.md.
        """
        key = as_uuid(session_id, "session_id")
        batch, rows = check_batch(messages)
        count_tokens(self.token_counter, rows)  # the counter's answers are checked too, before any write
        if not rows:
            await self._lock_session(key)
            return []
        claimed = chosen_ids(batch, rows)
        if claimed and claims_ids_first(self.link):
            return await self._append_claiming_ids(key, batch, rows, claimed)
        appended = await self._append(key, batch, rows, claimed, claimed=bool(claimed))
        if appended is not None:
            return appended
        # Nothing written: an id the caller chose is stored (a retry, or a conflict), or no session.
        stored = await self._replay(key, batch, rows)
        if stored is not None:
            return stored
        # The stored message was deleted meanwhile: the INSERT's own key check is enough now.
        appended = await self._append(key, batch, rows, (), claimed=True)
        assert appended is not None  # unchecked: the session is there, or NotFoundError
        return appended

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
        # An id the caller chose that a message of the tenant has: refused before any write.
        await refuse_held(self.link, MESSAGES, self._required_tenant, chosen_ids(batch, rows))
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
                .where(*await self._session_messages(key), MESSAGES.c.seq == head_seq)
                .values(seq=new_system_seq)
            )
            first = new_system_seq + 1
        else:
            first = head_seq - len(rows)
        return await self._store(key, agent_id, batch, rows, first_seq=first)

    async def replace_system(self, session_id: uuid.UUID | str, content: str) -> Message:
        """Swap the system message's content, or create the system message if there is none.

        How an agent's `system` prompt becomes a session's system message
        (memorm never copies it):

        Example:
            ```python
            await uow.messages.replace_system(chat.id, agent.system)
            ```
        """
        key = as_uuid(session_id, "session_id")
        row = check_message({"role": "system", "content": check_text(content, "content")}, 0)
        count_tokens(self.token_counter, [row])
        agent_id, _ = await self._lock_session(key)
        head = await self._head(key)
        if head is not None and head[1] == "system":
            await self._execute(
                sa.update(MESSAGES)
                .where(*await self._session_messages(key), MESSAGES.c.seq == head[0])
                .values(content=row["content"], token_count=row["token_count"], updated_at=utcnow())
                .values(search_words=row["content"])  # the derived words follow the text
            )
            return (await self._select(*await self._session_messages(key), MESSAGES.c.seq == head[0]))[0]
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
        body = await self._session_messages(key)
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
        if (
            await self._rowcount(
                sa.delete(MESSAGES).where(MESSAGES.c.id == key, *self._tenant_filter(MESSAGES))
            )
            == 0
        ):
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
            sa.delete(MESSAGES).where(*await self._session_messages(key), MESSAGES.c.seq >= first)
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
        deleted = await self._rowcount(sa.delete(MESSAGES).where(*await self._session_messages(key)))
        await self._execute(sa.update(SESSIONS).where(*await self._session_row(key)).values(next_seq=1))
        return deleted

    async def pop(self, session_id: uuid.UUID | str) -> Message | None:
        """Delete and return the session's newest message (None when it has none).

        The session stays locked until the unit of work ends, so concurrent pops
        never return the same message; the next append reuses its number.
        """
        key = as_uuid(session_id, "session_id")
        await self._lock_session(key)
        newest = await self._select(*await self._session_messages(key), order=MESSAGES.c.seq.desc(), limit=1)
        if not newest:
            return None
        await self.delete_after(key, newest[0].seq - 1)
        return newest[0]

    # -- helpers ------------------------------------------------------------

    async def _head(self, key: uuid.UUID) -> tuple[int, str] | None:
        """`(seq, role)` of the session's first message."""
        row = (
            await self._execute(
                sa.select(MESSAGES.c.seq, MESSAGES.c.role)
                .where(*await self._session_messages(key))
                .order_by(MESSAGES.c.seq)
                .limit(1)
            )
        ).first()
        if row is None:
            return None
        seq, role = tuple(row)
        return seq, role
