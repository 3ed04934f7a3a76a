"""Migrations keep data: fill at head, downgrade to 0001 and back, and nothing of 0001's columns changes."""

from __future__ import annotations

import hashlib

import pytest
import sqlalchemy as sa
from conftest import Store

from memorm import Database

pytestmark = [pytest.mark.anyio, pytest.mark.reliability]

# The columns every table has at revision 0001 (later revisions add embedding_models,
# agents.archive_version and sessions.key).
COLUMNS_0001 = {
    "agents": "id, created_at, updated_at, meta, name, system, core_memory, llm_config, version",
    "sessions": "id, created_at, updated_at, meta, agent_id, title, next_seq",
    "messages": "id, created_at, updated_at, meta, session_id, agent_id, seq, role, content, name, "
    "tool_calls, tool_call_id, token_count",
    "archival_passages": "id, created_at, updated_at, meta, agent_id, text, embedding, embedding_half, "
    "embedding_model, embedding_dim",
}


async def _fingerprint(db: Database) -> dict[str, tuple[int, str]]:
    found: dict[str, tuple[int, str]] = {}
    async with db.engine.connect() as connection:
        for table, columns in COLUMNS_0001.items():
            rows = (await connection.execute(sa.text(f"SELECT {columns} FROM {table} ORDER BY id"))).all()
            found[table] = (len(rows), hashlib.sha256(repr(rows).encode()).hexdigest())
    return found


async def _fill(db: Database) -> dict[str, object]:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("sam", system="be kind", core_memory={"human": "likes tea"})
        other = await uow.agents.create("kim", meta={"n": 1})
        chat = await uow.sessions.create(agent.id, title="first", key="k1")
        await uow.messages.append(
            chat.id,
            [
                {"role": "system", "content": "you are sam"},
                {"role": "user", "content": "what is the weather in paris"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "function": {"name": "w"}}]},
                {"role": "tool", "content": "sunny", "tool_call_id": "c1", "name": "w"},
                {"role": "assistant", "content": "it is sunny in paris"},
            ],
        )
        await uow.passages.add(agent.id, "paris is the capital of france", [1.0, 0.0, 0.0])
        await uow.passages.add(agent.id, "tea is a drink", [0.0, 1.0, 0.0])
        await uow.passages.define_model(agent.id, "small", 2, precision="float16")
        await uow.passages.add(agent.id, "half precision paris", [0.5, 0.25], embedding_model="small")
        await uow.passages.add(other.id, "kim's paris note", [1.0, 0.0, 0.0])
    return {"agent": agent.id}


async def _search_works(db: Database, agent_id: object) -> None:
    async with db.unit_of_work(read_only=True) as uow:
        messages = await uow.messages.search(agent_id, "paris")  # type: ignore[arg-type]
        texts = await uow.passages.search_text(agent_id, "paris")  # type: ignore[arg-type]
        nearest = await uow.passages.search(agent_id, [0.9, 0.1, 0.0], k=2)  # type: ignore[arg-type]
        half = await uow.passages.search(agent_id, [0.5, 0.25], k=1, embedding_model="small")  # type: ignore[arg-type]
    assert messages.total == 2
    assert {p.text for p in texts.items} == {"paris is the capital of france", "half precision paris"}
    assert [hit.passage.text for hit in nearest] == ["paris is the capital of france", "tea is a drink"]
    assert [hit.passage.text for hit in half] == ["half precision paris"]


async def test_downgrade_to_0001_keeps_every_row_and_column(store: Store) -> None:
    async with store.database() as db:
        await db.upgrade()
        ids = await _fill(db)
        await _search_works(db, ids["agent"])
        at_head = await _fingerprint(db)
        await db.downgrade("0001")
        assert await db.current_revision() == "0001"
        assert await _fingerprint(db) == at_head


async def test_message_search_is_rebuilt_after_a_round_trip_through_0001(store: Store) -> None:
    # Without passages 0003's backfill has nothing to register, so the round trip completes.
    async with store.database() as db:
        await db.upgrade()
        async with db.unit_of_work() as uow:
            agent = await uow.agents.create("sam")
            chat = await uow.sessions.create(agent.id)
            await uow.messages.append(chat.id, [{"role": "user", "content": f"paris {n}"} for n in range(3)])
        at_head = await _fingerprint(db)
        await db.downgrade("0001")
        await db.upgrade()
        assert await _fingerprint(db) == at_head
        async with db.unit_of_work(read_only=True) as uow:
            assert (await uow.messages.search(agent.id, "paris")).total == 3
            assert (await uow.messages.search(agent.id, "1")).total == 1


async def test_data_and_search_survive_a_round_trip_through_0001(store: Store) -> None:
    async with store.database() as db:
        await db.upgrade()
        ids = await _fill(db)
        at_head = await _fingerprint(db)
        await db.downgrade("0001")
        await db.upgrade()
        assert await _fingerprint(db) == at_head
        await _search_works(db, ids["agent"])
