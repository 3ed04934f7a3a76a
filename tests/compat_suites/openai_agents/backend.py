"""The one thing the vendored tests change: where their sessions come from.

The SDK's tests construct ``SQLiteSession(session_id, db_path)`` or
``SQLAlchemySession.from_url(session_id, url=...)``; here they call
``backend.session(session_id)``, a :class:`MemormSession` on one memorm
``Database`` whose key is the SDK's ``session_id``.  The few tests that
looked inside the SDK's sessions (their sqlite3 connections, write locks,
tables) look at memorm's equivalents through the probes below instead.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import aiosqlite
import asyncpg
import sqlalchemy as sa
from agents.memory import SessionSettings
from conftest import Store, asyncpg_dsn
from probes import open_connections, postgres_backends
from sqlalchemy.engine import make_url

from memorm import Database
from memorm.compat.openai_agents import ITEM_KEY, MemormSession
from memorm.models import MESSAGES


@dataclass
class Backend:
    """One test's memorm database (SQLite or Postgres) and the agent that owns its sessions."""

    store: Store
    db: Database
    agent_id: uuid.UUID
    application: str  # the Postgres application_name of ``db``'s connections
    elsewhere: int = 0  # SQLite: connections the process had open before this test (other tests' leftovers)

    @property
    def engine(self) -> str:
        return self.store.engine

    def session(
        self,
        session_id: str,
        *,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        db: Database | None = None,
    ) -> MemormSession:
        """The SDK test's session: the memorm session keyed ``session_id`` (on ``db``, else the test's)."""
        return MemormSession(
            session_id, self.db if db is None else db, agent=self.agent_id, session_settings=session_settings
        )

    async def open_connections(self, *, settled: int | None = None) -> int:
        """The test's connections open to the store (see :func:`probes.open_connections`)."""
        wanted = None if settled is None else settled + self.elsewhere
        return await open_connections(self.store, self.application, settled=wanted) - self.elsewhere

    async def write_lock_is_free(self) -> bool:
        """Whether no connection of ``db`` is inside a transaction (SQLite: another writer can begin)."""
        if self.engine == "postgres":
            return await postgres_backends(self.application, busy=True) == 0
        probe = sqlite3.connect(self._sqlite_path(), timeout=0, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            probe.close()

    async def stored_sessions(self, session_id: str) -> int:
        """How many memorm sessions (0 or 1) the agent has under the key ``session_id``."""
        async with self.db.unit_of_work(read_only=True) as uow:
            return int(await uow.sessions.get_by_key(self.agent_id, session_id) is not None)

    async def set_created_at(self, session_id: str, when: dict[str, datetime]) -> None:
        """Set ``created_at`` of the session's messages, by the ``id`` of the item each stores."""
        async with self.db.unit_of_work() as uow:
            chat = await uow.sessions.get_by_key(self.agent_id, session_id)
            assert chat is not None
            rows = await uow.messages.window(chat.id, limit=len(when) + 100)
            for row in rows:
                item_id = row.meta[ITEM_KEY].get("id")
                if item_id in when:
                    await uow.session.execute(
                        sa.update(MESSAGES).where(MESSAGES.c.id == row.id).values(created_at=when[item_id])
                    )

    async def drop_table(self, table: str) -> None:
        """Drop one of memorm's tables from outside memorm, so that later statements fail."""
        async with self.raw_connection() as connection:
            await connection.execute(
                f"DROP TABLE {table}" + (" CASCADE" if self.engine == "postgres" else "")
            )

    @asynccontextmanager
    async def raw_connection(self) -> AsyncIterator[RawConnection]:
        """A driver connection to the store that memorm knows nothing of."""
        if self.engine == "postgres":
            connection = await asyncpg.connect(
                asyncpg_dsn(), server_settings={"search_path": f"{self.store.schema},public"}
            )
            try:
                yield RawConnection(connection.execute, ["LOCK TABLE sessions, messages IN EXCLUSIVE MODE"])
            finally:
                await connection.close()
            return
        async with aiosqlite.connect(self._sqlite_path(), isolation_level=None) as lite:
            yield RawConnection(lite.execute, [])

    def _sqlite_path(self) -> str:
        path = make_url(self.store.url).database
        assert path is not None
        return path


@dataclass
class RawConnection:
    """Statements on a connection outside memorm, and the write lock SQLite's ``BEGIN IMMEDIATE`` takes."""

    _execute: Any
    _lock: list[str]

    async def execute(self, statement: str) -> None:
        await self._execute(statement)

    async def take_write_lock(self) -> None:
        """Begin a transaction that blocks memorm's writers until :meth:`rollback`."""
        await self._execute("BEGIN IMMEDIATE" if not self._lock else "BEGIN")
        for statement in self._lock:  # Postgres: every write to a session or message waits
            await self._execute(statement)

    async def rollback(self) -> None:
        await self._execute("ROLLBACK")
