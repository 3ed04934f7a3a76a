"""The OpenAI Agents SDK's session memory, stored by memorm (extra `openai-agents`).

[`MemormSession`][memorm.compat.openai_agents.MemormSession] implements the SDK's
`Session` protocol, so a run's history lives in memorm's tables:

```python
from agents import Runner
from memorm.compat.openai_agents import MemormSession

session = MemormSession("user-42", db, agent=agent_id)
result = await Runner.run(agent, "Hello", session=session)
```

Each SDK input item is one memorm [`Message`][memorm.models.Message].  The item
itself is kept whole in `meta["openai_item"]`, so it reads back exactly as it
was added; the columns get what maps onto them, so memorm's search, windows and
token budgets see the conversation too:

| SDK item                      | role      | columns                          |
|-------------------------------|-----------|----------------------------------|
| message (user, assistant)     | same      | `content`: its text              |
| message (system, developer)   | system    | `content`: its text              |
| function_call                 | assistant | `tool_calls`: one function call  |
| other `*_call` with call_id   | assistant | `tool_calls`: `{"id", "type"}`   |
| `*_output` with call_id       | tool      | `tool_call_id`, `content`: text  |
| reasoning                     | assistant | `content`: the summary's text    |
| anything else                 | assistant | (the item only)                  |

Messages that other code wrote into the session (no `openai_item`) read back
as the equivalent items: a text message, plus one `function_call` per tool
call; a `tool` message as a `function_call_output`.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from memorm.compat._extras import missing_extra

try:
    from agents.items import TResponseInputItem
    from agents.memory import SessionSettings
    from agents.memory.session_settings import coerce_session_settings, resolve_session_limit
except ImportError as error:
    raise missing_extra(__name__, "openai-agents", error) from error

from memorm.db import Database
from memorm.errors import NotFoundError, ValidationError
from memorm.models import Agent, Message
from memorm.uow import UnitOfWork
from memorm.validation import INT64_MAX, INT64_MIN, as_uuid, check_duration, check_int, check_list

if TYPE_CHECKING:
    from agents.memory import Session

__all__ = ["ITEM_KEY", "PAGE", "MemormSession", "item_to_message", "message_to_items"]

ITEM_KEY = "openai_item"
"""The `Message.meta` key holding the SDK item a message was stored from."""

PAGE = 500
"""Messages read per query when a whole history is asked for."""

_BEFORE_FIRST = -(2**31) - 1  # below every seq (a 32-bit integer): forward reads start after it
_TEXT_KEYS = ("text", "refusal")  # where content parts keep their text


def _text(value: object) -> str:
    """The text of a content value: a string, or the text of its parts, one per line."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        return ""
    texts: list[str] = []
    for part in value:
        if isinstance(part, Mapping):
            texts += [part[key] for key in _TEXT_KEYS if isinstance(part.get(key), str)]
    return "\n".join(texts)


def item_to_message(item: TResponseInputItem) -> dict[str, Any]:
    """The memorm message (a dict for `uow.messages.append`) that stores one SDK item."""
    data = cast(Mapping[str, Any], item)
    if not isinstance(data, Mapping):
        raise ValidationError(f"expected an input item dict, got {type(data).__name__}")
    kind = data.get("type") or "message"
    kind = kind if isinstance(kind, str) else ""
    role = data.get("role")
    call_id = data.get("call_id")
    message: dict[str, Any] = {"role": "assistant", "content": "", "meta": {ITEM_KEY: data}}
    if kind == "message" and role in ("user", "assistant", "system", "developer"):
        message["role"] = "system" if role == "developer" else role
        message["content"] = _text(data.get("content"))
    elif kind == "function_call":
        function = {"name": data.get("name"), "arguments": data.get("arguments")}
        message["tool_calls"] = [{"id": call_id, "type": "function", "function": function}]
    elif isinstance(call_id, str) and kind.endswith("_output"):
        message.update(role="tool", tool_call_id=call_id, content=_text(data.get("output")))
    elif isinstance(call_id, str) and kind.endswith("_call"):
        message["tool_calls"] = [{"id": call_id, "type": kind}]
    elif kind == "reasoning":
        message["content"] = _text(data.get("summary"))
    return message


def message_to_items(message: Message) -> list[TResponseInputItem]:
    """The SDK items a memorm message stands for (one, unless other code wrote it)."""
    stored = message.meta.get(ITEM_KEY)
    if isinstance(stored, dict):
        return [cast(TResponseInputItem, stored)]
    items: list[dict[str, Any]] = []
    if message.role == "tool":
        items.append(
            {"type": "function_call_output", "call_id": message.tool_call_id or "", "output": message.content}
        )
    elif message.content or not message.tool_calls:
        items.append({"role": message.role, "content": message.content})
    for call in message.tool_calls or ():
        function = call.get("function") or {}
        arguments = function.get("arguments", "{}")
        items.append(
            {
                "type": "function_call",
                "call_id": str(call.get("id") or ""),
                "name": str(function.get("name") or call.get("name") or ""),
                "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
            }
        )
    return cast(list[TResponseInputItem], items)


