"""memorm's side of the chat path: the calls the chat benchmarks time against the raw driver.

Each call is one unit of work, as an application makes it; the raw side of
the same work is :mod:`benchmarks.raw.chat`.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from benchmarks.chat_data import SYSTEM, make_messages
from memorm import Database, Message

__all__ = [
    "Operation",
    "chat_operations",
    "fill_session",
    "memorm_append",
    "memorm_context",
    "memorm_window",
    "new_session",
    "reading",
]


async def memorm_append(db: Database, session_id: uuid.UUID, messages: Any) -> None:
    async with db.unit_of_work() as uow:
        await uow.messages.append(session_id, messages)


Operation = Callable[[Database], Awaitable[Any]]


async def reading(db: Database, work: Callable[[Any], Awaitable[Any]]) -> Any:
    """`work(uow)` in a read-only unit of work of `db`."""
    async with db.unit_of_work(read_only=True) as uow:
        return await work(uow)


def chat_operations(agent: uuid.UUID, chat: uuid.UUID, query: list[float]) -> dict[str, Operation]:
    """The chat path and searches of one agent, by name: what comparisons of two databases time."""

    async def append(db: Database) -> None:
        async with db.unit_of_work() as uow:
            await uow.messages.append(chat, {"role": "user", "content": "one more common message"})

    return {
        "append one message (uow)": append,
        "window 50 (read-only uow)": lambda db: reading(db, lambda u: u.messages.window(chat, limit=50)),
        "context 2,000 tokens": lambda db: reading(db, lambda u: u.messages.context(chat, max_tokens=2_000)),
        "text search, common word": lambda db: reading(db, lambda u: u.messages.search(agent, "common")),
        "vector search k=10 (exact)": lambda db: reading(db, lambda u: u.passages.search(agent, query, k=10)),
    }


async def memorm_window(db: Database, session_id: uuid.UUID, limit: int) -> list[Message]:
    async with db.unit_of_work(read_only=True) as uow:
        return await uow.messages.window(session_id, limit=limit)


async def memorm_context(db: Database, session_id: uuid.UUID, max_tokens: int) -> list[Message]:
    async with db.unit_of_work(read_only=True) as uow:
        return await uow.messages.context(session_id, max_tokens=max_tokens)


async def new_session(db: Database, agent_id: uuid.UUID) -> uuid.UUID:
    async with db.unit_of_work() as uow:
        return (await uow.sessions.create(agent_id)).id


async def fill_session(db: Database, session_id: uuid.UUID, count: int, batch: int = 10_000) -> None:
    """``count`` messages: the system message, then the benchmark chat."""
    await memorm_append(db, session_id, SYSTEM)
    for start in range(0, count - 1, batch):
        await memorm_append(db, session_id, make_messages(min(batch, count - 1 - start), start))
