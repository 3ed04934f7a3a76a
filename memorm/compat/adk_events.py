"""ADK events as memorm messages, and the errors of `memorm.compat.adk` (extra `adk`).

An ADK `Event` is stored as one [`Message`][memorm.models.Message]: the event
whole, as JSON, in `meta["adk_event"]` (read back with `Event.model_validate`,
so it comes back equal), and in the columns what memorm's search, windows and
token budgets can use.  The message's `created_at` is the event's timestamp,
which `GetSessionConfig.after_timestamp` filters on.

The errors are memorm's (`ConflictError`, `NotFoundError`) and ADK's at once,
so code catching either, ADK's `Runner` and API server among them, still does.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from typing import Any

from memorm.compat._extras import missing_extra

try:
    from google.adk.errors._stale_session_error import StaleSessionError
    from google.adk.errors.already_exists_error import AlreadyExistsError
    from google.adk.errors.session_not_found_error import SessionNotFoundError
    from google.adk.events.event import Event
    from google.adk.sessions.session import Session
    from google.genai import types
except ImportError as error:
    raise missing_extra(__name__, "adk", error) from error

from memorm.errors import ConflictError, NotFoundError, ValidationError
from memorm.models import Message
from memorm.uow import UnitOfWork
from memorm.validation import MAX_PAGE, MAX_TIME, MIN_TIME, check_json, check_json_object, check_name

__all__ = [
    "EVENT_KEY",
    "STALE",
    "SessionExistsError",
    "SessionMissingError",
    "SessionStaleError",
    "chat_id",
    "check_fresh",
    "check_id",
    "check_state",
    "event_id_of",
    "event_to_message",
    "message_to_event",
    "newest",
    "session_key",
    "since_time",
    "to_instant",
]

EVENT_KEY = "adk_event"
"""The `Message.meta` key holding the ADK event a message was stored from."""

_BEFORE_FIRST = -(2**31) - 1  # below every seq: forward reads start after it
_KEY_MAX = 512  # a memorm session key (`MAX_NAME`): both ids, as JSON


class SessionExistsError(ConflictError, AlreadyExistsError):
    """`create_session` with a `session_id` the user already has in the app."""


class SessionMissingError(NotFoundError, SessionNotFoundError):
    """`append_event` to a session that is not stored (never created, or deleted)."""


class SessionStaleError(ConflictError, StaleSessionError):
    """`append_event` with a session object older than what is stored: reload it (`get_session`)."""


def check_id(value: object, field: str) -> str:
    """An app name, user id or session id: a non-blank string without NUL (`ValidationError`)."""
    return check_name(value, field)


def session_key(user_id: str, session_id: str) -> str:
    """The memorm session key (and store key) of one user's ADK session: both ids, as JSON."""
    key = json.dumps([user_id, session_id], ensure_ascii=False, separators=(",", ":"))
    if len(key) > _KEY_MAX:
        raise ValidationError(
            f"user_id and session_id: together longer than the {_KEY_MAX - 7} characters kept"
        )
    return key


def to_instant(timestamp: float, field: str) -> datetime:
    """An ADK timestamp (seconds since the epoch) as the UTC datetime memorm stores."""
    try:
        instant = datetime.fromtimestamp(timestamp, timezone.utc)
    except (OverflowError, OSError, ValueError, TypeError) as error:
        raise ValidationError(f"{field}: {timestamp!r} is not a storable time ({error})") from None
    if not MIN_TIME <= instant <= MAX_TIME:
        raise ValidationError(f"{field}: {instant.isoformat()} is outside the range memorm stores")
    return instant


def check_state(state: dict[str, Any], field: str) -> None:
    """Each value of a state (or state delta) is JSON: `ValidationError` naming the key otherwise."""
    check_json_object(state, field)
    for key, value in state.items():
        check_json(value, f"{field}[{key!r}]")


