"""The raw side behind a transaction pooler (PgBouncer): asyncpg sending what memorm sends there.

Unnamed statements only (``statement_cache_size=0``), the statements of
:mod:`benchmarks.raw.chat` and :mod:`benchmarks.raw.passages`: an append in a
transaction, a window or context alone, a vector search in a read-only
transaction whose ``BEGIN`` carries the ``SET LOCAL``s memorm sends, in one
message.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import asyncpg

from benchmarks.raw import passages
from benchmarks.raw.chat import RawPostgres
from benchmarks.raw.encoding import TENANT, UTC
from memorm.types.search_words import register_tsvector

__all__ = ["BEGIN_SEARCH", "BEGIN_WRITE", "Call", "RawPooled"]

MESSAGE = {"role": "user", "content": "one more common message"}  # what chat_operations appends
# What memorm sends with transaction_pooling=True: a writer's BEGIN, and a vector search's (with
# its settings, in one message, in a read-only unit of work).  The raw side sends the same.
BEGIN_WRITE = "BEGIN ISOLATION LEVEL READ COMMITTED"
BEGIN_SEARCH = (
    "BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY; "
    "SET LOCAL hnsw.ef_search = 40; SET LOCAL hnsw.iterative_scan = strict_order"
)

Call = Callable[[], Awaitable[Any]]


class RawPooled:
    """Raw asyncpg behind a transaction pooler, sending what memorm sends there."""

    def __init__(self, connection: asyncpg.Connection, dim: int) -> None:
        self.connection = connection
        self.chat = RawPostgres(connection)
        # The nearest-neighbour search at `dim`, filtered by tenant.
        self.passages = passages.RawPostgres(connection, dim, tenant=TENANT)

    @classmethod
    async def open(cls, dsn: str, dim: int) -> RawPooled:
        from pgvector.asyncpg import register_vector

        # Unnamed statements only: a named one stays on a server connection the next
        # transaction may not get.
        connection = await asyncpg.connect(dsn, statement_cache_size=0)
        await register_tsvector(connection)
        await register_vector(connection)
        return cls(connection, dim)

    @asynccontextmanager
    async def transaction(self, begin: str) -> AsyncIterator[None]:
        await self.connection.execute(begin)
        try:
            yield
        except BaseException:
            await self.connection.execute("ROLLBACK")
            raise
        await self.connection.execute("COMMIT")

    async def append(self, session_id: uuid.UUID, message: dict[str, Any]) -> None:
        """`RawPostgres.append_one` in this transaction (its own would send a BEGIN of its own)."""
        connection, now = self.connection, datetime.now(UTC)
        async with self.transaction(BEGIN_WRITE):
            agent_id, end = await connection.fetchrow(RawPostgres.ALLOCATE, 1, now, TENANT, session_id)
            (record,) = RawPostgres._records((message,), session_id, agent_id, end - 1, now)
            await connection.execute(RawPostgres.INSERT, *record)

    async def search(self, agent: uuid.UUID, query: list[float]) -> Any:
        async with self.transaction(BEGIN_SEARCH):
            return await self.passages.search(agent, query, passages.K)

    def operations(self, agent: uuid.UUID, chat: uuid.UUID, query: list[float]) -> dict[str, Call]:
        """The raw side of each case, by `chat_operations`' names."""
        return {
            "append one message (uow)": lambda: self.append(chat, MESSAGE),
            "window 50 (read-only uow)": lambda: self.chat.window(chat, 50),
            "context 2,000 tokens": lambda: self.chat.context(chat, 2_000),
            "vector search k=10 (exact)": lambda: self.search(agent, query),
        }

    async def close(self) -> None:
        await self.connection.close()
