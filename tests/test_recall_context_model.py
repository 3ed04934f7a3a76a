"""`context()` against a model: any log, budget and pinning must give what a plain list gives.

`context()` answers in one statement (the pinned system message plus the
newest rows whose running token total fits), and falls back to a step-by-step
scan when every row the statement summed fitted (messages of no tokens).  The
examples reach both: token counts include 0, and budgets run from 1 to past
the whole log.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memorm import Database

pytestmark = pytest.mark.anyio

Row = tuple[str, int]  # (role, token_count)

ROW = st.tuples(st.sampled_from(["user", "assistant", "tool"]), st.integers(0, 40))
LOG = st.tuples(st.booleans(), st.lists(ROW, max_size=30))  # (starts with a system message, the rest)


def expected(rows: list[Row], budget: int, pinned: bool) -> list[int]:
    """Indexes into `rows` that context() keeps, oldest first."""
    system: int | None = None
    body = list(range(len(rows)))
    if pinned and rows and rows[0][0] == "system":
        system = body.pop(0)
        budget -= rows[0][1]
    kept: list[int] = []
    if budget > 0:
        total = 0
        for index in reversed(body):
            total += rows[index][1]
            if total > budget:
                break
            kept.append(index)
        kept.reverse()
        while kept and rows[kept[0]][0] == "tool":  # an answer whose call did not fit
            kept.pop(0)
    return kept if system is None else [system, *kept]


@given(log=LOG, budget=st.integers(1, 700), pinned=st.booleans())
async def test_context_matches_a_list_model(
    db: Database, log: tuple[bool, list[Row]], budget: int, pinned: bool
) -> None:
    starts_with_system, rest = log
    rows = ([("system", 7)] if starts_with_system else []) + rest
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create(f"context-{uuid.uuid4()}")
        chat = await uow.sessions.create(agent.id)
        messages: list[dict[str, Any]] = [
            {"role": role, "content": f"m{index}", "token_count": tokens}
            for index, (role, tokens) in enumerate(rows)
        ]
        # Tool answers need a call id; the model only cares about roles and counts.
        for message in messages:
            if message["role"] == "tool":
                message["tool_call_id"] = "call"
        stored = await uow.messages.append(chat.id, messages) if messages else []
    async with db.unit_of_work(read_only=True) as uow:
        got = await uow.messages.context(chat.id, max_tokens=budget, pinned_system=pinned)
    assert [message.id for message in got] == [stored[i].id for i in expected(rows, budget, pinned)]