class MemormSession:
    """The Agents SDK's `Session` protocol over a memorm [`Database`][memorm.db.Database].

    Args:
        session_id: the SDK's session id; it names the memorm session of the
            agent (`Session.key`), created on the first write.
        db: the shared database; a `MemormSession` is cheap and holds no
            connection, so make one per conversation.
        agent: the memorm agent (or its id) owning the session.
        session_settings: the SDK's settings; `limit` bounds `get_items()`
            when it is called without one.
        ttl: a `timedelta` or seconds: every `add_items` moves the
            session's expiry to `ttl` from then (as `RedisSession`'s
            `ttl` does), so a conversation idle that long is deleted by the
            next `purge_expired`.  Without it, the agent's `retention`
            applies, if any.

    Every method is one unit of work.  `clear_session` deletes the messages
    but keeps the memorm session (its title and `meta` are the app's).

    Example:
        ```python
        session = MemormSession("user-42", db, agent=agent.id)
        await Runner.run(assistant, "Hi", session=session)
        history = await session.get_items(limit=20)
        ```
    """

    session_id: str
    session_settings: SessionSettings | None

    def __init__(
        self,
        session_id: str,
        db: Database,
        *,
        agent: Agent | uuid.UUID | str,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        ttl: timedelta | float | None = None,
    ) -> None:
        self.session_id = session_id
        self.ttl = None if ttl is None else check_duration(ttl, "ttl")
        self.db = db
        self.agent_id = as_uuid(agent.id if isinstance(agent, Agent) else agent, "agent")
        self.session_settings = (
            coerce_session_settings(session_settings) if session_settings is not None else SessionSettings()
        )

    def __repr__(self) -> str:
        return f"MemormSession({self.session_id!r}, agent={str(self.agent_id)!r})"

    async def _find(self, uow: UnitOfWork) -> uuid.UUID | None:
        chat = await uow.sessions.get_by_key(self.agent_id, self.session_id)
        return None if chat is None else chat.id

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The newest `limit` items (all when None), oldest first.

        Without `limit`, `session_settings.limit` applies.  As in the SDK's
        `SQLiteSession`, `limit=0` gives no items and a negative one all.
        Only the messages asked for are read, in pages.
        """
        wanted = resolve_session_limit(limit, self.session_settings)
        if wanted is not None:
            check_int(wanted, "limit", minimum=INT64_MIN, maximum=INT64_MAX)
        if wanted == 0:
            return []
        async with self.db.unit_of_work(read_only=True) as uow:
            chat = await self._find(uow)
            if chat is None:
                return []
            if wanted is None or wanted < 0:
                return await _read_all(uow, chat)
            return await _read_newest(uow, chat, wanted)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append `items` in one unit of work (all or none are stored)."""
        messages = [item_to_message(item) for item in check_list(items, "items", "input items")]
        if not messages:
            return
        async with self.db.unit_of_work() as uow:
            chat = await uow.sessions.get_or_create(self.agent_id, self.session_id)
            await uow.messages.append(chat.id, messages)
            if self.ttl is not None:
                await uow.sessions.touch(chat.id, ttl=self.ttl)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item; None when the session is empty."""
        async with self.db.unit_of_work() as uow:
            chat = await self._find(uow)
            if chat is None:
                return None
            newest = await uow.messages.pop(chat)  # locks the session: concurrent pops never share one
            if newest is None:
                return None
            *kept, popped = message_to_items(newest)
            if kept:  # a message other code wrote, holding several items: put the rest back
                await uow.messages.append(chat, [item_to_message(item) for item in kept])
            return popped

    async def clear_session(self) -> None:
        """Delete every item of the session."""
        async with self.db.unit_of_work() as uow:
            chat = await self._find(uow)
            if chat is None:
                return
            # Deleted since we found it (Postgres, by a concurrent transaction): nothing to clear.
            with contextlib.suppress(NotFoundError):
                await uow.messages.clear(chat)


async def _read_all(uow: UnitOfWork, chat: uuid.UUID) -> list[TResponseInputItem]:
    items: list[TResponseInputItem] = []
    after = _BEFORE_FIRST
    while True:
        page = await uow.messages.window(chat, limit=PAGE, after_seq=after)
        items += _items(page)
        if len(page) < PAGE:
            return items
        after = page[-1].seq


async def _read_newest(uow: UnitOfWork, chat: uuid.UUID, wanted: int) -> list[TResponseInputItem]:
    pages: list[list[TResponseInputItem]] = []  # newest page first
    count = 0
    before: int | None = None
    while count < wanted:  # a message stands for one item or more
        asked = min(wanted - count, PAGE)
        page = await uow.messages.window(chat, limit=asked, before_seq=before)
        pages.append(_items(page))
        count += len(pages[-1])
        if len(page) < asked:
            break
        before = page[0].seq
    items = [item for page_items in reversed(pages) for item in page_items]
    return items[-wanted:]


def _items(messages: Sequence[Message]) -> list[TResponseInputItem]:
    return [item for message in messages for item in message_to_items(message)]


if TYPE_CHECKING:  # mypy checks that MemormSession satisfies the SDK's protocol
    _protocol: type[Session] = MemormSession
