"""Google ADK's session service over memorm: ADK's session contract, exact round trips, real runs."""

from __future__ import annotations

import asyncio
import math
import sys
import uuid
from collections.abc import AsyncGenerator
from typing import Any

import anyio.to_thread
import pytest

if sys.version_info < (3, 11):  # google-adk needs 3.11; memorm's `adk` extra is marked so
    pytest.skip("google-adk needs Python 3.11+", allow_module_level=True)

from google.adk.agents import LlmAgent
from google.adk.errors._stale_session_error import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions.base_session_service import BaseSessionService, GetSessionConfig
from google.adk.sessions.in_memory_session_service import InMemorySessionService
from google.adk.sessions.session import Session
from google.genai import types
from hypothesis import given
from hypothesis import strategies as st
from pydantic import Field

from memorm import Database, ValidationError
from memorm.compat.adk import MemormSessionService, SessionExistsError, SessionMissingError, SessionStaleError
from memorm.errors import ConflictError, NotFoundError
from tests.conftest import Store, count_rows

pytestmark = pytest.mark.anyio

APP = "travel"


def _event(author: str = "user", text: str | None = None, **fields: Any) -> Event:
    content = (
        None
        if text is None
        else types.Content(role="user" if author == "user" else "model", parts=[types.Part(text=text)])
    )
    return Event(invocation_id=fields.pop("invocation_id", "inv"), author=author, content=content, **fields)


def _delta(state: dict[str, Any], **fields: Any) -> Event:
    return _event(actions=EventActions(state_delta=state), **fields)


def rich_events() -> list[Event]:
    """Events as a run makes them: text, a function call and its response, bytes, actions, metadata."""
    call = types.FunctionCall(id="call-1", name="weather", args={"city": "Zürich", "days": 3})
    answer = types.FunctionResponse(id="call-1", name="weather", response={"result": "-3 °C"})
    return [
        _event("user", "Weather in Zürich?", timestamp=1_700_000_000.123456),
        Event(
            invocation_id="inv",
            author="forecaster",
            content=types.Content(
                role="model", parts=[types.Part(text="Let me look."), types.Part(function_call=call)]
            ),
            long_running_tool_ids={"call-1"},
            usage_metadata=types.GenerateContentResponseUsageMetadata(
                prompt_token_count=3, total_token_count=5
            ),
            timestamp=1_700_000_001.5,
        ),
        Event(
            invocation_id="inv",
            author="forecaster",
            content=types.Content(role="user", parts=[types.Part(function_response=answer)]),
            actions=EventActions(state_delta={"city": "Zürich", "user:unit": "C"}, artifact_delta={"map": 0}),
            timestamp=1_700_000_002.0,
        ),
        Event(
            invocation_id="inv",
            author="forecaster",
            content=types.Content(
                role="model",
                parts=[
                    types.Part(text="It is -3 °C."),
                    types.Part.from_bytes(data=b"\x89PNG\x00\xff", mime_type="image/png"),
                ],
            ),
            actions=EventActions(transfer_to_agent="planner", escalate=True),
            grounding_metadata=types.GroundingMetadata(web_search_queries=["weather zürich"]),
            custom_metadata={"nested": {"list": [1, 2.5, None]}},
            turn_complete=True,
            timestamp=1_700_000_003.25,
        ),
    ]


# -- the contract ADK's services share ------------------------------------------


async def test_service_is_an_adk_session_service(db: Database) -> None:
    assert isinstance(MemormSessionService(db), BaseSessionService)
    assert issubclass(SessionExistsError, ConflictError)
    assert issubclass(SessionExistsError, AlreadyExistsError)
    assert issubclass(SessionMissingError, NotFoundError)
    assert issubclass(SessionMissingError, SessionNotFoundError)
    assert issubclass(SessionStaleError, ConflictError)
    assert issubclass(SessionStaleError, StaleSessionError)


