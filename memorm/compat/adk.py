"""Google ADK's session service, stored by memorm (extra `adk`).

[`MemormSessionService`][memorm.compat.adk.MemormSessionService] is an ADK
`BaseSessionService`, so a `Runner`'s sessions, events and state live in
memorm's tables, with memorm's migrations:

```python
from google.adk.runners import Runner
from memorm.compat.adk import MemormSessionService

runner = Runner(app_name="travel", agent=agent, session_service=MemormSessionService(db))
```

| ADK                         | memorm                                                    |
|-----------------------------|-----------------------------------------------------------|
| app `app_name`              | the [`Agent`][memorm.models.Agent] named `app_name`       |
| session (user, session id)  | a [`Session`][memorm.models.Session] of it, `key` `["user","id"]` |
| event                       | a [`Message`][memorm.models.Message], event in `meta["adk_event"]` |
| app state (`app:` keys)     | store item `("adk.app", "state")` of the agent            |
| user state (`user:` keys)   | store item `("adk.user", user_id)`                        |
| session state, update time  | store item `("adk.session", key)`                         |

Store items are the agent's long-term store (`uow.graph_store`, the rows
LangGraph's `MemormStore` uses), under namespaces of their own.  `temp:`
keys are never stored.  Every call is one unit of work; histories are read
in windows, never whole unless asked for.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

from memorm.compat._extras import missing_extra

try:
    from google.adk.events.event import Event
    from google.adk.platform import time as platform_time
    from google.adk.platform import uuid as platform_uuid
    from google.adk.sessions import _session_util
    from google.adk.sessions.base_session_service import (
        BaseSessionService,
        GetSessionConfig,
        ListSessionsResponse,
    )
    from google.adk.sessions.session import Session
    from google.adk.sessions.state import State
except ImportError as error:
    raise missing_extra(__name__, "adk", error) from error

from memorm.compat.adk_events import (
    SessionExistsError,
    SessionMissingError,
    SessionStaleError,
    chat_id,
    check_fresh,
    check_id,
    check_state,
    event_to_message,
    message_to_event,
    newest,
    session_key,
    since_time,
    to_instant,
)
from memorm.db import Database
from memorm.errors import ConflictError, NotFoundError
from memorm.models import Message
from memorm.repositories.store_items import NewItem, StoredItem
from memorm.types import utcnow
from memorm.uow import UnitOfWork
from memorm.validation import MAX_PAGE

__all__ = [
    "APP_STATE",
    "SESSIONS",
    "USERS",
    "MemormSessionService",
    "SessionExistsError",
    "SessionMissingError",
    "SessionStaleError",
]

APP_STATE = ("adk.app", "state")
"""The store item (namespace, key) holding an app's state."""
USERS = "adk.user"
"""The store namespace of user state (key: the user id)."""
SESSIONS = "adk.session"
"""The store namespace of session state (key: the memorm session's key)."""


def _merge(app: dict[str, Any], user: dict[str, Any], session: dict[str, Any]) -> dict[str, Any]:
    merged = dict(session)
    merged.update({State.APP_PREFIX + key: value for key, value in app.items()})
    merged.update({State.USER_PREFIX + key: value for key, value in user.items()})
    return merged


def _value(found: dict[tuple[str, str], StoredItem], key: tuple[str, str]) -> dict[str, Any]:
    item = found.get(key)
    return {} if item is None else dict(item.value)


def _session(app_name: str, value: dict[str, Any], state: dict[str, Any], events: list[Event]) -> Session:
    session = Session(
        id=value["session_id"],
        app_name=app_name,
        user_id=value["user_id"],
        state=state,
        events=events,
        last_update_time=value["update_time"],
    )
    session._storage_update_marker = str(value["revision"])
    return session


