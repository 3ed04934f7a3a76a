"""Where the SDK's sessions live in a test: one memorm ``Database`` on SQLite or Postgres, and an agent.

The SDK's tests construct ``SQLiteSession(session_id, db_path)`` or
``SQLAlchemySession.from_url(session_id, url=...)``; here those names make
a :class:`MemormSession` on the test's ``Database`` (``sessions.py``), keyed
by the SDK's ``session_id``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from conftest import Store

from memorm import Database


@dataclass
class Backend:
    """One test's memorm database (SQLite or Postgres) and the agent that owns its sessions."""

    store: Store
    db: Database
    agent_id: uuid.UUID
    clones: list[Database] = field(default_factory=list)  # the databases of `from_url` sessions

    @property
    def engine(self) -> str:
        return self.store.engine
