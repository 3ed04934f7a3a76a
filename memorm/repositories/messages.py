"""``uow.messages``: the chat log (recall memory)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from memorm.bulk import insert_rows
from memorm.errors import NotFoundError, ValidationError
from memorm.ids import uuid7
from memorm.models import MESSAGES, ROLES, SESSIONS, Message, hydrate
from memorm.repositories.base import Repository
from memorm.types import utcnow
from memorm.validation import (
    as_uuid,
    check_aware,
    check_json,
    check_json_object,
    check_limit,
    check_text,
)

__all__ = ["MessageRepository"]

_MESSAGES = MESSAGES
_SESSIONS = SESSIONS
_COLUMNS = tuple(column.name for column in _MESSAGES.columns)
# What a caller may give for a message; the rest is assigned by append().
_GIVEN = ("id", "created_at", "meta", "role", "content", "name", "tool_calls", "tool_call_id", "token_count")
_ROLES = frozenset(ROLES)

MessageInput = Message | Mapping[str, Any]


def _check_message(item: object, index: int) -> dict[str, Any]:
    """The checked column values of one input message (a ``Message`` or a dict)."""
    where = f"messages[{index}]"
    given: Mapping[str, Any]
    if isinstance(item, Message):
        given = item.__dict__  # plain reads: no instrumentation on the hot path
    elif isinstance(item, Mapping):
        unknown = set(item) - set(_GIVEN)
        if unknown:
            raise ValidationError(f"{where}: unknown fields {', '.join(sorted(map(str, unknown)))}")
        given = item
    else:
        raise ValidationError(f"{where}: expected a Message or a dict, got {type(item).__name__}")
    role = given.get("role")
    if role not in _ROLES:
        raise ValidationError(f"{where}.role: {role!r} is not one of {', '.join(ROLES)}")
    tool_calls = given.get("tool_calls")
    if tool_calls is not None:
        if not isinstance(tool_calls, list):
            raise ValidationError(f"{where}.tool_calls: expected a list of dicts")
        check_json(tool_calls, f"{where}.tool_calls")
    tokens = given.get("token_count")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0):
        raise ValidationError(f"{where}.token_count: expected a non-negative integer")
    message_id = given.get("id")
    created_at = given.get("created_at")
    meta = given.get("meta")
    return {
        "id": uuid7() if message_id is None else as_uuid(message_id, f"{where}.id"),
        "created_at": None if created_at is None else check_aware(created_at, f"{where}.created_at"),
        "meta": {} if not meta else check_json_object(meta, f"{where}.meta"),
        "role": role,
        "content": check_text(given.get("content", ""), f"{where}.content"),
        "name": check_text(given.get("name"), f"{where}.name", optional=True),
        "tool_calls": tool_calls,
        "tool_call_id": check_text(given.get("tool_call_id"), f"{where}.tool_call_id", optional=True),
        "token_count": tokens,
    }


class MessageRepository(Repository):
    """Messages of a session, ordered by ``seq``."""

    async def append(
        self, session_id: uuid.UUID | str, messages: MessageInput | Sequence[MessageInput]
    ) -> list[Message]:
        """Append one message or a batch to the session, atomically.

        Messages are ``Message`` objects or dicts with the same fields.  Sequence
        numbers are allocated by the database (one ``UPDATE … RETURNING`` on the
        session's counter), so concurrent appenders never collide or leave gaps.
        Returns the stored messages in order; ``Message`` inputs are those same
        objects, filled in (``seq``, ``session_id``, ``agent_id``, timestamps).
        """
        key = as_uuid(session_id, "session_id")
        batch = [messages] if isinstance(messages, (Message, Mapping)) else list(messages)
        rows = [_check_message(item, index) for index, item in enumerate(batch)]
        now = utcnow()
        allocated = (
            await self._execute(
                sa.update(_SESSIONS)
                .where(_SESSIONS.c.id == key)
                .values(next_seq=_SESSIONS.c.next_seq + len(rows), updated_at=now)
                .returning(_SESSIONS.c.agent_id, _SESSIONS.c.next_seq)
            )
        ).first()
        if allocated is None:
            raise NotFoundError(f"no session {key}")
        agent_id, end = tuple(allocated)
        seq = end - len(rows)
        stored: list[Message] = []
        for item, row in zip(batch, rows, strict=True):
            row.update(session_id=key, agent_id=agent_id, seq=seq, updated_at=now)
            if row["created_at"] is None:
                row["created_at"] = now
            seq += 1
            if isinstance(item, Message):
                item.__dict__.update(row)  # transient object: plain writes are enough
                stored.append(item)
            else:
                stored.append(hydrate(Message, row))
        await insert_rows(self.session, _MESSAGES, _COLUMNS, [[row[c] for c in _COLUMNS] for row in rows])
        return stored

    async def window(
        self,
        session_id: uuid.UUID | str,
        *,
        limit: int = 50,
        before_seq: int | None = None,
    ) -> list[Message]:
        """The newest ``limit`` messages (before ``before_seq`` if given), oldest first."""
        key = as_uuid(session_id, "session_id")
        check_limit(limit)
        query = sa.select(Message).where(_MESSAGES.c.session_id == key)
        if before_seq is not None:
            query = query.where(_MESSAGES.c.seq < _check_seq(before_seq, "before_seq"))
        rows = list((await self._execute(query.order_by(_MESSAGES.c.seq.desc()).limit(limit))).scalars())
        if not rows:
            await self._require_session(key)
        rows.reverse()
        return rows

    async def count(self, session_id: uuid.UUID | str) -> int:
        """How many messages the session holds."""
        key = as_uuid(session_id, "session_id")
        total = await self._scalar(sa.select(sa.func.count()).where(_MESSAGES.c.session_id == key))
        if not total:
            await self._require_session(key)
        return int(total or 0)

    async def _require_session(self, key: uuid.UUID) -> None:
        if await self._scalar(sa.select(_SESSIONS.c.id).where(_SESSIONS.c.id == key)) is None:
            raise NotFoundError(f"no session {key}")


def _check_seq(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"{field}: expected an integer sequence number, got {value!r}")
    return value