async def test_create_with_and_without_id_and_get_it_back(db: Database) -> None:
    service = MemormSessionService(db)
    made = await service.create_session(app_name=APP, user_id="ana", state={"k": "v"})
    assert made.id
    assert made.app_name == APP
    assert made.user_id == "ana"
    assert made.state == {"k": "v"}
    named = await service.create_session(app_name=APP, user_id="ana", session_id="  trip-1 ")
    assert named.id == "trip-1"  # stripped, as ADK's in-memory and SQLite services do
    assert await service.get_session(app_name=APP, user_id="ana", session_id=made.id) == made
    assert await service.get_session(app_name=APP, user_id="ana", session_id=" trip-1") == named
    again = await MemormSessionService(db).get_session(app_name=APP, user_id="ana", session_id=made.id)
    assert again == made  # a new service: from the database


async def test_a_taken_session_id_raises_session_exists(db: Database) -> None:
    service = MemormSessionService(db)
    await service.create_session(app_name=APP, user_id="ana", session_id="s1", state={"k": 1})
    with pytest.raises(AlreadyExistsError, match="already exists"):
        await service.create_session(app_name=APP, user_id="ana", session_id="s1", state={"k": 2})
    session = await service.get_session(app_name=APP, user_id="ana", session_id="s1")
    assert session is not None
    assert session.state == {"k": 1}
    # The same id for another user, or in another app, is another session.
    await service.create_session(app_name=APP, user_id="ben", session_id="s1")
    await service.create_session(app_name="other", user_id="ana", session_id="s1")


async def test_get_of_a_missing_session_is_none(db: Database) -> None:
    service = MemormSessionService(db)
    assert await service.get_session(app_name="nowhere", user_id="ana", session_id="s1") is None
    session = await service.create_session(app_name=APP, user_id="ana", session_id="s1")
    await service.append_event(session, _event())
    assert await service.get_session(app_name=APP, user_id="ana", session_id="s2") is None
    assert await service.get_session(app_name=APP, user_id="ben", session_id="s1") is None
    await service.create_session(app_name=APP, user_id="ben", session_id="s1")
    theirs = await service.get_session(app_name=APP, user_id="ben", session_id="s1")
    assert theirs is not None
    assert theirs.user_id == "ben"
    assert theirs.events == []


async def test_state_is_scoped_to_app_user_and_session_and_temp_is_never_stored(db: Database) -> None:
    service = MemormSessionService(db)
    s1 = await service.create_session(
        app_name=APP,
        user_id="u1",
        session_id="s1",
        state={"app:a1": 1, "user:u1": "x", "sk1": [1], "temp:t": 0},
    )
    assert s1.state == {"app:a1": 1, "user:u1": "x", "sk1": [1]}
    event = _delta({"app:a2": {"deep": True}, "user:u2": None, "sk2": 2.5, "temp:t2": "now"})
    await service.append_event(s1, event)
    assert s1.state["temp:t2"] == "now"  # the invocation still sees it
    assert "temp:t2" not in event.actions.state_delta
    s1b = await service.create_session(app_name=APP, user_id="u1", session_id="s1b")
    assert s1b.state == {"app:a1": 1, "app:a2": {"deep": True}, "user:u1": "x", "user:u2": None}
    s2 = await service.create_session(app_name=APP, user_id="u2", session_id="s2")
    assert s2.state == {"app:a1": 1, "app:a2": {"deep": True}}
    got = await service.get_session(app_name=APP, user_id="u1", session_id="s1")
    assert got is not None
    assert got.state == {
        "app:a1": 1,
        "app:a2": {"deep": True},
        "user:u1": "x",
        "user:u2": None,
        "sk1": [1],
        "sk2": 2.5,
    }
    assert got.events[0].actions.state_delta == {"app:a2": {"deep": True}, "user:u2": None, "sk2": 2.5}
    assert await service.get_user_state(app_name=APP, user_id="u1") == {"u1": "x", "u2": None}
    assert await service.get_user_state(app_name=APP, user_id="u2") == {}
    assert await service.get_user_state(app_name="other", user_id="u1") == {}
    await service.append_event(s2, _delta({"user:u1": "mine"}))
    assert await service.get_user_state(app_name=APP, user_id="u1") == {"u1": "x", "u2": None}


