"""Fixtures for the SDK's session tests: a memorm ``Database`` per test, on each engine."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import agents
import pytest
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from agents.models.openai_responses import OpenAIResponsesModel
from conftest import Store
from probes import tagged_database

from memorm import Database

from .backend import Backend
from .sessions import CURRENT

agents.set_tracing_disabled(True)  # models are scripted and traces off: nothing reaches the network


@pytest.fixture(autouse=True)
async def backend(store: Store) -> AsyncIterator[Backend]:
    """Where the test's sessions live: a memorm database on SQLite or Postgres, and one agent."""
    _, db = await tagged_database(store)
    clones: list[Database] = []
    try:
        async with db.unit_of_work() as uow:
            agent = await uow.agents.create("sdk-session-tests")
        CURRENT["backend"] = Backend(store, db, agent.id, clones)
        yield CURRENT["backend"]
    finally:
        CURRENT.clear()
        for clone in clones:
            await clone.dispose()
        await db.dispose()


@pytest.fixture(autouse=True)
def no_real_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """A case that reaches a real OpenAI model fails (the SDK's suite guards the same way)."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        pytest.fail("a real model was called: the SDK's session tests script theirs")

    for model in (OpenAIResponsesModel, OpenAIChatCompletionsModel):
        monkeypatch.setattr(model, "get_response", refuse)
        monkeypatch.setattr(model, "stream_response", refuse)
