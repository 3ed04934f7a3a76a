"""Migrations keep data: fill at head, downgrade to 0001 and back, and nothing of 0001's columns changes."""

from __future__ import annotations

import hashlib
import uuid
from datetime import timedelta

import pytest
import sqlalchemy as sa
from conftest import Store

from memorm import Database
from memorm.migrate import head_revision
from memorm.models import AGENTS, MESSAGES, SESSIONS
from memorm.retention import Removed
from memorm.types import utcnow

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


# -- 0005 (sessions.expires_at, agents.retention) ---------------------------------------

# Revision 0004's columns: 0001's, agents.archive_version and embedding_models (0003), sessions.key (0004).
COLUMNS_0004 = {
    **COLUMNS_0001,
    "agents": COLUMNS_0001["agents"] + ", archive_version",
    "sessions": COLUMNS_0001["sessions"] + ", key",
    "embedding_models": "id, created_at, updated_at, meta, agent_id, name, dim, precision",
}


async def _fingerprint_0004(db: Database) -> dict[str, tuple[int, str]]:
    found: dict[str, tuple[int, str]] = {}
    async with db.engine.connect() as connection:
        for table, columns in COLUMNS_0004.items():
            rows = (await connection.execute(sa.text(f"SELECT {columns} FROM {table} ORDER BY id"))).all()
            found[table] = (len(rows), hashlib.sha256(repr(rows).encode()).hexdigest())
    return found


async def _columns(db: Database, table: str) -> set[str]:
    async with db.engine.connect() as connection:
        found = await connection.run_sync(lambda c: sa.inspect(c).get_columns(table))
    return {column["name"] for column in found}


async def _retention_values(db: Database) -> tuple[int, int]:
    """How many sessions have an ``expires_at`` and how many agents a ``retention``."""
    async with db.engine.connect() as connection:
        expiring = (
            await connection.execute(sa.text("SELECT count(*) FROM sessions WHERE expires_at IS NOT NULL"))
        ).scalar_one()
        retained = (
            await connection.execute(sa.text("SELECT count(*) FROM agents WHERE retention IS NOT NULL"))
        ).scalar_one()
    return int(expiring), int(retained)


