# Partly vendored from langgraph-checkpoint-postgres 3.2.0 (source distribution), tests/conftest.py
# (fake_embeddings, VECTOR_TYPES); adapted to memorm as README.md here describes.
# Copyright (c) 2024 LangChain, Inc. SPDX-License-Identifier: MIT (LICENSE, whole, is beside this file).
"""The construction of LangGraph's store tests, on memorm: a `MemormStore` per test, on each engine."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator

import pytest
from conftest import Store
from probes import tagged_database

from memorm.compat.langgraph import MemormStore

from .embed_test_utils import CharacterEmbeddings
from .kit import CURRENT, AsyncSuiteStore

# Cases that sleep through TTLs or run thousands of operations: `-m long` runs them.
_LONG = {"test_store_ttl", "test_large_batches", "test_large_batches_async"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The suite's coroutine cases run on anyio (upstream: pytest-asyncio's auto mode); long ones marked."""
    here = __name__.rsplit(".", 1)[0]
    for item in items:
        module = getattr(item, "module", None)
        if module is None or not module.__name__.startswith(here):
            continue
        if inspect.iscoroutinefunction(getattr(item, "function", None)):
            item.add_marker(pytest.mark.anyio)
        if getattr(item, "originalname", item.name) in _LONG:
            item.add_marker(pytest.mark.long)


@pytest.fixture
async def store(
    store: Store, request: pytest.FixtureRequest, anyio_backend: str
) -> AsyncIterator[MemormStore]:
    """LangGraph's `store` fixture: a store with a 6-second TTL on a fresh memorm database.

    (The `store` it takes is memorm's own suite's: a SQLite file or a Postgres schema.)  As
    upstream's, its TTL sweeper runs every 3 seconds while the case runs: on memorm's sync
    loop for the sync suite (whose cases run while this loop waits), on this loop for the async one.
    """
    _, db = await tagged_database(store)
    try:
        async with db.unit_of_work() as uow:
            agent = await uow.agents.create("langgraph-store-tests")
        ttl_seconds = getattr(request.module, "TTL_SECONDS", 6)
        ttl_minutes = ttl_seconds / 60
        ttl = {"default_ttl": ttl_minutes, "refresh_on_read": True, "sweep_interval_minutes": ttl_minutes / 2}
        kind = AsyncSuiteStore if request.module.__name__.endswith("test_async_store") else MemormStore
        CURRENT.update(db=db, agent=agent.id, kind=kind)
        made = kind(db, agent=agent.id, ttl=ttl)
        if kind is MemormStore:
            made.start_ttl_sweeper()
        else:
            await made.astart_ttl_sweeper()
        try:
            yield made
        finally:
            assert await made.astop_ttl_sweeper(timeout=10)
    finally:
        CURRENT.clear()
        await db.dispose()


@pytest.fixture(autouse=True)
def _memorm_store(store: MemormStore) -> None:
    """Every case runs on both engines, with a database for the stores it makes itself."""


@pytest.fixture
def fake_embeddings() -> CharacterEmbeddings:
    return CharacterEmbeddings(dims=500)
