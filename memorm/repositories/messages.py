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
`_append_one_claimed` and `_not_stored`).

An id names one message of the tenant, whichever agent holds it: an id
another agent's message has is refused as an id of another session is
(`memorm.repositories.id_claims`; on a distributed database, the ids the
caller chose are locked and looked up on every shard first).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from memorm.conflicts import unique_key_of
from memorm.driver import fetch, insert_rows
from memorm.errors import ConflictError, DatabaseError, NotFoundError
from memorm.link import Link
from memorm.models import MESSAGES, SEARCH_WORDS, SESSIONS, Message, hydrate, hydrate_all
from memorm.repositories.id_claims import chose_id, claim, refuse_held
from memorm.repositories.message_input import MessageInput, check_batch, check_message, count_tokens
from memorm.repositories.message_queries import _COLUMNS, _FIELDS, SEQ_MAX, SEQ_MIN
from memorm.repositories.message_replay import replay
from memorm.repositories.message_retention import MessageRetention
from memorm.tenancy import DEFAULT_TENANT
from memorm.tokens import TokenCounter, estimate_tokens
from memorm.translate import check_writable, guarded
from memorm.types import utcnow
from memorm.types.uuid import UUIDList, in_uuids
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
# The messages' primary key and their unique (tenant, id), less the tenant: an id taken.
_MESSAGE_KEYS = (("messages", ("id", "agent_id")), ("messages", ("id",)))
_ONE_ID = MESSAGES.c.id == sa.bindparam("id", type_=MESSAGES.c.id.type)
_IDS = in_uuids(MESSAGES.c.id, sa.bindparam("ids", type_=UUIDList()))  # any number, one parameter


def _not_stored(ids: sa.ColumnElement[bool]) -> sa.ColumnElement[bool]:
    """No stored message has one of the `ids` (`_ONE_ID`, `_IDS`): a condition of the counter's UPDATE.

    A retried batch is found here, by the statement that would number its
    messages: the counter stays, nothing is written, and `append` reads what
    is stored (the rare path).  No extra round trip: a probe of the unique
    index on `(tenant, id)`, so another agent's message with the same id
    stops the counter too, and `append` then refuses the id.  SQLite's
    planner always takes that index here; Postgres' generic plan for a table
    not yet analyzed may scan the tenant's rows of an index ending in `id`
    instead (until autovacuum's ANALYZE), which is why a single message
    whose id the caller chose goes through `_append_one_claimed` on
    Postgres.  Not on
    a distributed database, which has no such index: there `append` locks
    and looks up the ids first (`memorm.repositories.id_claims`).
    """
    return ~sa.exists().where(MESSAGES.c.tenant == sa.bindparam("of_tenant"), ids)


@cache
def _allocate_checking(*, routed: bool, many: bool) -> sa.Update:
    """`_ALLOCATE` (or routed) that moves the counter only while none of the ids (`id` or `ids`) is stored."""
    statement = _ALLOCATE_ROUTED if routed else _ALLOCATE
    return statement.where(_not_stored(_IDS if many else _ONE_ID))


# The stored messages with one of the `ids`, any agent's: by the unique index on (tenant, id)
# (on a distributed database, a read of every shard).
_STORED_WITH = sa.select(*_FIELDS).where(MESSAGES.c.tenant == sa.bindparam("of_tenant"), _IDS)


def _claimed(batch: Sequence[MessageInput], rows: list[dict[str, Any]]) -> list[uuid.UUID]:
    """The ids the caller chose (`id_claims.chose_id`), which a retry repeats; new ids need no check."""
    return [row["id"] for item, row in zip(batch, rows, strict=True) if chose_id(item)]


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