async def test_list_sessions_per_user_and_for_all_users_oldest_update_first(db: Database) -> None:
    service = MemormSessionService(db)
    assert (await service.list_sessions(app_name=APP)).sessions == []
    a = await service.create_session(app_name=APP, user_id="u1", session_id="a", state={"user:n": 1})
    b = await service.create_session(app_name=APP, user_id="u1", session_id="b", state={"k": "b"})
    c = await service.create_session(app_name=APP, user_id="u2", session_id="c", state={"app:x": 1})
    await service.append_event(a, _event(text="hi", timestamp=b.last_update_time + 100))
    mine = (await service.list_sessions(app_name=APP, user_id="u1")).sessions
    assert [s.id for s in mine] == ["b", "a"]  # a was updated last
    assert [s.state for s in mine] == [{"k": "b", "user:n": 1, "app:x": 1}, {"user:n": 1, "app:x": 1}]
    assert all(s.events == [] for s in mine)
    every = (await service.list_sessions(app_name=APP, user_id=None)).sessions
    assert [(s.user_id, s.id) for s in every] == [("u1", "b"), ("u2", "c"), ("u1", "a")]
    assert every[1].state == {"app:x": 1}
    assert (await service.list_sessions(app_name=APP, user_id="u3")).sessions == []
    assert c.last_update_time <= every[2].last_update_time


async def test_delete_removes_the_session_and_its_events(db: Database) -> None:
    service = MemormSessionService(db)
    session = await service.create_session(app_name=APP, user_id="ana", session_id="s1")
    keep = await service.create_session(app_name=APP, user_id="ana", session_id="s2")
    await service.append_events(session, [_event(text="one"), _event(text="two")])
    await service.append_event(keep, _event(text="kept"))
    assert await count_rows(db, "messages") == 3
    await service.delete_session(app_name=APP, user_id="ana", session_id="s1")
    assert await service.get_session(app_name=APP, user_id="ana", session_id="s1") is None
    assert await count_rows(db, "messages") == 1
    assert [s.id for s in (await service.list_sessions(app_name=APP)).sessions] == ["s2"]
    await service.delete_session(app_name=APP, user_id="ana", session_id="s1")  # gone: nothing to do
    await service.delete_session(app_name="nowhere", user_id="ana", session_id="s1")
    with pytest.raises(SessionNotFoundError):
        await service.append_event(session, _event(text="late"))


async def test_events_round_trip_exactly_and_in_order(db: Database, store: Store) -> None:
    service = MemormSessionService(db)
    session = await service.create_session(app_name=APP, user_id="ana", session_id="s1")
    events = rich_events()
    sent = [event.model_dump(mode="json", exclude_none=True) for event in events]
    for event in events:
        assert await service.append_event(session, event) is event
    assert session.last_update_time == events[-1].timestamp
    assert session.events == events
    again = store.database()  # another pool: the events come from the database
    try:
        got = await MemormSessionService(again).get_session(app_name=APP, user_id="ana", session_id="s1")
    finally:
        await again.dispose()
    assert got == session
    assert got is not None
    assert [e.model_dump(mode="json", exclude_none=True) for e in got.events] == sent
    assert got.events[3].content is not None
    assert got.events[3].content.parts is not None
    assert got.events[3].content.parts[1].inline_data is not None
    assert got.events[3].content.parts[1].inline_data.data == b"\x89PNG\x00\xff"
    assert got.state == {"city": "Zürich", "user:unit": "C"}

    # The conversation as memorm messages: what search, windows and token budgets see.
    async with db.unit_of_work(read_only=True) as uow:
        agent = await uow.agents.get_by_name(APP)
        assert agent is not None
        chat = await uow.sessions.get_by_key(agent.id, '["ana","s1"]')
        assert chat is not None
        messages = await uow.messages.window(chat.id, limit=10)
        found = await uow.messages.search(agent.id, "Zürich", roles=["user"])
    assert [(m.role, m.name) for m in messages] == [
        ("user", "user"),
        ("assistant", "forecaster"),
        ("tool", "forecaster"),
        ("assistant", "forecaster"),
    ]
    assert messages[1].content == "Let me look."
    assert messages[1].tool_calls == [
        {
            "id": "call-1",
            "type": "function",
            "function": {"name": "weather", "arguments": '{"city": "Z\\u00fcrich", "days": 3}'},
        }
    ]
    assert messages[2].tool_call_id == "call-1"
    assert "-3 °C" in (messages[2].content or "")
    assert [m.created_at.timestamp() for m in messages] == pytest.approx(
        [e.timestamp for e in events], abs=1e-6
    )
    assert [m.content for m in found.items] == ["Weather in Zürich?"]


