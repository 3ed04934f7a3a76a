"""How LangGraph's store cases build their stores and reach their rows, on memorm.

The names here replace, in the upstream modules' namespaces, the ones that built a
``PostgresStore`` or ran SQL on its ``store`` table (see ``suite.py``).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from memorm import Database
from memorm.compat._sync import BRIDGE
from memorm.compat.langgraph import MemormStore
from memorm.models import STORE_ITEMS
from memorm.types import utcnow

__all__ = [
    "CURRENT",
    "MemormInMemoryStore",
    "aexpire_now",
    "arow_exists",
    "arun",
    "astored_expires_at",
    "avector_store_context",
    "count_rows",
    "expire_now",
    "expire_now_in",
    "expires_at",
    "row_exists",
    "run",
    "stored_expires_at",
    "updated_ago",
    "vector_store_context",
    "where",
]


CURRENT: dict[str, Any] = {}  # the test's memorm database, agent and store class (conftest.py sets them)


class MemormInMemoryStore(MemormStore):
    """What the suite's `InMemoryStore(**kwargs)` makes: a MemormStore of a new agent, on the test's database.

    Made from sync code or in the test's event loop (whose thread it blocks a moment), as an
    `InMemoryStore` is made anywhere.  Its sync methods run anywhere too, as `InMemoryStore`'s do
    (`allow_blocking`): the suite's coroutine cases call them.  A class, as the name it stands
    for is: the cases that spy on `InMemoryStore.batch` (pytest-mock) spy on memorm's.
    """

    def __init__(self, **kwargs: Any) -> None:
        async def create(db: Database) -> Any:
            async with db.unit_of_work() as uow:
                return (await uow.agents.create(f"in-memory-{uuid.uuid4().hex[:8]}")).id

        db = CURRENT["db"]
        super().__init__(db, agent=BRIDGE.run(db, create), allow_blocking=True, **kwargs)


def vector_store_on(
    vector_type: str,
    distance_type: str,
    fake_embeddings: Any,
    text_fields: list[str] | None = None,
    enable_ttl: bool = True,
) -> MemormStore:
    """What LangGraph's `_create_vector_store` makes: a store with semantic search, on the test's database.

    `vector_type` (`vector`/`halfvec`) goes in the index config: memorm keeps float32 vectors for both.
    """
    index = {
        "dims": fake_embeddings.dims,
        "embed": fake_embeddings,
        "ann_index_config": {"vector_type": vector_type},
        "distance_type": distance_type,
        "fields": text_fields,
    }
    ttl = {"default_ttl": 2, "refresh_on_read": True} if enable_ttl else None
    kind = CURRENT["kind"]
    return kind(CURRENT["db"], agent=CURRENT["agent"], index=index, ttl=ttl)  # type: ignore[no-any-return]


@contextmanager
def vector_store_context(*args: Any, **kwargs: Any) -> Iterator[MemormStore]:
    """LangGraph's sync `_create_vector_store`."""
    yield vector_store_on(*args, **kwargs)


@asynccontextmanager
async def avector_store_context(*args: Any, **kwargs: Any) -> AsyncIterator[MemormStore]:
    """LangGraph's async `_create_vector_store`."""
    yield vector_store_on(*args, **kwargs)


def run(store: MemormStore, statement: Any) -> Any:
    """Run a statement on the store's database from sync code; a query's rows."""
    return BRIDGE.run(store.db, lambda db: arun(store, statement, db))


async def arun(store: MemormStore, statement: Any, db: Database | None = None) -> Any:
    """Run a statement on the store's database (in the store's tenant); a query's rows."""
    async with (db or store.db).unit_of_work() as uow:
        result = await uow.session.execute(statement)
        return None if statement.is_dml else [tuple(row) for row in result]


def where(ns: tuple[str, ...], key: str) -> list[Any]:
    """The conditions naming an item's row (LangGraph's `prefix = %s AND key = %s`)."""
    return [STORE_ITEMS.c.namespace == ".".join(ns), STORE_ITEMS.c.key == key]


def expire_now(ns: tuple[str, ...], key: str) -> Any:
    """LangGraph's `UPDATE store SET expires_at = NOW() - INTERVAL '1 minute' WHERE ...`."""
    return sa.update(STORE_ITEMS).where(*where(ns, key)).values(expires_at=utcnow() - timedelta(minutes=1))


def count_rows(ns: tuple[str, ...], key: str) -> Any:
    """LangGraph's `SELECT COUNT(*) AS n FROM store WHERE ...`."""
    return sa.select(sa.func.count()).select_from(STORE_ITEMS).where(*where(ns, key))


def expires_at(ns: tuple[str, ...], key: str) -> Any:
    """LangGraph's `SELECT expires_at FROM store WHERE ...`."""
    return sa.select(STORE_ITEMS.c.expires_at).where(*where(ns, key))


def updated_ago(ns: tuple[str, ...], key: str, seconds: float) -> Any:
    """LangGraph's `UPDATE store SET updated_at = NOW() - (%s * INTERVAL '1 second') WHERE ...`."""
    then = utcnow() - timedelta(seconds=seconds)
    return sa.update(STORE_ITEMS).where(*where(ns, key)).values(updated_at=then)


def expire_now_in(store: MemormStore, ns: tuple[str, ...], key: str) -> None:
    """LangGraph's `_expire_now`: backdate an item's `expires_at` (sync)."""
    run(store, expire_now(ns, key))


def row_exists(store: MemormStore, ns: tuple[str, ...], key: str) -> bool:
    """LangGraph's `_row_exists`: whether the item's row is still stored, expired or not (sync)."""
    return bool(run(store, count_rows(ns, key))[0][0] == 1)


def stored_expires_at(store: MemormStore, ns: tuple[str, ...], key: str) -> Any:
    """LangGraph's `_stored_expires_at`: the item's stored `expires_at` (sync)."""
    return run(store, expires_at(ns, key))[0][0]


async def aexpire_now(store: MemormStore, ns: tuple[str, ...], key: str) -> None:
    """LangGraph's `_aexpire_now`."""
    await arun(store, expire_now(ns, key))


async def arow_exists(store: MemormStore, ns: tuple[str, ...], key: str) -> bool:
    """LangGraph's `_arow_exists`."""
    return bool((await arun(store, count_rows(ns, key)))[0][0] == 1)


async def astored_expires_at(store: MemormStore, ns: tuple[str, ...], key: str) -> Any:
    """LangGraph's `_astored_expires_at`."""
    return (await arun(store, expires_at(ns, key)))[0][0]