@cache
def _append_one_claimed(*, routed: bool) -> sa.Select[Any]:
    """`_append_one` for a message whose id the caller chose: a stored one (a retry) is left alone.

    The session row is locked first (`FOR NO KEY UPDATE`, as the counter's
    UPDATE locks it), the INSERT skips a taken id (`ON CONFLICT (tenant, id)
    DO NOTHING`: any agent's), and the counter moves only for a row inserted,
    so a retry writes nothing and `RETURNING` comes back empty (as for no
    session).
    The conflict is found by the primary key itself, as an INSERT always
    checks it: no query plan to go wrong, and a retry waiting on the first
    attempt's lock sees its message once that commits.
    """
    head = sa.select(SESSIONS.c.agent_id, SESSIONS.c.next_seq).where(
        SESSIONS.c.tenant == sa.bindparam("of_tenant"), SESSIONS.c.id == sa.bindparam("session_id")
    )
    if routed:
        head = head.where(SESSIONS.c.agent_id == sa.bindparam("of_agent"))
    locked = head.with_for_update(key_share=True).cte("head")  # key_share: FOR NO KEY UPDATE
    names = [*_COLUMNS, SEARCH_WORDS]
    values = [
        locked.c.agent_id
        if name == "agent_id"
        else locked.c.next_seq
        if name == "seq"
        else sa.bindparam(name, type_=MESSAGES.c[name].type)
        for name in names
    ]
    stored = (
        postgresql.insert(MESSAGES)  # only ever run on Postgres (data-modifying CTEs)
        .from_select(names, sa.select(*values).select_from(locked))
        .on_conflict_do_nothing(index_elements=["tenant", "id"])  # the unique index: one id, one message
        .returning(MESSAGES.c.agent_id, MESSAGES.c.seq)
        .cte("stored")
    )
    counter = (
        sa.update(SESSIONS)
        .where(
            SESSIONS.c.tenant == sa.bindparam("of_tenant"),
            SESSIONS.c.id == sa.bindparam("session_id"),
            SESSIONS.c.agent_id == stored.c.agent_id,
        )
        .values(next_seq=SESSIONS.c.next_seq + 1, updated_at=sa.bindparam("updated_at"))
        .cte("counter")
    )
    return sa.select(stored.c.agent_id, stored.c.seq).add_cte(counter)


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
        claimed = _claimed(batch, rows)
        if claimed and self._distributed:
            return await self._append_distributed(key, batch, rows, claimed)
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

    async def _append_distributed(
        self,
        key: uuid.UUID,
        batch: Sequence[MessageInput],
        rows: list[dict[str, Any]],
        claimed: Sequence[uuid.UUID],
    ) -> list[Message]:
        """`append` of ids the caller chose on a distributed database, which has no unique index on ids.

        The ids are locked (`id_claims.claim`), then looked up on every
        shard: stored, they are a retry or a conflict (`replay`); else no
        other unit of work can store them before this one ends, and the
        batch is appended unchecked, on the agent's shard.
        """
        await self._agent_of(key)  # NotFoundError before any lock is taken
        await claim(self.link, MESSAGES, self._owner, claimed)
        stored = await self._stored(rows)
        if stored:
            replayed = replay(key, batch, rows, stored)
            assert replayed is not None  # some are stored: the batch as stored, or ConflictError
            return replayed
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
        await refuse_held(self.link, MESSAGES, self._owner, _claimed(batch, rows))
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
        taken = await self._take(key, count)
        if taken is None:
            raise NotFoundError(f"no session {key}")
        return taken

    async def _append(
        self,
        key: uuid.UUID,
        batch: Sequence[MessageInput],
        rows: list[dict[str, Any]],
        checked: Sequence[uuid.UUID],
        *,
        claimed: bool,
    ) -> list[Message] | None:
        """Number and store checked rows; None if one of the `checked` ids is stored (nothing written).

        `NotFoundError` when there is no session, unless ids are `checked`
        (None then too).  `claimed`: some ids are the caller's (see `_raced`).
        """
        if len(rows) == 1 and self._one_server_postgres:
            appended = await self._append_one(key, batch[0], rows[0], checked=bool(checked), claimed=claimed)
            return None if appended is None else [appended]
        taken = await self._take(key, len(rows), checked)
        if taken is None:
            if checked:
                return None
            raise NotFoundError(f"no session {key}")
        agent_id, end = taken
        return await self._store(key, agent_id, batch, rows, first_seq=end - len(rows), claimed=claimed)

    async def _take(
        self, key: uuid.UUID, count: int, claimed: Sequence[uuid.UUID] = ()
    ) -> tuple[uuid.UUID, int] | None:
        """`_allocate`, or None if there is no session or one of the `claimed` ids is stored."""
        check_writable(self.link)
        agent = await self._row_agent(key)  # the session's row: by its key
        params: dict[str, Any] = {
            "of_tenant": self._owner,
            "session_id": key,
            "count": count,
            "now": utcnow(),
        }
        if agent is not None:
            params["of_agent"] = agent
        statement: sa.Update = _ALLOCATE if agent is None else _ALLOCATE_ROUTED
        if claimed:
            many = len(claimed) > 1
            statement = _allocate_checking(routed=agent is not None, many=many)
            if many:
                params["ids"] = claimed
            else:
                params["id"] = claimed[0]
        async with guarded(self.link):
            rows = await fetch(self.link, statement, params)
        if not rows:
            return None
        agent_id, end = rows[0]
        self._route(key, agent_id)
        return agent_id, int(end)

    async def _replay(
        self, key: uuid.UUID, batch: Sequence[MessageInput], rows: list[dict[str, Any]]
    ) -> list[Message] | None:
        """The batch as stored, if it is (a retry); None if none of it is; `ConflictError` if it differs.

        `NotFoundError` when there is no session.  Only on the rare path,
        when the counter's UPDATE stopped.
        """
        await self._agent_of(key)
        stored = await self._stored(rows)
        if not stored:
            await self._require_session(key)  # a remembered agent does not prove the session is there
        return replay(key, batch, rows, stored)

    async def _stored(self, rows: list[dict[str, Any]]) -> dict[uuid.UUID, Message]:
        """The stored messages with the `rows`' ids, any agent's (another agent's is a conflict)."""
        params = {"ids": [row["id"] for row in rows], "of_tenant": self._owner}
        async with guarded(self.link):
            found = await fetch(self.link, _STORED_WITH, params)
        return {message.id: message for message in hydrate_all(Message, _COLUMNS, found)}

    async def _append_one(
        self, key: uuid.UUID, item: MessageInput, row: dict[str, Any], *, checked: bool, claimed: bool
    ) -> Message | None:
        """Append one checked message in one statement (`_append_one`, Postgres).

        `checked`: None if the message's id is stored (or there is no
        session), and nothing was written.  `claimed`: the caller chose the id.
        """
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
        statement = (_append_one_claimed if checked else _append_one)(routed=agent is not None)
        try:
            async with guarded(self.link):
                found = await fetch(self.link, statement, params)
        except ConflictError as error:
            _raced(error, claimed=claimed)
            raise
        if not found:
            if checked:
                return None
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
        claimed: bool = False,
    ) -> list[Message]:
        """Number, complete and insert checked rows (token counts filled in); returns `Message` objects.

        `claimed`: some ids are the caller's, checked as the numbers were taken.
        """
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
        try:
            await insert_rows(self.link, MESSAGES, _COLUMNS, rows)
        except ConflictError as error:
            _raced(error, claimed=claimed)
            raise
        return stored


def _raced(error: ConflictError, *, claimed: bool) -> None:
    """Raise `DatabaseError` if the INSERT found a caller's id stored that the counter's check did not.

    Another unit of work stored a message with the same id between the
    check and the INSERT (a retry meeting the first attempt still
    committing, or another agent's append of the id, on Postgres).  This
    unit of work has failed, as any failed statement fails it; run again,
    it finds the stored message (its own: the retry returns it; another
    agent's: `ConflictError`), so the error says to retry rather than that
    the message conflicts.
    """
    if claimed and unique_key_of(error) in _MESSAGE_KEYS:
        raise DatabaseError(
            "a message of this append was stored by another unit of work meanwhile; "
            "this one was rolled back: retry it"
        ) from error