async def test_other_codes_messages_and_deletions_are_seen(db: Database) -> None:
    service = MemormSessionService(db)
    session = await service.create_session(app_name=APP, user_id="ana", session_id="s1")
    await service.append_event(session, _event(text="from adk"))
    async with db.unit_of_work() as uow:
        agent = await uow.agents.get_by_name(APP)
        assert agent is not None
        chat = await uow.sessions.get_by_key(agent.id, '["ana","s1"]')
        assert chat is not None
        await uow.messages.append(chat.id, [{"role": "assistant", "content": "from memorm", "name": "sam"}])
    got = await service.get_session(app_name=APP, user_id="ana", session_id="s1")
    assert got is not None
    assert [(e.author, e.content.parts[0].text) for e in got.events if e.content and e.content.parts] == [
        ("user", "from adk"),
        ("sam", "from memorm"),
    ]
    assert got.events[1].content is not None
    assert got.events[1].content.role == "model"
    # Its memorm session deleted by other code (a purge, say): the ADK session is gone too.
    async with db.unit_of_work() as uow:
        await uow.sessions.delete(chat.id)
    assert await service.get_session(app_name=APP, user_id="ana", session_id="s1") is None
    with pytest.raises(SessionNotFoundError):
        await service.append_event(got, _event(text="late"))


async def test_an_apps_deleted_agent_is_made_anew(db: Database) -> None:
    service = MemormSessionService(db)
    await service.create_session(app_name=APP, user_id="ana", session_id="s1", state={"app:x": 1})
    assert await service.get_session(app_name=APP, user_id="ana", session_id="s1") is not None  # remembered
    async with db.unit_of_work() as uow:
        agent = await uow.agents.get_by_name(APP)
        assert agent is not None
        await uow.agents.delete(agent.id)
    assert await service.get_session(app_name=APP, user_id="ana", session_id="s1") is None
    with pytest.raises(NotFoundError):
        await service.create_session(app_name=APP, user_id="ana", session_id="s1")
    fresh = await service.create_session(app_name=APP, user_id="ana", session_id="s1")
    assert fresh.state == {}  # the app's state went with its agent


async def test_num_recent_events_and_after_timestamp_read_windows(db: Database) -> None:
    service = MemormSessionService(db)
    session = await service.create_session(app_name=APP, user_id="ana", session_id="s1")
    await service.append_events(session, [_event(text=str(i), timestamp=float(i)) for i in range(1, 6)])

    async def stamps(**config: Any) -> list[float]:
        got = await service.get_session(
            app_name=APP,
            user_id="ana",
            session_id="s1",
            config=GetSessionConfig(**config) if config else None,
        )
        assert got is not None
        return [event.timestamp for event in got.events]

    assert await stamps() == [1, 2, 3, 4, 5]
    assert await stamps(num_recent_events=0) == []
    assert await stamps(num_recent_events=3) == [3, 4, 5]
    assert await stamps(num_recent_events=50) == [1, 2, 3, 4, 5]
    assert await stamps(after_timestamp=4.0) == [4, 5]  # inclusive
    assert await stamps(after_timestamp=3.9999999) == [4, 5]
    assert await stamps(after_timestamp=4.0000001) == [5]  # finer than the column: the event decides
    assert await stamps(after_timestamp=50.0) == []
    assert await stamps(after_timestamp=4.0, num_recent_events=3) == [4, 5]
    assert await stamps(after_timestamp=2.0, num_recent_events=2) == [4, 5]
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        GetSessionConfig(num_recent_events=-1)
    with pytest.raises(ValidationError):
        await service.get_session(
            app_name=APP, user_id="ana", session_id="s1", config=GetSessionConfig(after_timestamp=math.inf)
        )


async def test_partial_events_are_returned_but_not_stored(db: Database) -> None:
    service = MemormSessionService(db)
    session = await service.create_session(app_name=APP, user_id="ana", session_id="s1")
    partial = _delta({"sk": 1}, partial=True)
    assert await service.append_event(session, partial) is partial
    assert session.events == []
    assert session.state == {}
    got = await service.get_session(app_name=APP, user_id="ana", session_id="s1")
    assert got is not None
    assert got.events == []
    assert got.state == {}
    assert await count_rows(db, "messages") == 0