def event_to_message(event: Event) -> dict[str, Any]:
    """The memorm message (a dict for `uow.messages.append`) that stores one event."""
    check_state(event.actions.state_delta, "event.actions.state_delta")
    try:
        data = event.model_dump(mode="json", exclude_none=True)
    except Exception as error:  # pydantic cannot make JSON of a value the event holds
        raise ValidationError(f"event {event.id}: not serializable as JSON ({error})") from error
    message: dict[str, Any] = {
        "role": "user" if event.author == "user" else "assistant",
        "content": "",
        "name": event.author,
        "created_at": to_instant(event.timestamp, "event.timestamp"),
        "meta": {EVENT_KEY: check_json_object(data, "event")},
    }
    parts = (event.content.parts if event.content else None) or []
    texts = [part.text for part in parts if part.text and not part.thought]
    calls = [part.function_call for part in parts if part.function_call]
    answers = [part.function_response for part in parts if part.function_response]
    if answers:  # what a tool gave back: a `tool` message answering the (first) call
        message.update(role="tool", tool_call_id=answers[0].id or "")
        texts += [json.dumps(answer.response, ensure_ascii=False, default=str) for answer in answers]
    elif calls:
        message["role"] = "assistant"
        message["tool_calls"] = [
            {
                "id": call.id or "",
                "type": "function",
                "function": {"name": call.name or "", "arguments": json.dumps(call.args or {}, default=str)},
            }
            for call in calls
        ]
    message["content"] = "\n".join(texts)
    return message


def message_to_event(message: Message) -> Event:
    """The event a message stands for: the stored one, or one made of its columns (other code wrote it)."""
    stored = message.meta.get(EVENT_KEY)
    if isinstance(stored, dict):
        return Event.model_validate(stored)
    role = "user" if message.role == "user" else "model"
    return Event(
        id=str(message.id),
        invocation_id="",
        author=message.name or ("user" if role == "user" else "memorm"),
        content=types.Content(role=role, parts=[types.Part(text=message.content or "")]),
        timestamp=message.created_at.timestamp(),
    )


def event_id_of(message: Message) -> str:
    """The id of the event a message stands for."""
    stored = message.meta.get(EVENT_KEY)
    if isinstance(stored, dict) and isinstance(stored.get("id"), str):
        return str(stored["id"])
    return str(message.id)


def chat_id(value: object) -> uuid.UUID:
    """The memorm session id kept in a session's store item."""
    return uuid.UUID(str(value))


async def check_fresh(uow: UnitOfWork, chat: uuid.UUID, session: Session, value: dict[str, Any]) -> None:
    """`SessionStaleError` unless `session` holds what is stored: nothing was appended since it was read."""
    marker = session._storage_update_marker
    if marker is not None:
        if marker != str(value["revision"]):
            raise SessionStaleError(STALE)
    elif value["update_time"] > session.last_update_time:
        # A session object not read here (made by hand, or by another service): as ADK's database
        # service, it is current if its newest event is the newest stored.
        newest = await uow.messages.window(chat, limit=1)
        stored = event_id_of(newest[-1]) if newest else None
        if stored != (session.events[-1].id if session.events else None):
            raise SessionStaleError(STALE)


STALE = (
    "The session has been modified in storage since it was loaded. "
    "Please reload the session before appending more events."
)


async def newest(uow: UnitOfWork, chat: uuid.UUID, wanted: int | None) -> list[Message]:
    """The session's newest `wanted` messages (all when None), oldest first, read in windows."""
    if wanted is None:
        messages: list[Message] = []
        after = _BEFORE_FIRST
        while True:
            page = await uow.messages.window(chat, limit=MAX_PAGE, after_seq=after)
            messages += page
            if len(page) < MAX_PAGE:
                return messages
            after = page[-1].seq
    pages: list[list[Message]] = []
    count, before = 0, None
    while count < wanted:
        asked = min(wanted - count, MAX_PAGE)
        page = await uow.messages.window(chat, limit=asked, before_seq=before)
        pages.append(page)
        count += len(page)
        if len(page) < asked:
            break
        before = page[0].seq
    return [message for page in reversed(pages) for message in page]


async def since_time(
    uow: UnitOfWork, agent: uuid.UUID, chat: uuid.UUID, after: float, wanted: int | None
) -> list[Message]:
    """The session's messages of events at or after `after` (the newest `wanted`), in append order."""
    since = to_instant(after, "after_timestamp")
    first = await uow.messages.between(agent, since, MAX_TIME, session_id=chat, limit=1)
    skip = 0 if wanted is None else max(0, first.total - wanted)
    found: list[Message] = []
    while len(found) < first.total - skip:
        page = await uow.messages.between(
            agent, since, MAX_TIME, session_id=chat, limit=MAX_PAGE, offset=skip + len(found)
        )
        found += page.items
        if len(page.items) < MAX_PAGE:
            break
    # `created_at` is the timestamp to the microsecond: the exact one decides at the edge.
    kept = [message for message in found if message_to_event(message).timestamp >= after]
    return sorted(kept, key=lambda message: message.seq)
