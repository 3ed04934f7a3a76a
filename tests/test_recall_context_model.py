"""`context()` against a model: any log, budget and pinning must give what a plain list gives.

`context()` answers in one statement (the pinned system message plus the
newest rows whose running token total fits), and falls back to a step-by-step
scan when every row the statement summed fitted (messages of no tokens).  The
examples reach both: token counts include 0, and budgets run from 1 to past
the whole log.  Rows stored without a count (written by another program) are
estimated in SQL as `estimate_tokens` estimates their content.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

from memorm import Database
from memorm.models import MESSAGES
from memorm.tokens import estimate_tokens

pytestmark = pytest.mark.anyio

Row = tuple[str, int]  # (role, token_count)
Given = tuple[str, int | None, int]  # (role, token_count or None: stored without one, content length)

ROW = st.tuples(
    st.sampled_from(["user", "assistant", "tool"]), st.integers(0, 40) | st.none(), st.integers(0, 30)
)
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
    db: Database, log: tuple[bool, list[Given]], budget: int, pinned: bool
) -> None:
    starts_with_system, rest = log
    given = ([("system", 7, 1)] if starts_with_system else []) + rest
    messages: list[dict[str, Any]] = [
        {"role": role, "content": "x" * length, "token_count": 0 if tokens is None else tokens}
        for role, tokens, length in given
    ]
    # Tool answers need a call id; the model only cares about roles and counts.
    for message in messages:
        if message["role"] == "tool":
            message["tool_call_id"] = "call"
    rows = [
        (role, estimate_tokens({"content": message["content"]}) if tokens is None else tokens)
        for (role, tokens, _), message in zip(given, messages, strict=True)
    ]
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create(f"context-{uuid.uuid4()}")
        chat = await uow.sessions.create(agent.id)
        stored = await uow.messages.append(chat.id, messages) if messages else []
        uncounted = [message.id for message, row in zip(stored, given, strict=True) if row[1] is None]
        if uncounted:
            await uow.session.execute(
                sa.update(MESSAGES).where(MESSAGES.c.id.in_(uncounted)).values(token_count=None)
            )
    async with db.unit_of_work(read_only=True) as uow:
        got = await uow.messages.context(chat.id, max_tokens=budget, pinned_system=pinned)
    assert [message.id for message in got] == [stored[i].id for i in expected(rows, budget, pinned)]