async def test_last_update_time_is_the_newest_events_timestamp(db: Database) -> None:
    service = MemormSessionService(db)
    session = await service.create_session(app_name=APP, user_id="ana", session_id="s1")
    later = session.last_update_time + 10.123456
    await service.append_event(session, _event(timestamp=later))
    assert session.last_update_time == later
    got = await service.get_session(app_name=APP, user_id="ana", session_id="s1")
    assert got is not None
    assert got.last_update_time == later


async def test_an_append_to_a_stale_session_is_refused(db: Database) -> None:
    service = MemormSessionService(db)
    original = await service.create_session(app_name=APP, user_id="ana", session_id="s1")
    await service.append_event(original, _delta({"sk1": 1}, invocation_id="inv1"))
    current = await service.get_session(app_name=APP, user_id="ana", session_id="s1")
    assert current is not None
    await service.append_event(current, _delta({"sk2": 2}, invocation_id="inv2"))
    with pytest.raises(StaleSessionError, match="modified in storage"):
        await service.append_event(original, _delta({"sk3": 3}, invocation_id="inv3"))
    final = await service.get_session(app_name=APP, user_id="ana", session_id="s1")
    assert final is not None
    assert [e.invocation_id for e in final.events] == ["inv1", "inv2"]
    assert final.state == {"sk1": 1, "sk2": 2}

    # Of two copies of one revision appending at once, one wins; the other is stale.
    for round_ in range(3):
        latest = await service.get_session(app_name=APP, user_id="ana", session_id="s1")
        assert latest is not None
        copies = [latest.model_copy(deep=True) for _ in range(2)]
        results = await asyncio.gather(
            *(service.append_event(copy, _delta({f"r{round_}": i})) for i, copy in enumerate(copies)),
            return_exceptions=True,
        )
        assert sum(isinstance(result, SessionStaleError) for result in results) == 1
        assert sum(isinstance(result, Event) for result in results) == 1
    final = await service.get_session(app_name=APP, user_id="ana", session_id="s1")
    assert final is not None
    assert len(final.events) == 5


async def test_a_session_object_made_elsewhere_appends_while_it_is_current(db: Database) -> None:
    service = MemormSessionService(db)
    session = await service.create_session(app_name=APP, user_id="ana", session_id="s1")
    await service.append_event(session, _event(timestamp=session.last_update_time + 10))
    session._storage_update_marker = None  # as a session ADK's other services made
    session.last_update_time -= 0.0001
    await service.append_event(session, _event(invocation_id="inv2", timestamp=session.last_update_time + 20))
    stale = session.model_copy(update={"events": session.events[:1]})
    stale._storage_update_marker = None
    stale.last_update_time = 0.0
    with pytest.raises(SessionStaleError):
        await service.append_event(stale, _event(invocation_id="inv3"))


async def test_an_append_to_an_unknown_session_raises_not_found(db: Database) -> None:
    service = MemormSessionService(db)
    session = await service.create_session(app_name=APP, user_id="ana", session_id="s1")
    ghost = session.model_copy(update={"id": "never-made"})
    with pytest.raises(SessionMissingError, match="never-made"):
        await service.append_event(ghost, _event())
    elsewhere = session.model_copy(update={"app_name": "unknown-app"})
    with pytest.raises(NotFoundError):
        await service.append_event(elsewhere, _event())
    assert await count_rows(db, "messages") == 0


