"""Recall memory, editing the log: trim, prepend, replace_system, delete, rewind, and context budgets."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from memorm import Database, Message, NotFoundError, ValidationError
from memorm.tokens import estimate_tokens

pytestmark = pytest.mark.anyio


async def new_session(db: Database, messages: list[dict[str, Any]] | None = None) -> uuid.UUID:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create(f"agent-{uuid.uuid4().hex[:8]}")
        chat = await uow.sessions.create(agent.id)
        if messages:
            await uow.messages.append(chat.id, messages)
    return chat.id


async def log_of(db: Database, chat: uuid.UUID) -> list[Message]:
    async with db.unit_of_work() as uow:
        return await uow.messages.window(chat, limit=1000)


def msg(role: str, content: str = "", *, tokens: int | None = None, calls: Any = ()) -> dict[str, Any]:
    """A message dict; ``calls`` gives an assistant tool call ids, a tool message answers ``content``."""
    out: dict[str, Any] = {"role": role, "content": content, "token_count": tokens}
    if calls:
        out["tool_calls"] = [{"id": c, "type": "function", "function": {"name": "f"}} for c in calls]
    if role == "tool":
        out["tool_call_id"] = content
    return out


# Tool blocks everywhere a cut could fall: two answers, back-to-back blocks, a block at the very end.
BLOCKY = [
    msg("user", "u1"),
    msg("assistant", "", calls=["c1", "c2"]),
    msg("tool", "c1"),
    msg("tool", "c2"),
    msg("assistant", "a1"),
    msg("user", "u2"),
    msg("assistant", "", calls=["c3"]),
    msg("tool", "c3"),
    msg("assistant", "", calls=["c4", "c5"]),
    msg("tool", "c4"),
    msg("tool", "c5"),
    msg("assistant", "a2"),
    msg("user", "u3"),
    msg("assistant", "", calls=["c6"]),
    msg("tool", "c6"),
]


def assert_no_orphans(kept: list[Message]) -> None:
    """Every tool answer follows its call's assistant message; every kept call keeps its answers."""
    for i, message in enumerate(kept):
        if message.role == "tool":
            j = i - 1
            while j >= 0 and kept[j].role == "tool":
                j -= 1
            assert j >= 0, f"orphaned tool answer {message.content}"
            assert kept[j].role == "assistant"
            assert message.tool_call_id in {call["id"] for call in kept[j].tool_calls or []}
        elif message.tool_calls:
            answers = {m.tool_call_id for m in kept[i + 1 : i + 1 + len(message.tool_calls)]}
            assert answers == {call["id"] for call in message.tool_calls}, "a call lost its answers"


@pytest.mark.parametrize("system", [True, False], ids=["with-system", "without-system"])
async def test_trim_keeps_newest_and_never_orphans_tool_messages(db: Database, system: bool) -> None:
    head = [msg("system", "rules")] if system else []
    for keep in range(len(BLOCKY) + 2):
        chat = await new_session(db, head + BLOCKY)
        async with db.unit_of_work() as uow:
            deleted = await uow.messages.trim(chat, keep_last=keep)
        kept = await log_of(db, chat)
        # Expected: the newest ``keep``, then the cut moves forward past tool answers.
        if keep == 0:
            start = len(BLOCKY)
        elif keep >= len(BLOCKY):
            start = 0
        else:
            start = len(BLOCKY) - keep
            while start < len(BLOCKY) and BLOCKY[start]["role"] == "tool":
                start += 1
        expected = [(m["role"], m["content"]) for m in head + BLOCKY[start:]]
        assert [(m.role, m.content) for m in kept] == expected, f"keep_last={keep}"
        assert deleted == start, f"keep_last={keep}"
        assert len(kept) - len(head) <= keep
        assert_no_orphans(kept)


async def test_trim_returns_counts_and_keeps_only_system_at_zero(db: Database) -> None:
    chat = await new_session(db, [msg("system", "rules")] + [msg("user", f"u{i}") for i in range(10)])
    async with db.unit_of_work() as uow:
        assert await uow.messages.trim(chat, keep_last=20) == 0
        assert await uow.messages.trim(chat, keep_last=10) == 0
        assert await uow.messages.trim(chat, keep_last=3) == 7
        assert await uow.messages.trim(chat, keep_last=3) == 0
        with pytest.raises(ValidationError):
            await uow.messages.trim(chat, keep_last=-1)
    assert [m.content for m in await log_of(db, chat)] == ["rules", "u7", "u8", "u9"]
    async with db.unit_of_work() as uow:
        assert await uow.messages.trim(chat, keep_last=0) == 3
        with pytest.raises(NotFoundError):
            await uow.messages.trim(uuid.uuid4(), keep_last=1)
    assert [(m.seq, m.content) for m in await log_of(db, chat)] == [(1, "rules")]
    async with db.unit_of_work() as uow:
        (after,) = await uow.messages.append(chat, msg("user", "next"))
    assert after.seq == 12  # trimming never rewinds the counter


