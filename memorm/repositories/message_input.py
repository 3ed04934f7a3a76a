"""Checking messages and message-query arguments before anything is written or read."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import date, datetime, time, timedelta, timezone
from typing import Any

from memorm.errors import ValidationError
from memorm.ids import uuid7
from memorm.models import ROLES, Message
from memorm.validation import as_uuid, check_aware, check_json, check_json_object, check_text

__all__ = ["MessageInput", "as_instant", "check_batch", "check_int", "check_message", "check_roles"]

# What a caller may give for a message; the rest is assigned by the repository.
_GIVEN = frozenset(
    ("id", "created_at", "meta", "role", "content", "name", "tool_calls", "tool_call_id", "token_count")
)
_ROLES = frozenset(ROLES)

MessageInput = Message | Mapping[str, Any]
"""A message to store: a ``Message`` or a dict of its fields (``role``, ``content``…)."""


def check_message(item: object, index: int) -> dict[str, Any]:
    """The checked column values of one input message (a ``Message`` or a dict)."""
    where = f"messages[{index}]"
    given: Mapping[str, Any]
    if isinstance(item, Message):
        given = item.__dict__  # plain reads: no instrumentation on the hot path
    elif isinstance(item, Mapping):
        unknown = set(item) - _GIVEN
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
        if not isinstance(tool_calls, list) or not all(isinstance(call, Mapping) for call in tool_calls):
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


def check_batch(
    messages: MessageInput | Sequence[MessageInput],
) -> tuple[list[MessageInput], list[dict[str, Any]]]:
    batch = [messages] if isinstance(messages, (Message, Mapping)) else list(messages)
    return batch, [check_message(item, index) for index, item in enumerate(batch)]


def check_int(value: object, field: str, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        bound = "" if minimum is None else f" >= {minimum}"
        raise ValidationError(f"{field}: expected an integer{bound}, got {value!r}")
    return value


def check_roles(roles: Iterable[str] | None) -> list[str] | None:
    if roles is None:
        return None
    if isinstance(roles, str):
        roles = [roles]
    checked = list(roles)
    for role in checked:
        if role not in _ROLES:
            raise ValidationError(f"roles: {role!r} is not one of {', '.join(ROLES)}")
    if not checked:
        raise ValidationError("roles: give at least one role, or None for all")
    return checked


def as_instant(value: object, field: str, *, end: bool) -> tuple[datetime, bool]:
    """A datetime bound, and whether it is inclusive.  A date ``end`` covers that whole day (UTC)."""
    if isinstance(value, datetime):
        return check_aware(value, field), True
    if isinstance(value, date):
        start = datetime.combine(value, time.min, tzinfo=timezone.utc)
        return (start + timedelta(days=1), False) if end else (start, True)
    raise ValidationError(f"{field}: expected a datetime or a date, got {type(value).__name__}")