async def test_bad_input_raises_validation_error_before_any_statement(tmp_path: Any) -> None:
    # No database behind it: any statement would fail, so a ValidationError proves none ran.
    service = MemormSessionService(Database(f"sqlite+aiosqlite:///{tmp_path}/missing/dir/x.db"))
    for app, user in [("", "u"), ("a", ""), ("a\x00b", "u"), ("a", " "), (None, "u")]:
        with pytest.raises(ValidationError):
            await service.create_session(app_name=app, user_id=user)  # type: ignore[arg-type]
        with pytest.raises(ValidationError):
            await service.get_session(app_name=app, user_id=user, session_id="s")  # type: ignore[arg-type]
        with pytest.raises(ValidationError):
            await service.list_sessions(app_name=app, user_id=user)  # type: ignore[arg-type]
        with pytest.raises(ValidationError):
            await service.delete_session(app_name=app, user_id=user, session_id="s")  # type: ignore[arg-type]
        with pytest.raises(ValidationError):
            await service.get_user_state(app_name=app, user_id=user)  # type: ignore[arg-type]
    for sid in ["", "  ", "s\x00"]:
        with pytest.raises(ValidationError):
            await service.get_session(app_name="a", user_id="u", session_id=sid)
    with pytest.raises(ValidationError):
        await service.create_session(app_name="a", user_id="u", session_id="x" * 600)
    for state in [
        {"k": object()},
        {"k": math.nan},
        {"user:k": {1: "int key"}},
        {"app:k": "nul\x00"},
        {3: "v"},
    ]:
        with pytest.raises(ValidationError):
            await service.create_session(app_name="a", user_id="u", state=state)  # type: ignore[arg-type]
    service_session = Session(id="s", app_name="a", user_id="u")
    deltas: list[dict[str, Any]] = [{"k": object()}, {"k": math.inf}, {"user:k": b"bytes"}]
    for delta in deltas:
        with pytest.raises(ValidationError):
            await service.append_event(service_session, _delta(delta))
    with pytest.raises(ValidationError):
        await service.append_event(service_session.model_copy(update={"id": ""}), _event())
    with pytest.raises(ValidationError):
        await service.append_event(service_session, _event(timestamp=1e20))


async def test_append_events_stores_all_or_none(db: Database) -> None:
    service = MemormSessionService(db)
    session = await service.create_session(app_name=APP, user_id="ana", session_id="s1")
    with pytest.raises(ValidationError):
        await service.append_events(session, [_delta({"a": 1}), _delta({"b": object()})])
    got = await service.get_session(app_name=APP, user_id="ana", session_id="s1")
    assert got is not None
    assert got.events == []
    assert got.state == {}
    batch = [_delta({"a": 1}), _event(partial=True), _delta({"a": 2, "user:b": 3})]
    assert await service.append_events(got, batch) == batch
    assert [e.partial for e in got.events] == [None, None]
    assert got.state == {"a": 2, "user:b": 3}
    again = await service.get_session(app_name=APP, user_id="ana", session_id="s1")
    assert again == got


_KEYS = st.sampled_from(["app:a", "app:b", "user:a", "user:b", "a", "b", "temp:a"])
_VALUES = (
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.text("ab é", max_size=3)
    | st.lists(st.integers(0, 9), max_size=2)
)
_PAIRS = [("u1", "s1"), ("u1", "s2"), ("u2", "s1")]  # (user, session): one id of two users' too
_STEPS = st.lists(
    st.tuples(st.sampled_from(_PAIRS), st.dictionaries(_KEYS, _VALUES, max_size=3), st.booleans()),
    max_size=6,
)


@given(steps=_STEPS, recent=st.none() | st.integers(0, 4))
async def test_sessions_read_back_as_adks_in_memory_service_keeps_them(
    db: Database, steps: list[tuple[tuple[str, str], dict[str, Any], bool]], recent: int | None
) -> None:
    # ADK's own InMemorySessionService is the reference: the same calls give the same sessions.
    app = f"app-{uuid.uuid4()}"
    ours, reference = MemormSessionService(db), InMemorySessionService()
    sessions: dict[tuple[Any, str, str], Session] = {}
    for service in (ours, reference):
        for user, sid in _PAIRS:
            made = await service.create_session(app_name=app, user_id=user, session_id=sid, state={"k": sid})
            sessions[service, user, sid] = made
    for number, ((user, sid), delta, partial) in enumerate(steps):  # partial: returned, not stored
        for service in (ours, reference):
            event = _delta(dict(delta), id=f"e{number}", timestamp=1000.0 + number, partial=partial or None)
            await service.append_event(sessions[service, user, sid], event)
    config = GetSessionConfig(num_recent_events=recent)
    for user in ("u1", "u2"):
        assert await ours.get_user_state(app_name=app, user_id=user) == await reference.get_user_state(
            app_name=app, user_id=user
        )
    for user, sid in _PAIRS:
        got = await ours.get_session(app_name=app, user_id=user, session_id=sid, config=config)
        want = await reference.get_session(app_name=app, user_id=user, session_id=sid, config=config)
        assert got is not None
        assert want is not None
        assert got.state == want.state
        assert got.events == want.events
        if recent is None and want.events:  # both: the newest event's timestamp
            assert got.last_update_time == want.last_update_time
    listed = [(s.user_id, s.id, s.state) for s in (await ours.list_sessions(app_name=app)).sessions]
    expected = [(s.user_id, s.id, s.state) for s in (await reference.list_sessions(app_name=app)).sessions]
    assert sorted(listed, key=repr) == sorted(expected, key=repr)