async def test_prepend_goes_right_after_system_without_renumbering(db: Database) -> None:
    chat = await new_session(db, [msg("system", "rules"), msg("user", "u"), msg("assistant", "a")])
    before = {m.content: (m.id, m.seq) for m in await log_of(db, chat)}
    summary = Message(role="user", content="summary-1")
    async with db.unit_of_work() as uow:
        stored = await uow.messages.prepend(chat, [summary, msg("assistant", "summary-2")])
        await uow.messages.prepend(chat, msg("user", "older-summary"))
        (tail,) = await uow.messages.append(chat, msg("user", "next"))
    log = await log_of(db, chat)
    assert [m.content for m in log] == ["rules", "older-summary", "summary-1", "summary-2", "u", "a", "next"]
    assert stored[0] is summary
    assert summary.seq == log[2].seq
    assert [m.seq for m in log] == sorted({m.seq for m in log})  # unique and increasing
    assert {m.content: (m.id, m.seq) for m in log if m.content in ("u", "a")} == {
        "u": before["u"],
        "a": before["a"],
    }
    assert log[0].id == before["rules"][0]
    assert tail.seq == 4  # appends continue from the counter


async def test_edits_are_visible_to_reads_in_the_same_unit_of_work(db: Database) -> None:
    chat = await new_session(db, [msg("system", "rules"), msg("user", "u")])
    async with db.unit_of_work() as uow:
        system, _ = await uow.messages.window(chat)
        await uow.messages.prepend(chat, msg("assistant", "summary"))
        await uow.messages.replace_system(chat, "new rules")
        moved = await uow.messages.get(system.id)
        log = await uow.messages.window(chat)
        context = await uow.messages.context(chat, max_tokens=1000)
    assert (moved.seq, moved.content) == (0, "new rules")
    assert [(m.seq, m.content) for m in log] == [(0, "new rules"), (1, "summary"), (2, "u")]
    assert [m.content for m in context] == ["new rules", "summary", "u"]


async def test_prepend_without_system_goes_first_and_on_empty_session_starts_at_one(db: Database) -> None:
    chat = await new_session(db, [msg("user", "u"), msg("assistant", "a")])
    empty = await new_session(db)
    async with db.unit_of_work() as uow:
        await uow.messages.prepend(chat, [msg("user", "p1"), msg("user", "p2")])
        assert await uow.messages.prepend(chat, []) == []
        await uow.messages.prepend(empty, [msg("user", "p1"), msg("user", "p2")])
        await uow.messages.append(empty, msg("user", "next"))
        with pytest.raises(NotFoundError):
            await uow.messages.prepend(uuid.uuid4(), msg("user", "lost"))
    assert [(m.seq, m.content) for m in await log_of(db, chat)] == [(-1, "p1"), (0, "p2"), (1, "u"), (2, "a")]
    assert [(m.seq, m.content) for m in await log_of(db, empty)] == [(1, "p1"), (2, "p2"), (3, "next")]


async def test_replace_system_updates_the_existing_system_message(db: Database) -> None:
    chat = await new_session(db, [msg("system", "old rules"), msg("user", "u")])
    (old, _) = await log_of(db, chat)
    async with db.unit_of_work() as uow:
        new = await uow.messages.replace_system(chat, "new rules, longer than before")
        assert await uow.messages.count(chat) == 2
    log = await log_of(db, chat)
    assert [(m.id, m.role, m.content) for m in log] == [
        (old.id, "system", "new rules, longer than before"),
        (log[1].id, "user", "u"),
    ]
    assert new.id == old.id
    assert new.seq == old.seq
    assert log[0].token_count == estimate_tokens({"content": "new rules, longer than before"})


async def test_replace_system_creates_one_at_the_front_when_missing(db: Database) -> None:
    chat = await new_session(db, [msg("user", "u"), msg("assistant", "a")])
    empty = await new_session(db)
    async with db.unit_of_work() as uow:
        created = await uow.messages.replace_system(chat, "rules")
        await uow.messages.replace_system(empty, "rules")
        await uow.messages.append(empty, msg("user", "hello"))
        with pytest.raises(ValidationError):
            await uow.messages.replace_system(chat, "nul\x00")
    assert [(m.seq, m.role, m.content) for m in await log_of(db, chat)] == [
        (0, "system", "rules"),
        (1, "user", "u"),
        (2, "assistant", "a"),
    ]
    assert created.seq == 0
    assert [(m.seq, m.role) for m in await log_of(db, empty)] == [(1, "system"), (2, "user")]


async def test_delete_removes_one_message(db: Database) -> None:
    chat = await new_session(db, [msg("user", f"u{i}") for i in range(3)])
    middle = (await log_of(db, chat))[1]
    async with db.unit_of_work() as uow:
        await uow.messages.delete(middle.id)
        with pytest.raises(NotFoundError):
            await uow.messages.get(middle.id)
        with pytest.raises(NotFoundError):
            await uow.messages.delete(middle.id)
    assert [(m.seq, m.content) for m in await log_of(db, chat)] == [(1, "u0"), (3, "u2")]


async def test_delete_after_rewinds_so_the_next_append_continues_at_seq_plus_one(db: Database) -> None:
    chat = await new_session(db, [msg("user", f"u{i}") for i in range(1, 7)])
    async with db.unit_of_work() as uow:
        assert await uow.messages.delete_after(chat, 3) == 3
        (first,) = await uow.messages.append(chat, msg("user", "retry"))
        assert await uow.messages.delete_after(chat, 10) == 0
        (second,) = await uow.messages.append(chat, msg("user", "more"))
    assert (first.seq, second.seq) == (4, 5)
    assert [m.content for m in await log_of(db, chat)] == ["u1", "u2", "u3", "retry", "more"]
    async with db.unit_of_work() as uow:
        assert await uow.messages.delete_after(chat, 0) == 5
        (again,) = await uow.messages.append(chat, msg("user", "fresh"))
    assert again.seq == 1


CONTEXT_LOG = [msg("system", "rules", tokens=10)] + [
    msg("user" if i % 2 else "assistant", f"m{i}", tokens=5) for i in range(1, 7)
]


@pytest.mark.parametrize(
    ("budget", "pinned", "expected"),
    [
        (30, True, ["rules", "m3", "m4", "m5", "m6"]),  # exact fit: 10 + 4 * 5
        (29, True, ["rules", "m4", "m5", "m6"]),
        (10, True, ["rules"]),
        (5, True, ["rules"]),  # the pinned system message survives a budget smaller than itself
        (1000, True, ["rules", "m1", "m2", "m3", "m4", "m5", "m6"]),
        (30, False, ["m1", "m2", "m3", "m4", "m5", "m6"]),  # system is an ordinary, oldest message
        (39, False, ["m1", "m2", "m3", "m4", "m5", "m6"]),
        (40, False, ["rules", "m1", "m2", "m3", "m4", "m5", "m6"]),
        (4, False, []),
    ],
)
async def test_context_fits_the_budget_around_the_system_message(
    db: Database, budget: int, pinned: bool, expected: list[str]
) -> None:
    chat = await new_session(db, CONTEXT_LOG)
    async with db.unit_of_work() as uow:
        window = await uow.messages.context(chat, max_tokens=budget, pinned_system=pinned)
    assert [m.content for m in window] == expected
    assert sum(m.token_count or 0 for m in window[1 if pinned else 0 :]) <= budget


@pytest.mark.parametrize(
    ("budget", "expected"),
    [
        (15, ["done"]),
        (19, ["done"]),
        (20, ["call", "c1", "c2", "done"]),
        (25, ["u", "call", "c1", "c2", "done"]),
    ],
)
async def test_context_never_starts_with_a_tool_answer(
    db: Database, budget: int, expected: list[str]
) -> None:
    log = [
        msg("user", "u", tokens=5),
        msg("assistant", "call", tokens=5, calls=["c1", "c2"]),
        msg("tool", "c1", tokens=5),
        msg("tool", "c2", tokens=5),
        msg("assistant", "done", tokens=5),
    ]
    chat = await new_session(db, [msg("system", "rules", tokens=0), *log])
    async with db.unit_of_work() as uow:
        window = await uow.messages.context(chat, max_tokens=budget)
    assert [m.content for m in window] == ["rules", *expected]


async def test_context_over_a_long_log_reads_past_the_first_scan_chunk(db: Database) -> None:
    chat = await new_session(db, [msg("user", f"m{i}", tokens=1) for i in range(700)])
    async with db.unit_of_work() as uow:
        window = await uow.messages.context(chat, max_tokens=600)
        everything = await uow.messages.context(chat, max_tokens=10_000)
    assert [m.content for m in window] == [f"m{i}" for i in range(100, 700)]
    assert len(everything) == 700


async def test_context_over_a_long_log_of_messages_without_tokens_keeps_them_all(db: Database) -> None:
    # Every row the one-statement scans sum fits, up to budget + 1 rows: the stepwise path takes over.
    log = [msg("user", f"m{i}", tokens=0 if i >= 100 else 5) for i in range(700)]
    chat = await new_session(db, log)
    async with db.unit_of_work() as uow:
        window = await uow.messages.context(chat, max_tokens=300)
    assert [m.content for m in window] == [f"m{i}" for i in range(40, 700)]


async def test_context_rejects_bad_budgets_and_unknown_sessions(db: Database) -> None:
    chat = await new_session(db)
    async with db.unit_of_work() as uow:
        assert await uow.messages.context(chat, max_tokens=100) == []
        with pytest.raises(ValidationError):
            await uow.messages.context(chat, max_tokens=0)
        with pytest.raises(NotFoundError):
            await uow.messages.context(uuid.uuid4(), max_tokens=100)
