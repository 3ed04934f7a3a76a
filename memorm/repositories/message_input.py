"""Checking messages and message-query arguments before anything is written or read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from memorm.errors import ValidationError
from memorm.ids import uuid7
from memorm.models import ROLES, Message
from memorm.tokens import TokenCounter
from memorm.validation import (
    INT32_MAX,
    as_uuid,
    check_aware,
    check_fields,
    check_int,
    check_json,
    check_json_object,
    check_list,
    check_text,
    shown,
)

__all__ = ["MessageInput", "check_batch", "check_message", "check_roles", "count_tokens"]

# What a caller may give for a message; the rest is assigned by the repository.
_GIVEN = frozenset(
    ("id", "created_at", "meta", "role", "content", "name", "tool_calls", "tool_call_id", "token_count")
)
_ROLES = frozenset(ROLES)

MessageInput = Message | Mapping[str, Any]
"""A message to store: a `Message` or a dict of its fields (`role`, `content`…)."""


def check_message(item: object, index: int) -> dict[str, Any]:
    """The checked column values of one input message (a `Message` or a dict)."""
    where = f"messages[{index}]"
    given: Mapping[str, Any]
    if isinstance(item, Message):
        given = item.__dict__  # plain reads: no instrumentation on the hot path
    elif isinstance(item, Mapping):
        given = check_fields(item, _GIVEN, where)
    else:
        raise ValidationError(f"{where}: expected a Message or a dict, got {type(item).__name__}")
    role = given.get("role")
    if not isinstance(role, str) or role not in _ROLES:  # a list would not even hash
        raise ValidationError(f"{where}.role: {shown(role)} is not one of {', '.join(ROLES)}")
    tool_calls = given.get("tool_calls")
    if tool_calls is not None:
        if not isinstance(tool_calls, list) or not all(isinstance(call, Mapping) for call in tool_calls):
            raise ValidationError(f"{where}.tool_calls: expected a list of dicts")
        check_json(tool_calls, f"{where}.tool_calls")
    tokens = given.get("token_count")
    if tokens is not None:
        check_int(tokens, f"{where}.token_count", minimum=0, maximum=INT32_MAX)
    message_id = given.get("id")
    created_at = given.get("created_at")
    meta = given.get("meta")
    return {
        "id": uuid7() if message_id is None else as_uuid(message_id, f"{where}.id"),
        "created_at": None if created_at is None else check_aware(created_at, f"{where}.created_at"),
        "meta": check_json_object(meta, f"{where}.meta", keep=True),
        "role": role,
        "content": _check_content(given.get("content", ""), role, where),
        "name": check_text(given.get("name"), f"{where}.name", optional=True),
        "tool_calls": tool_calls,
        "tool_call_id": check_text(given.get("tool_call_id"), f"{where}.tool_call_id", optional=True),
        "token_count": tokens,
    }


def _check_content(content: object, role: str, where: str) -> str | None:
    """Text; None only for an assistant message (OpenAI's, when it only calls tools)."""
    if content is None and role != "assistant":
        raise ValidationError(f"{where}.content: only assistant messages may have no content (None)")
    return check_text(content, f"{where}.content", optional=True)


def check_batch(
    messages: MessageInput | Sequence[MessageInput],
) -> tuple[list[MessageInput], list[dict[str, Any]]]:
    """The messages given (one, or a list) and their checked column values."""
    if isinstance(messages, (Message, Mapping)):
        batch: list[MessageInput] = [messages]
    else:
        batch = check_list(messages, "messages", "messages (Message objects or dicts)")
    rows = [check_message(item, index) for index, item in enumerate(batch)]
    if len(rows) > 1 and len({row["id"].int for row in rows}) < len(rows):
        _repeated_id(rows)
    return batch, rows


def _repeated_id(rows: list[dict[str, Any]]) -> None:
    """Name the first message whose id an earlier one of the batch has (each id is one message)."""
    seen: dict[Any, int] = {}
    for index, row in enumerate(rows):
        first = seen.setdefault(row["id"], index)
        if first != index:
            raise ValidationError(f"messages[{index}].id: {row['id']} is messages[{first}]'s id too")


def count_tokens(counter: TokenCounter, rows: list[dict[str, Any]]) -> None:
    """Fill in the `token_count` of checked rows that have none, before anything is written."""
    for index, row in enumerate(rows):
        if row["token_count"] is None:
            tokens = counter(row)
            if type(tokens) is not int or not 0 <= tokens <= INT32_MAX:  # the message only on failure
                check_int(tokens, f"messages[{index}].token_count (from the token counter)", minimum=0)
            row["token_count"] = tokens


def check_roles(roles: object) -> list[str] | None:
    """A role or an iterable of roles (None: every role)."""
    if roles is None:
        return None
    checked = [roles] if isinstance(roles, str) else check_list(roles, "roles", "roles")
    for role in checked:
        if not isinstance(role, str) or role not in _ROLES:
            raise ValidationError(f"roles: {shown(role)} is not one of {', '.join(ROLES)}")
    if not checked:
        raise ValidationError("roles: give at least one role, or None for all")
    return checked