# -- tenants, runs, concurrency -----------------------------------------------


async def test_tenants_never_see_each_others_sessions(db: Database) -> None:
    acme, globex = MemormSessionService(db.for_tenant("acme")), MemormSessionService(db.for_tenant("globex"))
    mine = await acme.create_session(
        app_name=APP, user_id="ana", session_id="s1", state={"app:plan": "gold", "user:n": 1}
    )
    await acme.append_event(mine, _event(text="acme secret"))
    assert await globex.get_session(app_name=APP, user_id="ana", session_id="s1") is None
    assert (await globex.list_sessions(app_name=APP)).sessions == []
    assert await globex.get_user_state(app_name=APP, user_id="ana") == {}
    theirs = await globex.create_session(
        app_name=APP, user_id="ana", session_id="s1"
    )  # the same ids: no conflict
    assert theirs.state == {}
    with pytest.raises(SessionNotFoundError):
        await globex.append_event(mine.model_copy(update={"id": "s2"}), _event())
    await globex.delete_session(app_name=APP, user_id="ana", session_id="s1")
    kept = await acme.get_session(app_name=APP, user_id="ana", session_id="s1")
    assert kept is not None
    assert [e.content.parts[0].text for e in kept.events if e.content and e.content.parts] == ["acme secret"]
    assert kept.state == {"app:plan": "gold", "user:n": 1}


class ScriptedLlm(BaseLlm):
    """A model that answers with the replies it was given, in order, and keeps the requests it saw."""

    model: str = "scripted"
    replies: list[LlmResponse] = Field(default_factory=list)
    requests: list[LlmRequest] = Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.requests.append(llm_request)
        yield self.replies.pop(0)


def _reply(*parts: types.Part) -> LlmResponse:
    return LlmResponse(content=types.Content(role="model", parts=list(parts)))


def weather(city: str) -> dict[str, str]:
    """The weather in a city."""
    return {"report": f"-3 °C in {city}"}


def _texts(request: LlmRequest) -> list[str]:
    return [part.text for content in request.contents for part in content.parts or [] if part.text]


async def test_a_runner_turn_is_stored_and_a_second_runner_reads_it_back(db: Database, store: Store) -> None:
    call = types.Part(function_call=types.FunctionCall(id="c1", name="weather", args={"city": "Oslo"}))
    model = ScriptedLlm(
        replies=[
            _reply(call),
            _reply(types.Part(text="It is -3 °C in Oslo.")),
            _reply(types.Part(text="Oslo.")),
        ]
    )
    agent = LlmAgent(name="forecaster", model=model, tools=[weather], output_key="last_answer")
    runner = Runner(app_name=APP, agent=agent, session_service=MemormSessionService(db))
    await runner.session_service.create_session(app_name=APP, user_id="ana", session_id="s1")
    question = types.Content(role="user", parts=[types.Part(text="Weather in Oslo?")])
    first = [e async for e in runner.run_async(user_id="ana", session_id="s1", new_message=question)]
    assert first[-1].content is not None
    assert first[-1].content.parts is not None
    assert first[-1].content.parts[0].text == "It is -3 °C in Oslo."

    again = store.database()
    try:
        later = Runner(app_name=APP, agent=agent, session_service=MemormSessionService(again))
        stored = await later.session_service.get_session(app_name=APP, user_id="ana", session_id="s1")
        assert stored is not None
        assert [e.id for e in stored.events] == [e.id for e in [stored.events[0], *first]]
        assert stored.state["last_answer"] == "It is -3 °C in Oslo."
        follow_up = types.Content(role="user", parts=[types.Part(text="Which city?")])
        second = [e async for e in later.run_async(user_id="ana", session_id="s1", new_message=follow_up)]
    finally:
        await again.dispose()
    assert second[-1].content is not None
    assert second[-1].content.parts is not None
    assert second[-1].content.parts[0].text == "Oslo."
    seen = _texts(model.requests[-1])  # the model saw the first turn, read from memorm
    assert seen[:2] == ["Weather in Oslo?", "It is -3 °C in Oslo."]
    assert seen[-1] == "Which city?"
    async with db.unit_of_work(read_only=True) as uow:
        app = await uow.agents.get_by_name(APP)
        assert app is not None
        found = await uow.messages.search(app.id, "Oslo", roles=["tool"])
    assert [m.tool_call_id for m in found.items] == ["c1"]


