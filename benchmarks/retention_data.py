"""The retention benchmark's data: its sizes, and rows of memorm's tables built as dicts.

The scenarios (:mod:`benchmarks.retention` describes them) lay their data out
around :data:`NOW`; :class:`Builder` makes seeded rows that the raw driver
loads (:mod:`benchmarks.raw.retention`).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np

from benchmarks.raw.encoding import UTC
from memorm.ids import uuid7

NAME = "retention"
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)  # the purge's "now"; the data is laid out around it
DIM = 384
MODEL = "default"


@dataclass
class Size:
    expired: int  # (1) expired sessions
    live: int  # (1) live sessions
    per_session: int  # (1) messages per session
    batch: int  # (1) sessions per unit of work
    purge_reps: int
    age_sessions: int  # (2)
    age_per_session: int  # (2) messages per session
    age_reps: int
    people: int  # (3)
    person_sessions: int
    person_per_session: int  # messages per session of a person's agent
    person_passages: int
    forget_reps: int


FULL = Size(
    expired=500,
    live=500,
    per_session=100,
    batch=100,
    purge_reps=7,
    age_sessions=20,
    age_per_session=1000,
    age_reps=5,
    people=200,
    person_sessions=10,
    person_per_session=200,
    person_passages=500,
    forget_reps=5,
)
QUICK = Size(
    expired=100,
    live=100,
    per_session=50,
    batch=25,
    purge_reps=2,
    age_sessions=8,
    age_per_session=250,
    age_reps=2,
    people=20,
    person_sessions=4,
    person_per_session=100,
    person_passages=100,
    forget_reps=2,
)

SCRUB_NOTE = {
    "sqlite": "FTS5 optimize of both indexes + wal_checkpoint(TRUNCATE)",
    "postgres": "VACUUM (ANALYZE, INDEX_CLEANUP ON) of memorm's five tables",
}

# The shared agent's data about each person (scenario 3).
SHARED_SESSIONS = 2
SHARED_SESSION_MESSAGES = 20
SHARED_PASSAGES = 20
GROUP_MESSAGES = 5  # messages tagged with the person in an untagged group session


def _entity(at: datetime, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The columns every memorm table has: a new id, both timestamps at ``at``, and ``meta``."""
    return {"id": uuid7(), "created_at": at, "updated_at": at, "meta": dict(meta or {})}


class Builder:
    """Rows of memorm's tables as dicts of Python values; the text is seeded."""

    VOCABULARY = tuple(f"w{rank}" for rank in range(5000))

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        weights = [1 / (rank + 1) for rank in range(len(self.VOCABULARY))]  # Zipf
        self.texts = [
            " ".join(self.rng.choices(self.VOCABULARY, weights, k=self.rng.randint(10, 80)))
            for _ in range(4096)
        ]
        self.count = 0

    def text(self) -> str:
        """Chat-like text: Zipf-distributed words (about 45 of them) and one rare token."""
        self.count += 1
        return f"{self.texts[(self.count * 7919) % len(self.texts)]} ref{self.count}"

    @staticmethod
    def agent(name: str, at: datetime, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return {
            **_entity(at, meta),
            "name": name,
            "system": "",
            "core_memory": {},
            "llm_config": {},
            "version": 1,
            "archive_version": 0,
            "retention": None,
        }

    @staticmethod
    def model(agent_id: uuid.UUID, at: datetime) -> dict[str, Any]:
        return {
            **_entity(at),
            "agent_id": agent_id,
            "name": MODEL,
            "dim": DIM,
            "precision": "float32",
        }

    @staticmethod
    def session(
        agent_id: uuid.UUID,
        at: datetime,
        messages: int,
        *,
        expires_at: datetime | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        return {
            **_entity(at, meta),
            "agent_id": agent_id,
            "title": None,
            "key": None,
            "next_seq": messages + 1,
            "expires_at": expires_at,
        }

    def message(
        self,
        chat: Mapping[str, Any],
        seq: int,
        at: datetime,
        *,
        role: str | None = None,
        meta: Mapping[str, Any] | None = None,
        call: str | None = None,
        answers: str | None = None,
    ) -> dict[str, Any]:
        """Message ``seq`` of ``chat``: a tool call (``call``), a tool answer (``answers``) or chat."""
        content = self.text()
        tool_calls = None
        if call is not None:
            role = "assistant"
            tool_calls = [{"id": call, "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]
        elif answers is not None:
            role = "tool"
        return {
            **_entity(at, meta),
            "session_id": chat["id"],
            "agent_id": chat["agent_id"],
            "seq": seq,
            "role": role or ("user" if seq % 2 else "assistant"),
            "content": content,
            "name": "lookup" if answers is not None else None,
            "tool_calls": tool_calls,
            "tool_call_id": answers,
            "token_count": 4 + len(content) // 4,
        }

    def chat(self, chat: Mapping[str, Any], count: int, step: timedelta) -> list[dict[str, Any]]:
        """``count`` plain messages of ``chat``, ``step`` apart from its creation."""
        start = chat["created_at"]
        return [self.message(chat, seq, start + seq * step) for seq in range(1, count + 1)]

    def passage(
        self, agent_id: uuid.UUID, at: datetime, vector: np.ndarray, meta: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        return {
            **_entity(at, meta),
            "agent_id": agent_id,
            "text": self.text(),
            "embedding": vector,
            "embedding_half": None,
            "embedding_model": MODEL,
            "embedding_dim": DIM,
        }


def unit_vectors(rng: np.random.Generator, count: int) -> np.ndarray:
    vectors = rng.standard_normal((count, DIM), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors
