"""Isolation: calls scoped to agent A never read or change agent B's rows, whatever ids they are given."""

from __future__ import annotations

import hashlib
from datetime import date
from typing import Any

import pytest
import sqlalchemy as sa

from memorm import Database
from memorm.errors import NotFoundError
from memorm.page import Page
from memorm.types import UUIDType

pytestmark = [pytest.mark.anyio, pytest.mark.reliability]

_V = [1.0, 0.5, 0.25]


async def _agent_hash(db: Database, agent_id: Any) -> str:
    """A hash of every row owned by one agent (its own row included)."""
    digest = hashlib.sha256()
    queries = [
        "SELECT * FROM agents WHERE id = :a",
        "SELECT * FROM sessions WHERE agent_id = :a ORDER BY id",
        "SELECT * FROM messages WHERE agent_id = :a ORDER BY id",
        "SELECT * FROM archival_passages WHERE agent_id = :a ORDER BY id",
        "SELECT * FROM embedding_models WHERE agent_id = :a ORDER BY id",
    ]
    async with db.unit_of_work(read_only=True) as uow:
        for sql in queries:
            statement = sa.text(sql).bindparams(sa.bindparam("a", agent_id, type_=UUIDType()))
            digest.update(repr((await uow.session.execute(statement)).all()).encode())
    return digest.hexdigest()


async def _make(db: Database, name: str) -> dict[str, Any]:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create(name, meta={"topic": "x"})
        chat = await uow.sessions.create(agent.id, key="same-key")
        messages = await uow.messages.append(
            chat.id,
            [
                {"role": "system", "content": "you are shared text"},
                {"role": "user", "content": "shared secret words"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function"}]},
                {"role": "tool", "content": "shared tool answer", "tool_call_id": "c1"},
            ],
        )
        passage = await uow.passages.add(agent.id, "shared secret words", _V, meta={"topic": "x"})
    return {"agent": agent.id, "session": chat.id, "message": messages[1].id, "passage": passage.id}


@pytest.fixture
async def pair(db: Database) -> tuple[dict[str, Any], dict[str, Any]]:
    return await _make(db, "A"), await _make(db, "B")


def _empty(result: Any) -> bool:
    if isinstance(result, Page):
        return result.total == 0 and not result.items
    return result is None or result == 0 or result == []


async def test_cross_agent_calls_never_touch_the_other_agent(
    db: Database, pair: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    a, b = pair
    before_b = await _agent_hash(db, b["agent"])
    d1, d2 = date(2000, 1, 1), date(2100, 1, 1)
    mismatched = {
        "messages.search(A, session=B)": lambda u: u.messages.search(
            a["agent"], "shared", session_id=b["session"]
        ),
        "messages.between(A, session=B)": lambda u: u.messages.between(
            a["agent"], d1, d2, session_id=b["session"]
        ),
        "passages.delete_many(A, [B])": lambda u: u.passages.delete_many(a["agent"], [b["passage"]]),
        "passages.delete_where(A)": lambda u: u.passages.delete_where(a["agent"], {"topic": "x"}),
        "sessions.get_by_key(A, B's key)": lambda u: u.sessions.get_or_create(a["agent"], "same-key"),
    }
    for name, call in mismatched.items():
        try:
            async with db.unit_of_work() as uow:
                result = await call(uow)
        except NotFoundError:
            continue
        if name.startswith("sessions"):
            assert result.agent_id == a["agent"], name
            assert result.id == a["session"], name
        elif name == "passages.delete_where(A)":
            assert result == 1, name  # A's own passage only
        else:
            assert _empty(result), f"{name} exposed {result!r:.200}"
        assert await _agent_hash(db, b["agent"]) == before_b, name
    assert await _agent_hash(db, b["agent"]) == before_b


async def test_searches_scoped_to_a_never_return_b_rows(
    db: Database, pair: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    a, _b = pair
    async with db.unit_of_work(read_only=True) as uow:
        found = (await uow.messages.search(a["agent"], "shared")).items
        found += (await uow.messages.between(a["agent"], date(2000, 1, 1), date(2100, 1, 1))).items
        passages = (await uow.passages.search_text(a["agent"], "shared secret words")).items
        passages += [hit.passage for hit in await uow.passages.search(a["agent"], _V, k=50)]
        passages += [hit.passage for hit in await uow.passages.hybrid_search(a["agent"], "shared", _V, k=50)]
        passages += (await uow.passages.list(a["agent"])).items
        count = await uow.passages.count(a["agent"])
        sessions = (await uow.sessions.list(a["agent"])).items
    assert found
    assert all(m.agent_id == a["agent"] for m in found)
    assert passages
    assert {p.id for p in passages} == {a["passage"]}
    assert count == 1
    assert [s.id for s in sessions] == [a["session"]]


async def test_session_scoped_calls_on_b_leave_a_untouched(
    db: Database, pair: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    # Session-scoped methods take only a session id: B's session must only ever show and change B.
    a, b = pair
    before_a = await _agent_hash(db, a["agent"])
    async with db.unit_of_work() as uow:
        assert all(m.agent_id == b["agent"] for m in await uow.messages.window(b["session"]))
        assert all(
            m.agent_id == b["agent"] for m in await uow.messages.context(b["session"], max_tokens=1000)
        )
        assert await uow.messages.count(b["session"]) == 4
        await uow.messages.trim(b["session"], keep_last=1)
        await uow.messages.delete_after(b["session"], 1)
        popped = await uow.messages.pop(b["session"])
        assert popped is not None
        assert popped.agent_id == b["agent"]
        await uow.messages.prepend(b["session"], {"role": "user", "content": "p"})
        await uow.messages.replace_system(b["session"], "new system")
        await uow.messages.clear(b["session"])
        await uow.messages.append(b["session"], {"role": "user", "content": "after"})
    assert await _agent_hash(db, a["agent"]) == before_a
    async with db.unit_of_work(read_only=True) as uow:
        assert await uow.messages.count(a["session"]) == 4


async def test_b_ids_through_id_only_calls_touch_only_b(
    db: Database, pair: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    # get/update/delete by id are not agent-scoped: they must reach exactly B's row and nothing of A.
    a, b = pair
    before_a = await _agent_hash(db, a["agent"])
    async with db.unit_of_work() as uow:
        assert (await uow.messages.get(b["message"])).agent_id == b["agent"]
        assert (await uow.passages.get(b["passage"])).agent_id == b["agent"]
        assert [p.agent_id for p in await uow.passages.get_many([b["passage"]])] == [b["agent"]]
        await uow.passages.update_text(b["passage"], "changed", [0.0, 1.0, 0.0])
        await uow.messages.delete(b["message"])
        await uow.passages.delete(b["passage"])
        await uow.sessions.delete(b["session"])
        await uow.agents.delete(b["agent"])
    assert await _agent_hash(db, a["agent"]) == before_a
