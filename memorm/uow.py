"""``UnitOfWork``: one ``AsyncSession``, one transaction, all four repositories.

::

    async with db.unit_of_work() as uow:      # BEGIN
        agent = await uow.agents.create("sam")
        ...                                   # COMMIT on clean exit,
                                              # ROLLBACK on exception or cancellation

Repositories flush; only the unit of work commits or rolls back.  A unit of
work belongs to one task: never share one between concurrent tasks.
"""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import TYPE_CHECKING

import anyio
from sqlalchemy.ext.asyncio import AsyncSession

from memorm.errors import DatabaseError
from memorm.repositories import (
    AgentRepository,
    MessageRepository,
    PassageRepository,
    SessionRepository,
)
from memorm.search.vector import ARCHIVE_WRITES
from memorm.translate import FAILED, READ_ONLY, SHIELD, failure, translating

if TYPE_CHECKING:
    from memorm.db import Database

__all__ = ["UnitOfWork"]


class UnitOfWork:
    """A transaction over memorm's repositories; get one from :meth:`Database.unit_of_work`.

    Attributes:
        agents: :class:`~memorm.repositories.AgentRepository`.
        sessions: :class:`~memorm.repositories.SessionRepository`.
        messages: :class:`~memorm.repositories.MessageRepository`.
        passages: :class:`~memorm.repositories.PassageRepository`.
        session: the underlying SQLAlchemy ``AsyncSession``, for queries of your own.
    """

    agents: AgentRepository
    sessions: SessionRepository
    messages: MessageRepository
    passages: PassageRepository
    session: AsyncSession
    _writer: anyio.Lock | None

    def __init__(self, db: Database, *, read_only: bool = False) -> None:
        self.db = db
        self.read_only = read_only
        self._open = False

    async def __aenter__(self) -> UnitOfWork:
        if self._open:
            raise RuntimeError("this unit of work is already open; make a new one per task")
        await self.db.check_schema()
        self._writer = None if self.read_only else self.db.writer_lock
        if self._writer is not None:
            await self._writer.acquire()
        self.session = self.db.new_session(read_only=self.read_only)
        self.session.info[SHIELD] = self.db.dialect == "sqlite"
        self.session.info[READ_ONLY] = self.read_only
        self.agents = AgentRepository(self.session)
        self.sessions = SessionRepository(self.session)
        self.messages = MessageRepository(self.session, token_counter=self.db.token_counter)
        self.passages = PassageRepository(self.session, cache=self.db.vector_cache)
        self._open = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Shielded: a cancelled task must still roll back and return its connection.
        with anyio.CancelScope(shield=True):
            try:
                if exc_type is None:
                    await self.commit()
                else:
                    await self._discard()
            finally:
                self._open = False
                try:
                    await self.session.close()
                except Exception:
                    if exc_type is None:
                        raise
                    # The body's exception (or cancellation) is the one to report; a
                    # connection that broke meanwhile is invalidated by SQLAlchemy.
                finally:
                    if self._writer is not None:
                        self._writer.release()

    async def _discard(self) -> None:
        """Roll back after the body failed, never hiding its exception behind a cleanup error."""
        # The body's exception propagates; a connection that broke is invalidated anyway.
        with contextlib.suppress(Exception):
            await self.rollback()

    async def commit(self) -> None:
        """Commit what the repositories wrote so far; the unit of work stays usable.

        A unit of work in which a database error happened cannot commit: it
        rolls back and raises that error again.
        """
        earlier = failure(self.session)
        if earlier is not None:
            await self.rollback()
            raise DatabaseError(f"this unit of work failed ({earlier}) and was rolled back") from earlier
        with translating():
            await self.session.commit()
        # Committed archive changes make those agents' cached vectors stale: drop
        # them now, so no deleted vector stays in memory until the next search.
        written = self.session.info.pop(ARCHIVE_WRITES, None)
        if written:
            self.db.vector_cache.evict(written)

    async def rollback(self) -> None:
        """Discard what the repositories wrote since the last commit."""
        self.session.info.pop(FAILED, None)
        self.session.info.pop(ARCHIVE_WRITES, None)
        with translating():
            await self.session.rollback()
