"""Numbering and storing messages: the session's counter, then the rows (`uow.messages.append`'s path).

Numbers come from the session's `next_seq` counter: one `UPDATE … RETURNING`
that also locks the session row, so concurrent appenders queue and their
numbers never interleave.  The statements, and which of them this engine
runs, are `memorm.repositories.message_append_sql`'s; an append whose
statement wrote nothing (a retry, an id taken, no session) is settled on
the rare path here (`memorm.repositories.message_replay`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from memorm.conflicts import unique_key_of
from memorm.driver import fetch, insert_rows
from memorm.errors import ConflictError, DatabaseError, NotFoundError
from memorm.models import MESSAGES, Message, hydrate, hydrate_all
from memorm.repositories.id_claims import chose_id, claim
from memorm.repositories.message_append_sql import (
    ALLOCATE,
    ALLOCATE_ROUTED,
    FROM_COUNTER,
    STORED_WITH,
    allocate_checking,
    append_one,
)
from memorm.repositories.message_input import MessageInput
from memorm.repositories.message_queries import _COLUMNS, MessageQueries
from memorm.repositories.message_replay import replay
from memorm.repositories.session_locks import writes_in_one_statement
from memorm.translate import check_writable, guarded
from memorm.types import utcnow

__all__ = ["MessageAppends", "chosen_ids"]

# The messages' primary key and their unique (tenant, id), less the tenant: an id taken.
_MESSAGE_KEYS = (("messages", ("id", "agent_id")), ("messages", ("id",)))


def chosen_ids(batch: Sequence[MessageInput], rows: list[dict[str, Any]]) -> list[uuid.UUID]:
    """The ids the caller chose (`id_claims.chose_id`), which a retry repeats; new ids need no check."""
    return [row["id"] for item, row in zip(batch, rows, strict=True) if chose_id(item)]


class MessageAppends(MessageQueries):
    """How [`MessageRepository`][memorm.repositories.MessageRepository] numbers and stores messages."""

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
        if len(rows) == 1 and writes_in_one_statement(self.link):
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
            "of_tenant": self._required_tenant,
            "session_id": key,
            "count": count,
            "now": utcnow(),
        }
        if agent is not None:
            params["of_agent"] = agent
        statement: sa.Update = ALLOCATE if agent is None else ALLOCATE_ROUTED
        if claimed:
            many = len(claimed) > 1
            statement = allocate_checking(routed=agent is not None, many=many)
            if many:
                params["ids"] = claimed
            else:
                params["id"] = claimed[0]
        async with guarded(self.link):
            rows = await fetch(self.link, statement, params)
        if not rows:
            return None
        agent_id, end = rows[0]
        self._remember_agent(key, agent_id)
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
        params = {"ids": [row["id"] for row in rows], "of_tenant": self._required_tenant}
        async with guarded(self.link):
            found = await fetch(self.link, STORED_WITH, params)
        return {message.id: message for message in hydrate_all(Message, _COLUMNS, found)}

    async def _append_claiming_ids(
        self,
        key: uuid.UUID,
        batch: Sequence[MessageInput],
        rows: list[dict[str, Any]],
        claimed: Sequence[uuid.UUID],
    ) -> list[Message]:
        """`append` of ids the caller chose where they are claimed first (`claims_ids_first`).

        A distributed database, which has no unique index on ids for the
        counter's UPDATE to probe.  The ids are locked (`id_claims.claim`), then looked up on every
        shard: stored, they are a retry or a conflict (`replay`); else no
        other unit of work can store them before this one ends, and the
        batch is appended unchecked, on the agent's shard.
        """
        await self._agent_of(key)  # NotFoundError before any lock is taken
        await claim(self.link, MESSAGES, self._required_tenant, claimed)
        stored = await self._stored(rows)
        if stored:
            replayed = replay(key, batch, rows, stored)
            assert replayed is not None  # some are stored: the batch as stored, or ConflictError
            return replayed
        appended = await self._append(key, batch, rows, (), claimed=True)
        assert appended is not None  # unchecked: the session is there, or NotFoundError
        return appended

    async def _append_one(
        self, key: uuid.UUID, item: MessageInput, row: dict[str, Any], *, checked: bool, claimed: bool
    ) -> Message | None:
        """Append one checked message in one statement (`message_append_sql.append_one`, Postgres).

        `checked`: None if the message's id is stored (or there is no
        session), and nothing was written.  `claimed`: the caller chose the id.
        """
        check_writable(self.link)
        agent = await self._row_agent(key)  # the session's row: by its key
        now = utcnow()
        row.update(tenant=self._required_tenant, session_id=key, updated_at=now)
        if row["created_at"] is None:
            row["created_at"] = now
        params = {name: row[name] for name in _COLUMNS if name not in FROM_COUNTER}
        params.update(of_tenant=self._required_tenant, search_words=row["content"] or "")
        if agent is not None:
            params["of_agent"] = agent
        statement = append_one(checked=checked, routed=agent is not None)
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
        self._remember_agent(key, row["agent_id"])
        if isinstance(item, Message):
            item.__dict__.update(row)  # transient object: plain writes are enough
            return item
        return hydrate(Message, row)

    async def _lock_session(self, key: uuid.UUID) -> tuple[uuid.UUID, int]:
        """Lock the session row (as appends do) for a multi-statement edit."""
        return await self._allocate(key, 0)

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
        shared = {"tenant": self._required_tenant, "session_id": key, "agent_id": agent_id, "updated_at": now}
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