async def test_concurrent_appends_to_different_sessions_share_one_database(db: Database) -> None:
    service = MemormSessionService(db)
    sessions = [
        await service.create_session(app_name=APP, user_id=f"u{i % 2}", session_id=f"s{i}") for i in range(4)
    ]

    async def talk(index: int) -> None:
        for turn in range(3):
            await service.append_event(
                sessions[index],
                _delta(
                    {"turn": turn, "app:last": index, f"user:s{index}": turn}, invocation_id=f"{index}-{turn}"
                ),
            )

    await asyncio.gather(*(talk(i) for i in range(4)))
    for index in range(4):
        got = await service.get_session(app_name=APP, user_id=f"u{index % 2}", session_id=f"s{index}")
        assert got is not None
        assert [e.invocation_id for e in got.events] == [f"{index}-{turn}" for turn in range(3)]
        assert got.state["turn"] == 2
        assert got.state[f"user:s{index}"] == 2
    # Every user key of both users' sessions survived the concurrent read-modify-writes.
    assert await service.get_user_state(app_name=APP, user_id="u0") == {"s0": 2, "s2": 2}
    assert await service.get_user_state(app_name=APP, user_id="u1") == {"s1": 2, "s3": 2}


# -- cancellation and other loops ---------------------------------------------------


@pytest.mark.parametrize("how", ["wait_for", "task.cancel"])
async def test_a_cancelled_append_stores_the_event_and_its_state_whole_or_not_at_all(
    db: Database, how: str
) -> None:
    service = MemormSessionService(db)
    await service.create_session(app_name=APP, user_id="ana", session_id="s")
    cut = 0
    for n in range(12):
        session = await service.get_session(app_name=APP, user_id="ana", session_id="s")
        assert session is not None
        # Whole or nothing: each stored event carried the delta that set `n` to its index.
        assert session.state.get("n", -1) == len(session.events) - 1
        append = service.append_event(session, _delta({"n": len(session.events)}, invocation_id=f"i{n}"))
        try:
            if how == "wait_for":
                await asyncio.wait_for(append, timeout=0.0005 * n)
            else:
                task = asyncio.ensure_future(append)
                for _ in range(n):
                    await asyncio.sleep(0)
                task.cancel()
                await task
        except (asyncio.TimeoutError, asyncio.CancelledError):
            cut += 1
    assert cut > 0  # some appends were cut short
    session = await service.get_session(app_name=APP, user_id="ana", session_id="s")
    assert session is not None
    assert session.state.get("n", -1) == len(session.events) - 1
    await service.append_event(session, _delta({"n": len(session.events)}, invocation_id="after"))
    again = await service.get_session(app_name=APP, user_id="ana", session_id="s")
    assert again is not None
    assert again.events[-1].invocation_id == "after"


async def test_a_service_is_shared_with_a_second_event_loop_in_a_thread(db: Database) -> None:
    service = MemormSessionService(db)
    session = await service.create_session(app_name=APP, user_id="ana", session_id="s")
    await service.append_event(session, _delta({"from": "main"}, invocation_id="main"))

    async def elsewhere() -> list[str]:
        there = await service.get_session(app_name=APP, user_id="ana", session_id="s")
        assert there is not None
        await service.append_event(there, _delta({"from": "thread"}, invocation_id="thread"))
        return [event.invocation_id for event in there.events]

    seen = await anyio.to_thread.run_sync(lambda: asyncio.run(elsewhere()))
    assert seen == ["main", "thread"]
    back = await service.get_session(app_name=APP, user_id="ana", session_id="s")
    assert back is not None
    assert [event.invocation_id for event in back.events] == ["main", "thread"]
    assert back.state["from"] == "thread"
