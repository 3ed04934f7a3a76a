"""What the SDK's tests get when they make a ``SQLiteSession`` or ``SQLAlchemySession``: a MemormSession.

Swapped into the upstream modules' namespaces (``suite.py``); ``CURRENT`` holds
the test's :class:`~.backend.Backend` (``conftest.py`` sets it), so every
session of a case lives in that test's memorm database, keyed by the SDK's
``session_id``.
"""

from __future__ import annotations

from typing import Any

from agents.memory import SessionSettings

from memorm import Database
from memorm.compat.openai_agents import MemormSession

from .backend import Backend

__all__ = ["CURRENT", "SQLAlchemySessions", "SuiteSession", "sqlite_session"]

CURRENT: dict[str, Backend] = {}


class _Engine:
    """What the SDK's tests do with a session's engine: dispose of it (a ``from_url`` session's database)."""

    def __init__(self, db: Database, *, owned: bool) -> None:
        self._db = db
        self._owned = owned

    async def dispose(self) -> None:
        if self._owned:
            await self._db.dispose()


class SuiteSession(MemormSession):
    """A ``MemormSession`` with the SDK sessions' ``close()`` and ``engine``, which hold nothing here.

    A ``MemormSession`` opens no connection of its own (its database's pools
    are the test fixture's to close), so ``close()`` has nothing to do.
    """

    engine: _Engine

    def close(self) -> None:
        """The SDK's ``SQLiteSession.close()``: a ``MemormSession`` holds no connection."""


def _session(
    session_id: str,
    *,
    db: Database | None = None,
    session_settings: SessionSettings | dict[str, Any] | None = None,
) -> SuiteSession:
    backend = CURRENT["backend"]
    made = SuiteSession(
        session_id,
        backend.db if db is None else db,
        agent=backend.agent_id,
        session_settings=session_settings,
    )
    made.engine = _Engine(made.db, owned=db is not None)
    return made


def sqlite_session(
    session_id: str,
    db_path: Any = ":memory:",
    *,
    session_settings: SessionSettings | dict[str, Any] | None = None,
    **_: Any,
) -> SuiteSession:
    """``SQLiteSession(session_id, db_path)``: the session on the test's database (the path is ignored)."""
    return _session(session_id, session_settings=session_settings)


class SQLAlchemySessions:
    """``SQLAlchemySession``: ``(id, engine=...)`` on the test's database, ``from_url`` on another one.

    ``from_url`` makes its own engine, so here it makes its own ``Database`` on
    the test's store (``db.clone()``); the session's ``engine.dispose()``
    disposes it, and the fixture disposes any the case left open.
    """

    def __call__(
        self, session_id: str, *, session_settings: SessionSettings | dict[str, Any] | None = None, **_: Any
    ) -> SuiteSession:
        return _session(session_id, session_settings=session_settings)

    def from_url(
        self, session_id: str, *, session_settings: SessionSettings | dict[str, Any] | None = None, **_: Any
    ) -> SuiteSession:
        backend = CURRENT["backend"]
        clone = backend.db.clone()
        backend.clones.append(clone)
        return _session(session_id, db=clone, session_settings=session_settings)
