# Partly vendored from the OpenAI Agents SDK (openai-agents 0.24.0, source distribution),
# tests/conftest.py (disable_real_model_clients); adapted to memorm as README.md here describes.
# Copyright (c) 2025 OpenAI. SPDX-License-Identifier: MIT (the SDK's LICENSE, whole, is beside this file).
"""Fixtures for the SDK's session tests: a memorm ``Database`` per test, on each engine."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import agents
import pytest
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from agents.models.openai_responses import OpenAIResponsesModel
from conftest import Store
from probes import aiosqlite_threads, tagged_database

from .backend import Backend

agents.set_tracing_disabled(True)  # models are scripted and traces off: nothing reaches the network


@pytest.fixture
async def backend(store: Store) -> AsyncIterator[Backend]:
    """Where the test's sessions live: a memorm database on SQLite or Postgres, and one agent."""
    elsewhere = aiosqlite_threads() if store.engine == "sqlite" else 0
    application, db = await tagged_database(store)
    try:
        async with db.unit_of_work() as uow:
            agent = await uow.agents.create("sdk-session-tests")
        yield Backend(store, db, agent.id, application, elsewhere)
    finally:
        await db.dispose()


# Vendored from the SDK's tests/conftest.py: a test that reaches a real model fails.
@pytest.fixture(autouse=True)
def disable_real_model_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_version(*args: Any, **kwargs: Any) -> Any:
        pytest.fail("Real models should not be used in tests!")

    monkeypatch.setattr(OpenAIResponsesModel, "get_response", failing_version)
    monkeypatch.setattr(OpenAIResponsesModel, "stream_response", failing_version)
    monkeypatch.setattr(OpenAIChatCompletionsModel, "get_response", failing_version)
    monkeypatch.setattr(OpenAIChatCompletionsModel, "stream_response", failing_version)
