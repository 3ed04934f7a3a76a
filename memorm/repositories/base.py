"""What every repository shares: its session, error translation, paging."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Result
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql import Executable, Select

from memorm.page import Page
from memorm.translate import check_writable, guarded
from memorm.validation import check_limit

__all__ = ["Repository"]

T = TypeVar("T")


class Repository:
    """Base of the repositories: runs statements on the unit of work's session."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def _execute(self, statement: Executable, params: Any = None) -> Result[Any]:
        if getattr(statement, "is_dml", False):
            check_writable(self.session)
        async with guarded(self.session):
            return await self.session.execute(statement, params)

    async def _scalar(self, statement: Executable) -> Any:
        async with guarded(self.session):
            return await self.session.scalar(statement)

    @asynccontextmanager
    async def _savepoint(self) -> AsyncIterator[None]:
        """Run a write that may break a constraint without poisoning the transaction.

        On Postgres a failed statement aborts the whole transaction; inside a
        SAVEPOINT only the savepoint is lost, so a caller that catches the
        ``ConflictError`` can carry on with the unit of work.
        """
        check_writable(self.session)
        async with guarded(self.session, recoverable=True), self.session.begin_nested():
            yield

    async def _page(self, query: Select[Any], *, limit: int, offset: int) -> Page[Any]:
        """One page of ``query`` (already ordered) with its true total."""
        check_limit(limit, offset)
        counted = query.order_by(None).subquery()
        total = await self._scalar(sa.select(sa.func.count()).select_from(counted))
        items = list((await self._execute(query.limit(limit).offset(offset))).scalars())
        return Page(items=items, total=int(total or 0), limit=limit, offset=offset)
