"""Recall memory against a model: random edit sequences must leave the log a plain list would.

Each example drives one fresh session through appends, trims, prepends,
system-message swaps and rewinds, mirroring every step on a Python list of
``(seq, role, content)`` and comparing the stored log (and its count, and the
full-text index) after each step.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memorm import Database

pytestmark = pytest.mark.anyio

Row = tuple[int, str, str]  # (seq, role, content)

# One appended item: a plain message, or an assistant tool call with its answers.
ITEM = st.one_of(
    st.tuples(st.just("plain"), st.sampled_from(["user", "assistant"])),
    st.tuples(st.just("block"), st.integers(1, 2)),
)
OPERATION = st.one_of(
    st.tuples(st.just("append"), st.lists(ITEM, min_size=1, max_size=3)),
    st.tuples(st.just("trim"), st.integers(0, 6)),
    st.tuples(st.just("prepend"), st.lists(st.sampled_from(["user", "assistant"]), min_size=1, max_size=3)),
    st.tuples(st.just("replace_system"), st.none()),
    st.tuples(st.just("delete_after"), st.integers(-2, 12)),
)


@dataclass
class Model:
    """The log as a list, with the session's sequence counter."""

    rows: list[Row] = field(default_factory=list)
    next_seq: int = 1
    names: itertools.count[int] = field(default_factory=itertools.count)

    def text(self, kind: str) -> str:
        return f"{kind}{next(self.names)} memo"

    def has_system(self) -> bool:
        return bool(self.rows) and self.rows[0][1] == "system"

    def append(self, messages: list[tuple[str, str]]) -> None:
        for role, content in messages:
            self.rows.append((self.next_seq, role, content))
            self.next_seq += 1

    def prepend(self, messages: list[tuple[str, str]]) -> None:
        if not self.rows:
            self.append(messages)
            return
        n = len(messages)
        if self.has_system():
            seq, role, content = self.rows[0]
            self.rows[0] = (seq - n, role, content)
            block = [(seq - n + 1 + i, r, c) for i, (r, c) in enumerate(messages)]
            self.rows[1:1] = block
        else:
            first = self.rows[0][0] - n
            self.rows[0:0] = [(first + i, r, c) for i, (r, c) in enumerate(messages)]

    def replace_system(self, content: str) -> None:
        if self.has_system():
            self.rows[0] = (self.rows[0][0], "system", content)
        elif not self.rows:
            self.append([("system", content)])
        else:
            self.rows.insert(0, (self.rows[0][0] - 1, "system", content))

    def trim(self, keep: int) -> int:
        head = self.rows[:1] if self.has_system() else []
        body = self.rows[len(head) :]
        if keep == 0:
            start = len(body)
        elif len(body) < keep:
            start = 0
        else:
            start = len(body) - keep
            while start < len(body) and body[start][1] == "tool":  # never orphan tool answers
                start += 1
        self.rows = head + body[start:]
        return start

    def delete_after(self, seq: int) -> int:
        kept = [row for row in self.rows if row[0] <= seq]
        deleted = len(self.rows) - len(kept)
        self.rows = kept
        self.next_seq = min(self.next_seq, seq + 1)
        return deleted


def as_dicts(model: Model, items: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """Message dicts for appended items, unique content each."""
    out: list[dict[str, Any]] = []
    for kind, arg in items:
        if kind == "plain":
            out.append({"role": arg, "content": model.text(arg[0])})
            continue
        calls = [f"c{next(model.names)}" for _ in range(arg)]
        specs = [{"id": c, "type": "function", "function": {"name": "f", "arguments": "{}"}} for c in calls]
        out.append({"role": "assistant", "content": model.text("call"), "tool_calls": specs})
        out += [{"role": "tool", "content": model.text("answer"), "tool_call_id": c} for c in calls]
    return out


@given(operations=st.lists(OPERATION, min_size=1, max_size=12))
async def test_random_edits_match_a_list_model(db: Database, operations: list[tuple[str, Any]]) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create(f"model-{uuid.uuid4().hex}")
        chat = (await uow.sessions.create(agent.id)).id
    model = Model()
    for step, (name, arg) in enumerate(operations):
        async with db.unit_of_work() as uow:
            messages = uow.messages
            if name == "append":
                batch = as_dicts(model, arg)
                await messages.append(chat, batch)
                model.append([(m["role"], m["content"]) for m in batch])
            elif name == "prepend":
                batch = [{"role": role, "content": model.text("summary")} for role in arg]
                await messages.prepend(chat, batch)
                model.prepend([(m["role"], m["content"]) for m in batch])
            elif name == "replace_system":
                content = model.text("system")
                await messages.replace_system(chat, content)
                model.replace_system(content)
            elif name == "trim":
                assert await messages.trim(chat, keep_last=arg) == model.trim(arg), f"step {step}"
            else:
                # Rewind to a seq near the log's (prepends push seqs below 1).
                seq = (model.rows[0][0] if model.rows else 1) + arg - 2
                assert await messages.delete_after(chat, seq) == model.delete_after(seq), f"step {step}"
        async with db.unit_of_work(read_only=True) as uow:
            log = await uow.messages.window(chat, limit=1000)
            count = await uow.messages.count(chat)
        assert [(m.seq, m.role, m.content) for m in log] == model.rows, f"after step {step}: {name} {arg}"
        assert count == len(model.rows)
    # Next append lands where the model's counter says.
    async with db.unit_of_work() as uow:
        (last,) = await uow.messages.append(chat, {"role": "user", "content": "closing memo"})
        found = await uow.messages.search(agent.id, "memo", limit=1000)
    assert last.seq == model.next_seq
    assert sorted(m.content for m in found) == sorted([c for _, _, c in model.rows] + ["closing memo"])
    assert found.total == len(model.rows) + 1
