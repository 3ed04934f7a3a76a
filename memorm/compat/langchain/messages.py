"""LangChain messages <-> memorm messages, losslessly, filling memorm's columns on the way.

`from_langchain` gives the row `uow.messages.append` stores;
`to_langchain` gives back an object equal to the one stored, or, for a
message written with memorm's own API, the closest LangChain message.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    message_to_dict,
    messages_from_dict,
)
from langchain_core.messages.tool import ToolCall, invalid_tool_call, tool_call

from memorm.errors import ValidationError
from memorm.models import Message

__all__ = ["LANGCHAIN_KEY", "from_langchain", "to_langchain"]


# memorm's roles are system | user | assistant | tool; LangChain's message types map onto them.
_TYPE_ROLES = {
    "human": "user",
    "HumanMessageChunk": "user",
    "ai": "assistant",
    "AIMessageChunk": "assistant",
    "system": "system",
    "SystemMessageChunk": "system",
    "tool": "tool",
    "ToolMessageChunk": "tool",
    "function": "tool",  # a legacy function result answers a call, as a tool message does
    "FunctionMessageChunk": "tool",
}
_CHAT_ROLES = {
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "ai": "assistant",
    "model": "assistant",
    "system": "system",
    "developer": "system",
    "tool": "tool",
    "function": "tool",
}
LANGCHAIN_KEY = "langchain"  # Message.meta[LANGCHAIN_KEY]: the message as message_to_dict gives it


def from_langchain(message: BaseMessage) -> dict[str, Any]:
    """The memorm message (a dict for `uow.messages.append`) storing a LangChain message.

    `role`, `content`, `name`, `tool_calls` (OpenAI style) and
    `tool_call_id` fill memorm's columns, so memorm's search, context windows
    and trims work on them; `meta["langchain"]` keeps LangChain's own
    serialisation (`message_to_dict`, less a string `content`, which the
    column holds), so `to_langchain` gives back an equal object.
    `ChatMessage` roles map to the closest memorm role (unknown ones to
    `user`); the original type and role stay in `meta`.
    """
    kind = message.type
    if isinstance(message, ChatMessage):
        role = _CHAT_ROLES.get(message.role.lower(), "user")
    elif kind in _TYPE_ROLES:
        role = _TYPE_ROLES[kind]
    else:
        raise ValidationError(f"a {type(message).__name__} ({kind!r}) is not a message memorm can store")
    stored = message_to_dict(message)
    if isinstance(message.content, str):
        content = message.content
        del stored["data"]["content"]
    else:
        content = str(message.text)  # the text blocks, for full-text search and token estimates
    row: dict[str, Any] = {
        "role": role,
        "content": content,
        "name": message.name,
        "meta": {LANGCHAIN_KEY: stored},
    }
    if isinstance(message, AIMessage) and message.tool_calls:
        row["tool_calls"] = [_openai_call(call) for call in message.tool_calls]
    if isinstance(message, ToolMessage):
        row["tool_call_id"] = message.tool_call_id
    return row


def _openai_call(call: ToolCall) -> dict[str, Any]:
    try:
        arguments = json.dumps(call["args"], ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ValidationError(f"tool call {call.get('id')!r}: arguments are not JSON ({error})") from None
    return {
        "id": call.get("id"),
        "type": "function",
        "function": {"name": call["name"], "arguments": arguments},
    }


def to_langchain(message: Message) -> BaseMessage:
    """The LangChain message a memorm message stores.

    Messages written by `from_langchain` come back equal to the
    original; others (written with memorm's own API) are built from the
    columns, with `id` the memorm message id.
    """
    stored = (message.meta or {}).get(LANGCHAIN_KEY)
    if (
        isinstance(stored, dict)
        and isinstance(stored.get("type"), str)
        and isinstance(stored.get("data"), dict)
    ):
        data = dict(stored["data"])
        data.setdefault("content", message.content or "")
        # Not ours after all (another app's "langchain" key): fall back to the columns.
        with contextlib.suppress(ValueError, TypeError):
            return messages_from_dict([{"type": stored["type"], "data": data}])[0]
    common: dict[str, Any] = {"content": message.content or "", "name": message.name, "id": str(message.id)}
    if message.role == "system":
        return SystemMessage(**common)
    if message.role == "tool":
        return ToolMessage(tool_call_id=message.tool_call_id or "", **common)
    if message.role == "assistant":
        calls, invalid = _langchain_calls(message.tool_calls or [])
        return AIMessage(tool_calls=calls, invalid_tool_calls=invalid, **common)
    return HumanMessage(**common)


def _langchain_calls(calls: list[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    """LangChain tool calls from OpenAI-style ones (or flat `{"id", "name", "args"}` dicts)."""
    valid: list[Any] = []
    invalid: list[Any] = []
    for call in calls:
        function = call.get("function")
        if isinstance(function, dict):
            name, raw = function.get("name"), function.get("arguments")
        else:
            name, raw = call.get("name"), call.get("args")
        call_id = call.get("id")
        try:
            args = json.loads(raw) if isinstance(raw, str) else raw
        except (ValueError, RecursionError) as error:  # not JSON, or nested past Python's parser
            invalid.append(invalid_tool_call(name=name, args=raw, id=call_id, error=str(error)))
            continue
        if isinstance(args, dict) and isinstance(name, str):
            valid.append(tool_call(name=name, args=args, id=call_id))
        else:
            invalid.append(invalid_tool_call(name=name, args=json.dumps(raw), id=call_id, error="not a call"))
    return valid, invalid