async def _drift(db: Database) -> list[object]:
    """What alembic's autogenerate would change to match the models (as ``memorm check`` does)."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from memorm import metadata
    from memorm.migrate import include_name

    def compare(connection: sa.Connection) -> list[object]:
        opts = {"compare_type": True, "include_name": include_name}
        return list(compare_metadata(MigrationContext.configure(connection, opts=opts), metadata))

    async with db.engine.connect() as connection:
        return await connection.run_sync(compare)


async def _fill_with_expiry(db: Database) -> dict[str, object]:
    """``_fill``, then an agent retention, an expiring session and one that never expires."""
    ids = await _fill(db)
    async with db.unit_of_work() as uow:
        sam = ids["agent"]
        await uow.agents.update(sam, retention=timedelta(days=7))  # type: ignore[arg-type]
        brief = await uow.sessions.create(sam, title="brief", key="k2")  # type: ignore[arg-type]
        await uow.messages.append(brief.id, {"role": "user", "content": "a brief chat"})
        lasting = await uow.sessions.create(sam, title="lasting", ttl=timedelta(days=30))  # type: ignore[arg-type]
        await uow.sessions.touch(lasting.id, ttl=None)
        chats = (await uow.sessions.list(sam)).items  # type: ignore[arg-type]
        first = next(chat for chat in chats if chat.key == "k1")
        await uow.sessions.touch(first.id, ttl=timedelta(hours=1))
    assert await _retention_values(db) == (2, 1)  # "first" and "brief" expire; sam has a retention
    return {**ids, "brief": brief.id}


async def _insert_at_0004(db: Database) -> dict[str, uuid.UUID]:
    """Rows written by 0004-era code: raw inserts of exactly the columns 0004 has."""

    def table(model: sa.Table, columns: str) -> sa.TableClause:
        return sa.table(model.name, *(sa.column(name, model.c[name].type) for name in columns.split(", ")))

    agent, chat, now = uuid.uuid4(), uuid.uuid4(), utcnow()
    common = {"created_at": now, "updated_at": now, "meta": {"era": "0004"}}
    async with db.engine.begin() as connection:
        await connection.execute(
            sa.insert(table(AGENTS, COLUMNS_0004["agents"])),
            {**common, "id": agent, "name": "legacy", "system": "", "core_memory": {}, "llm_config": {}}
            | {"version": 1, "archive_version": 0},
        )
        await connection.execute(
            sa.insert(table(SESSIONS, COLUMNS_0004["sessions"])),
            {**common, "id": chat, "agent_id": agent, "title": "old times", "next_seq": 3, "key": "legacy-1"},
        )
        await connection.execute(
            sa.insert(table(MESSAGES, COLUMNS_0004["messages"])),
            [
                {
                    **common,
                    "id": uuid.uuid4(),
                    "session_id": chat,
                    "agent_id": agent,
                    "seq": seq,
                    "role": role,
                }
                | {
                    "content": content,
                    "name": None,
                    "tool_calls": None,
                    "tool_call_id": None,
                    "token_count": 5,
                }
                for seq, role, content in (
                    (1, "user", "legacy paris question"),
                    (2, "assistant", "legacy answer"),
                )
            ],
        )
    return {"agent": agent, "session": chat}


async def _schema(db: Database) -> dict[str, object]:
    """Tables with their columns, indexes, unique and foreign keys, and (SQLite) triggers, as reflected."""

    def reflect(connection: sa.Connection) -> dict[str, object]:
        inspector = sa.inspect(connection)
        found: dict[str, object] = {}
        for name in sorted(inspector.get_table_names()):
            found[name] = (
                sorted((c["name"], str(c["type"]), c["nullable"]) for c in inspector.get_columns(name)),
                sorted(
                    (i["name"], tuple(i["column_names"]), i["unique"]) for i in inspector.get_indexes(name)
                ),
                sorted((u["name"], tuple(u["column_names"])) for u in inspector.get_unique_constraints(name)),
                sorted(
                    (f["name"], f["referred_table"], f["options"].get("ondelete"))
                    for f in inspector.get_foreign_keys(name)
                ),
            )
        if connection.dialect.name == "sqlite":
            triggers = connection.exec_driver_sql(
                "SELECT name, sql FROM sqlite_master WHERE type = 'trigger'"
            )
            found["triggers"] = sorted(tuple(row) for row in triggers)
        return found

    async with db.engine.connect() as connection:
        return await connection.run_sync(reflect)


async def test_downgrade_to_0004_keeps_every_row_and_column_of_0004(store: Store) -> None:
    async with store.database() as db:
        await db.upgrade("0004")
        schema_0004 = await _schema(db)
        await db.upgrade()
        await _fill_with_expiry(db)
        at_head = await _fingerprint_0004(db)
        await db.downgrade("0004")
        assert await db.current_revision() == "0004"
        assert await _fingerprint_0004(db) == at_head
        assert "expires_at" not in await _columns(db, "sessions")
        assert "retention" not in await _columns(db, "agents")
        assert await _schema(db) == schema_0004, "the downgrade left a schema unlike 0004's"


async def test_upgrade_from_0004_keeps_rows_adds_no_expiry_and_search_works(store: Store) -> None:
    async with store.database() as db:
        await db.upgrade()
        ids = await _fill_with_expiry(db)
        await db.downgrade("0004")
        legacy = await _insert_at_0004(db)
        at_0004 = await _fingerprint_0004(db)

        await db.upgrade()
        assert await db.current_revision() == head_revision()
        assert await _fingerprint_0004(db) == at_0004
        assert await _retention_values(db) == (0, 0), "expiry dropped by the downgrade must not come back"
        assert await _drift(db) == [], "the round trip through 0004 left the schema unlike the models"
        await _search_works(db, ids["agent"])
        async with db.unit_of_work() as uow:
            assert (await uow.messages.search(legacy["agent"], "legacy")).total == 2
            assert (await uow.sessions.get_by_key(legacy["agent"], "legacy-1")) is not None
            [appended] = await uow.messages.append(
                legacy["session"], {"role": "user", "content": "legacy follow up"}
            )
            assert appended.seq == 3
            # Nothing expires after the upgrade, until told to.
            assert (
                await uow.sessions.purge_expired(now=utcnow() + timedelta(days=3650), dry_run=True)
                == Removed()
            )
            await uow.sessions.touch(legacy["session"], ttl=timedelta(seconds=1))
        async with db.unit_of_work() as uow:
            gone = await uow.sessions.purge_expired(now=utcnow() + timedelta(minutes=1))
        assert gone == Removed(sessions=1, messages=3)

        # And round again: the upgraded database goes down to 0004 and back without loss.
        again = await _fingerprint_0004(db)
        await db.downgrade("0004")
        assert await _fingerprint_0004(db) == again
        await db.upgrade()
        assert await _fingerprint_0004(db) == again
        assert await _drift(db) == []
        await _search_works(db, ids["agent"])
