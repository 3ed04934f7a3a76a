"""`MemormChatMessageHistory`: LangChain's chat history over memorm's sessions and messages."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import BaseMessage

from memorm.compat._sync import BRIDGE
from memorm.compat.langchain.messages import from_langchain, to_langchain
from memorm.db import Database
from memorm.errors import NotFoundError, ValidationError
from memorm.models import Agent, Message
from memorm.uow import UnitOfWork
from memorm.validation import MAX_COUNT, as_uuid, check_duration, check_int, check_list, check_name

__all__ = ["PAGE", "MemormChatMessageHistory"]

PAGE = 1000  # rows per read: memorm's largest page
_BEFORE_ALL = -(2**31) - 1  # a seq below every message's (seq is a 32-bit integer)
_NAME = "MemormChatMessageHistory"  # as errors of its sync methods name it


class MemormChatMessageHistory(BaseChatMessageHistory):
    """LangChain chat history stored in a memorm session.

    LangChain deprecated `BaseChatMessageHistory` (langchain-core 1.6.4, to
    be removed in 2.0) in favour of LangGraph's persistence (checkpointers and
    stores); new code should use those.  This adapter keeps code still on
    `BaseChatMessageHistory` (`RunnableWithMessageHistory`, the legacy
    memory classes) correct.

    Args:
        db: the shared [`Database`][memorm.db.Database].
        session_key: any non-empty string (LangChain's `session_id`); it names
            the agent's memorm session through
            `uow.sessions.get_or_create(agent, session_key)`, created by the
            first write.  Reads and clears of an unknown key create nothing.
        agent: the agent (id or [`Agent`][memorm.models.Agent]) the session belongs to.
        window: read only the newest `window` messages (`messages` and
            `aget_messages`), so a long history is never loaded whole.  A
            window can begin with a tool answer whose call fell outside it.
            Without it, the whole history is read, in pages of 1,000.
        ttl: like a Redis chat history's `ttl`, a `timedelta` or seconds:
            every write moves the session's expiry to `ttl` from then, so a
            session idle that long is deleted by the next
            `purge_expired` (see docs/retention.md).  Without it, the
            session expires as the agent's `retention` says, if at all.

    Every LangChain message type round-trips to an equal object (see
    `from_langchain`); `additional_kwargs`, `response_metadata`,
    `artifact` and tool-call arguments must be JSON.  Async methods use
    `db` on your event loop; sync ones use memorm's sync loop (see
    `memorm.compat.langchain`).

    Example:
        ```python
        history = MemormChatMessageHistory(db, "user-42", agent=agent.id, window=50)
        await history.aadd_messages([HumanMessage("hi"), AIMessage("hello!")])
        recent = await history.aget_messages()
        ```
    """

    def __init__(
        self,
        db: Database,
        session_key: str,
        *,
        agent: uuid.UUID | str | Agent,
        window: int | None = None,
        ttl: timedelta | float | None = None,
    ) -> None:
        super().__init__()
        key = check_name(session_key, "session_key", blank=True)
        self.db = db
        self.session_key = key
        self.agent_id = as_uuid(agent.id if isinstance(agent, Agent) else agent, "agent")
        self.window = None if window is None else check_int(window, "window", minimum=1, maximum=MAX_COUNT)
        self.ttl = None if ttl is None else check_duration(ttl, "ttl")
        self._session_id: uuid.UUID | None = None  # set once the session is known to exist

    def __repr__(self) -> str:
        return f"MemormChatMessageHistory(session_key={self.session_key!r}, agent={self.agent_id})"

    # -- async ------------------------------------------------------------

    async def aget_messages(self) -> list[BaseMessage]:
        """The session's messages, oldest first (the newest `window`, if set)."""
        return await self._read(self.db)

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append the messages in one unit of work (creating the session on first use)."""
        await self._append(self.db, _rows(messages))

    async def aclear(self) -> None:
        """Delete the session's messages (the session itself stays, under its key)."""
        await self._clear(self.db)

    # -- sync -------------------------------------------------------------

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]  # LangChain declares a plain attribute
        """The session's messages, oldest first (the newest `window`, if set)."""
        return BRIDGE.run(
            self.db, self._read, call=f"{_NAME}.messages", instead=f"Await {_NAME}.aget_messages()"
        )

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append the messages in one unit of work (creating the session on first use)."""
        rows = _rows(messages)
        BRIDGE.run(
            self.db,
            lambda db: self._append(db, rows),
            call=f"{_NAME}.add_messages()",
            instead=f"Await {_NAME}.aadd_messages()",
        )

    def clear(self) -> None:
        """Delete the session's messages (the session itself stays, under its key)."""
        BRIDGE.run(self.db, self._clear, call=f"{_NAME}.clear()", instead=f"Await {_NAME}.aclear()")

    # -- the work, on whichever Database the caller's loop may use ----------

    async def _read(self, db: Database) -> list[BaseMessage]:
        async with db.unit_of_work(read_only=True) as uow:
            session_id = await self._existing(uow)
            if session_id is None:
                return []
            try:
                if self.window is not None:
                    rows = await _newest(uow, session_id, self.window)
                else:
                    rows = await _everything(uow, session_id)
            except NotFoundError:  # the session was deleted since we looked it up
                self._session_id = None
                return []
        return [to_langchain(row) for row in rows]

    async def _append(self, db: Database, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        for cached in (self._session_id, None):
            try:
                async with db.unit_of_work() as uow:
                    session_id = cached
                    if session_id is None:
                        session_id = (await uow.sessions.get_or_create(self.agent_id, self.session_key)).id
                    await uow.messages.append(session_id, rows)
                    if self.ttl is not None:
                        await uow.sessions.touch(session_id, ttl=self.ttl)
            except NotFoundError:
                if cached is None:
                    raise  # the agent is gone (or the new session vanished at once)
                continue  # the cached session was deleted meanwhile: find or create it again
            self._session_id = session_id  # only once committed: a rolled-back session never existed
            return

    async def _clear(self, db: Database) -> None:
        async with db.unit_of_work() as uow:
            for _ in range(2):  # a second look if the cached session was deleted meanwhile
                session_id = await self._existing(uow)
                if session_id is None:
                    return
                try:
                    # Locks the session, so a concurrent append or prepend lands before or after.
                    await uow.messages.clear(session_id)
                    return
                except NotFoundError:
                    self._session_id = None  # look the key up again: it may name a new session

    async def _existing(self, uow: UnitOfWork) -> uuid.UUID | None:
        if self._session_id is None:
            found = await uow.sessions.get_by_key(self.agent_id, self.session_key)
            if found is not None:
                self._session_id = found.id
        return self._session_id


def _rows(messages: object) -> list[dict[str, Any]]:
    """The memorm rows storing LangChain messages (anything else is a `ValidationError`)."""
    rows = []
    for index, message in enumerate(check_list(messages, "messages", "LangChain messages")):
        if not isinstance(message, BaseMessage):
            raise ValidationError(
                f"messages[{index}]: expected a LangChain message, got {type(message).__name__}"
            )
        rows.append(from_langchain(message))
    return rows


async def _newest(uow: UnitOfWork, session_id: uuid.UUID, count: int) -> list[Message]:
    """The newest `count` messages, oldest first, paging back 1,000 at a time."""
    pages: list[list[Message]] = []
    wanted, before = count, None
    while wanted > 0:
        limit = min(wanted, PAGE)
        page = await uow.messages.window(session_id, limit=limit, before_seq=before)
        pages.append(page)
        wanted -= len(page)
        if len(page) < limit:
            break  # the start of the history
        before = page[0].seq
    return [row for page in reversed(pages) for row in page]


async def _everything(uow: UnitOfWork, session_id: uuid.UUID) -> list[Message]:
    """Every message, oldest first, paging forward 1,000 at a time."""
    rows: list[Message] = []
    after = _BEFORE_ALL
    while True:
        page = await uow.messages.window(session_id, limit=PAGE, after_seq=after)
        rows.extend(page)
        if len(page) < PAGE:
            return rows
        after = page[-1].seq