class MemormSessionService(BaseSessionService):
    """ADK's `BaseSessionService` over a memorm [`Database`][memorm.db.Database].

    Args:
        db: the shared database, or a tenant's view of it
            (`db.for_tenant("acme")`): each tenant has its own apps,
            sessions and state.

    Bad input (blank or NUL-holding ids, state values that are not JSON)
    raises `memorm.ValidationError` before any statement.  A duplicate
    `session_id` raises `SessionExistsError`, an append to an unknown
    session `SessionMissingError`, an append with an outdated session object
    `SessionStaleError`: memorm errors that are ADK's `AlreadyExistsError`,
    `SessionNotFoundError` and `StaleSessionError` too.

    Example:
        ```python
        service = MemormSessionService(db)
        session = await service.create_session(app_name="travel", user_id="ana")
        await service.append_event(session, event)
        ```
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        self._agents: dict[str, uuid.UUID] = {}  # app name -> agent id, once found or made

    def __repr__(self) -> str:
        return f"MemormSessionService({self.db!r})"

    async def _app(self, uow: UnitOfWork, app_name: str, *, make: bool = False) -> uuid.UUID | None:
        """The id of the app's agent; made (with its empty app state) if missing and `make`."""
        known = self._agents.get(app_name)
        if known is not None:
            return known
        agent = await uow.agents.get_by_name(app_name)
        if agent is None and make:
            try:
                made = await uow.agents.create(app_name, meta={"adk_app": app_name})
                await uow.graph_store.put(made.id, [NewItem(*APP_STATE, {}, None)], now=utcnow())
                return made.id  # remembered once found committed: this unit of work may yet roll back
            except ConflictError:  # made meanwhile by another unit of work
                agent = await uow.agents.get_by_name(app_name)
        if agent is None:
            return None
        self._agents[app_name] = agent.id
        return agent.id

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        """A new session of the user in the app, with `state` split into app, user and session state.

        Without `session_id` (or with a blank one), a new UUID names it; a
        given one is stripped of surrounding blanks, as ADK's services do.
        """
        app, user = check_id(app_name, "app_name"), check_id(user_id, "user_id")
        wanted = session_id.strip() if isinstance(session_id, str) else session_id
        sid = check_id(wanted, "session_id") if wanted else platform_uuid.new_uuid()
        key = session_key(user, sid)
        check_state(state or {}, "state")
        deltas = _session_util.extract_state_delta(dict(state or {}))
        now = platform_time.get_time()
        users = (USERS, user)
        async with self.db.unit_of_work() as uow:
            agent = await self._app(uow, app, make=True)
            assert agent is not None
            try:
                chat = await uow.sessions.create(
                    agent, title=sid, key=key, meta={"adk": {"user_id": user, "session_id": sid}}
                )
            except ConflictError:
                raise SessionExistsError(f"Session with id {sid} already exists.") from None
            except NotFoundError:  # the app's agent, remembered, was deleted: the next call looks again
                self._agents.pop(app, None)
                raise
            # Shared state is read, merged and written back under its rows' locks (Postgres).
            await uow.graph_store.lock(agent, [APP_STATE, users])
            found = await uow.graph_store.get(agent, [APP_STATE, users], now=utcnow())
            app_state, user_state = _value(found, APP_STATE), _value(found, users)
            app_state.update(deltas["app"])
            user_state.update(deltas["user"])
            value = {
                "user_id": user,
                "session_id": sid,
                "chat": str(chat.id),
                "state": deltas["session"],
                "update_time": now,
                "revision": 0,
            }
            items = [NewItem(SESSIONS, key, value, None)]
            if deltas["app"] or APP_STATE not in found:
                items.append(NewItem(*APP_STATE, app_state, None))
            if deltas["user"] or users not in found:
                items.append(NewItem(*users, user_state, None))
            await uow.graph_store.put(agent, items, now=utcnow(), locked=True)
        return _session(app, value, _merge(app_state, user_state, deltas["session"]), [])

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        """The session with its merged state and its events (those `config` asks for), or None.

        Events come in the order they were appended.  `num_recent_events`
        reads only that many; `after_timestamp` keeps the events at or after
        it (their `timestamp`, read from the database's index on it).
        """
        app, user = check_id(app_name, "app_name"), check_id(user_id, "user_id")
        sid = check_id(session_id.strip() if isinstance(session_id, str) else session_id, "session_id")
        key = session_key(user, sid)
        wanted = None if config is None else config.num_recent_events
        after = None if config is None else config.after_timestamp
        if after is not None:
            to_instant(after, "config.after_timestamp")
        keys = [APP_STATE, (USERS, user), (SESSIONS, key)]
        async with self.db.unit_of_work(read_only=True) as uow:
            agent = await self._app(uow, app)
            if agent is None:
                return None
            found = await uow.graph_store.get(agent, keys, now=utcnow())
            if (SESSIONS, key) not in found:
                return None
            value = _value(found, (SESSIONS, key))
            chat = chat_id(value["chat"])
            try:
                if wanted == 0:
                    messages: list[Message] = []
                elif after is None:
                    messages = await newest(uow, chat, wanted)
                else:
                    messages = await since_time(uow, agent, chat, after, wanted)
            except NotFoundError:  # its memorm session deleted by other code (a purge): no session
                return None
        state = _merge(_value(found, APP_STATE), _value(found, (USERS, user)), value["state"])
        return _session(app, value, state, [message_to_event(message) for message in messages])

    async def list_sessions(self, *, app_name: str, user_id: str | None = None) -> ListSessionsResponse:
        """The app's sessions (the user's, or every user's), without events, least recently updated first."""
        app = check_id(app_name, "app_name")
        user = None if user_id is None else check_id(user_id, "user_id")
        where = None if user is None else {"user_id": user}
        values: list[dict[str, Any]] = []
        async with self.db.unit_of_work(read_only=True) as uow:
            agent = await self._app(uow, app)
            if agent is None:
                return ListSessionsResponse()
            now = utcnow()
            while True:  # every session: ADK's contract has no pages
                page = await uow.graph_store.search(
                    agent, SESSIONS, where=where, now=now, limit=MAX_PAGE, offset=len(values)
                )
                values += [dict(item.value) for item in page]
                if len(page) < MAX_PAGE:
                    break
            users = sorted({value["user_id"] for value in values})
            found = await uow.graph_store.get(agent, [APP_STATE, *((USERS, name) for name in users)], now=now)
        app_state = _value(found, APP_STATE)
        sessions = [
            _session(
                app, value, _merge(app_state, _value(found, (USERS, value["user_id"])), value["state"]), []
            )
            for value in values
        ]
        sessions.sort(key=lambda session: (session.last_update_time, session.user_id, session.id))
        return ListSessionsResponse(sessions=sessions)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Delete the session and its events (nothing happens if there is none)."""
        app, user = check_id(app_name, "app_name"), check_id(user_id, "user_id")
        sid = check_id(session_id.strip() if isinstance(session_id, str) else session_id, "session_id")
        item = (SESSIONS, session_key(user, sid))
        async with self.db.unit_of_work() as uow:
            agent = await self._app(uow, app)
            if agent is None:
                return
            found = await uow.graph_store.get(agent, [item], now=utcnow())
            if item not in found:
                return
            await uow.graph_store.delete(agent, [item])
            with contextlib.suppress(NotFoundError):  # deleted by other code: its item is gone now too
                await uow.sessions.delete(chat_id(found[item].value["chat"]))

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The user's state in the app, keys without their `user:` prefix (`{}` when there is none)."""
        app, user = check_id(app_name, "app_name"), check_id(user_id, "user_id")
        async with self.db.unit_of_work(read_only=True) as uow:
            agent = await self._app(uow, app)
            if agent is None:
                return {}
            found = await uow.graph_store.get(agent, [(USERS, user)], now=utcnow())
        return _value(found, (USERS, user))

    async def append_event(self, session: Session, event: Event) -> Event:
        """Store the event and apply its state delta; partial events are returned, not stored."""
        return (await self.append_events(session, [event]))[0]

    async def append_events(self, session: Session, events: list[Event]) -> list[Event]:
        """Store the events in order, all or none, in one unit of work (see `append_event`)."""
        app, user = (
            check_id(session.app_name, "session.app_name"),
            check_id(session.user_id, "session.user_id"),
        )
        key = session_key(user, check_id(session.id, "session.id"))
        kept: list[Event] = []
        for event in events:
            if not event.partial:
                self._apply_temp_state(session, event)  # as ADK's services: the invocation still sees it
                kept.append(self._trim_temp_delta_state(event))
        if not kept:
            return list(events)
        messages = [event_to_message(event) for event in kept]
        deltas = _session_util.extract_state_delta(
            {name: value for event in kept for name, value in event.actions.state_delta.items()}
        )
        users = (USERS, user)
        keys = [(SESSIONS, key)]
        keys += [APP_STATE] if deltas["app"] else []
        keys += [users] if deltas["user"] else []
        async with self.db.unit_of_work() as uow:
            agent = await self._app(uow, app)
            if agent is None:
                raise SessionMissingError(f"Session {session.id} not found.")
            await uow.graph_store.lock(agent, keys)  # appends to one session wait for each other here
            found = await uow.graph_store.get(agent, keys, now=utcnow())
            if (SESSIONS, key) not in found:
                raise SessionMissingError(f"Session {session.id} not found.")
            value = _value(found, (SESSIONS, key))
            chat = chat_id(value["chat"])
            await check_fresh(uow, chat, session, value)
            try:
                await uow.messages.append(chat, messages)
            except NotFoundError:  # its memorm session deleted by other code (a purge)
                raise SessionMissingError(f"Session {session.id} not found.") from None
            value.update(
                state={**value["state"], **deltas["session"]},
                update_time=kept[-1].timestamp,
                revision=value["revision"] + 1,
            )
            items = [NewItem(SESSIONS, key, value, None)]
            if deltas["app"]:
                items.append(NewItem(*APP_STATE, {**_value(found, APP_STATE), **deltas["app"]}, None))
            if deltas["user"]:
                items.append(NewItem(*users, {**_value(found, users), **deltas["user"]}, None))
            await uow.graph_store.put(agent, items, now=utcnow(), locked=True)
        session.last_update_time = value["update_time"]
        session._storage_update_marker = str(value["revision"])
        for event in kept:
            self._commit_event_to_session(session, event)
        return list(events)
