"""`from_conn_string` for memorm's adapters: an adapter on a `Database` of its own, closed with a block.

LangGraph's savers and stores open their connection from a URL in a `with`
(sync) or `async with` (async) block; `Opened` is both, and disposes the
database it made as the block ends: the connections of the running loop's
engine (`async with`) and those sync calls opened on memorm's sync loop.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Generic, TypeVar

from memorm.compat._sync import adispose_sync, dispose_sync
from memorm.db import Database

__all__ = ["Opened"]

T = TypeVar("T")


class Opened(Generic[T]):
    """`make(Database(url))` for the length of a `with` or `async with` block.

    Args:
        url: the database's URL (as `Database(url)`: None for the default).
        make: builds the adapter on the database.
    """

    def __init__(self, url: str | None, make: Callable[[Database], T]) -> None:
        self._url = url
        self._make = make
        self._db: Database | None = None

    def _open(self) -> T:
        self._db = Database(self._url)
        return self._make(self._db)

    def __enter__(self) -> T:
        try:
            return self._open()
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        db, self._db = self._db, None
        if db is not None:
            dispose_sync(db)

    async def __aenter__(self) -> T:
        try:
            return self._open()
        except BaseException:
            await self.__aexit__(None, None, None)
            raise

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        db, self._db = self._db, None
        if db is not None:
            try:
                await adispose_sync(db)
            finally:
                await db.dispose()
