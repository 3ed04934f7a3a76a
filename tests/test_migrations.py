"""Migrations: alembic builds exactly the schema the models describe, up and down, on both engines."""

from __future__ import annotations

import json
import sqlite3
import sys
import unicodedata
import uuid
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from conftest import POSTGRES_URL, Store, asyncpg_dsn
from sqlalchemy.engine import Connection, make_url

from memorm import Database, SchemaError, metadata
from memorm.migrate import head_revision, include_name
from memorm.models import AGENTS, EMBEDDING_MODELS, MESSAGES, PASSAGES, SESSIONS
from memorm.types import utcnow

pytestmark = pytest.mark.anyio

TABLES = {"agents", "sessions", "messages", "archival_passages"}
REPO = Path(__file__).resolve().parents[1]
ALEMBIC = Path(sys.executable).parent / "alembic"


async def _tables(db: Database) -> set[str]:
    async with db.engine.connect() as connection:
        names: list[str] = await connection.run_sync(lambda c: sa.inspect(c).get_table_names())
    return set(names)


async def _drift(db: Database) -> list[Any]:
    def compare(connection: Connection) -> list[Any]:
        # The same filter env.py uses: full-text indexes live outside the models.
        opts = {"compare_type": True, "include_name": include_name}
        context = MigrationContext.configure(connection, opts=opts)
        return list(compare_metadata(context, metadata))

    async with db.engine.connect() as connection:
        return await connection.run_sync(compare)


async def _writes_and_reads(db: Database) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create(f"sam-{uuid.uuid4().hex[:8]}")
        chat = await uow.sessions.create(agent.id)
        await uow.messages.append(chat.id, {"role": "user", "content": "hi"})
        await uow.passages.add(agent.id, "fact", [1.0, 2.0])
    async with db.unit_of_work() as uow:
        assert [m.content for m in await uow.messages.window(chat.id)] == ["hi"]
        assert await uow.passages.count(agent.id) == 1


async def test_upgrade_creates_the_tables_at_the_head_revision(store: Store) -> None:
    async with store.database() as db:
        assert await db.current_revision() is None
        await db.upgrade()
        assert await _tables(db) >= TABLES
        assert await db.current_revision() == head_revision()
        await db.upgrade()  # already at head: nothing to do
        assert await db.current_revision() == head_revision()
        await _writes_and_reads(db)


async def test_downgrade_to_base_removes_the_tables_and_upgrade_rebuilds_them(store: Store) -> None:
    async with store.database() as db:
        await db.upgrade()
        await _writes_and_reads(db)
        await db.downgrade("base")
        assert not TABLES & await _tables(db)
        assert await db.current_revision() is None
        with pytest.raises(SchemaError, match="memorm db upgrade"):
            async with db.unit_of_work() as uow:
                await uow.agents.list()
        await db.upgrade()
        assert await _tables(db) >= TABLES
        assert await db.current_revision() == head_revision()
        async with db.unit_of_work() as uow:
            assert (await uow.agents.list()).total == 0  # the old rows went with the tables
        await _writes_and_reads(db)


async def test_migrated_schema_has_no_drift_from_the_models(store: Store) -> None:
    async with store.database() as db:
        await db.upgrade()
        assert await _drift(db) == []
        # The comparison really looks: a column the models lack shows up.
        async with db.engine.begin() as connection:
            await connection.execute(sa.text("ALTER TABLE agents ADD COLUMN stray INTEGER"))
        assert [(d[0], d[2], d[3].name) for d in await _drift(db)] == [("remove_column", "agents", "stray")]


async def test_create_all_stamps_head_and_matches_the_models(store: Store) -> None:
    async with store.database() as db:
        await db.create_all()
        assert await db.current_revision() == head_revision()
        assert await _drift(db) == []
        await _writes_and_reads(db)
        await db.upgrade()  # a created schema counts as migrated: upgrading is a no-op
        await _writes_and_reads(db)


# -- the real `alembic` command line -------------------------------------------


async def _alembic(url: str, *args: str) -> str:
    result = await anyio.run_process(
        [str(ALEMBIC), "-c", "alembic.ini", "-x", f"url={url}", *args], cwd=REPO, check=False
    )
    output = result.stdout.decode() + result.stderr.decode()
    assert result.returncode == 0, f"alembic {' '.join(args)} failed:\n{output}"
    return output


async def _cli_round_trip(url: str, tables: Any) -> None:
    await _alembic(url, "upgrade", "head")
    assert await tables() >= TABLES
    assert head_revision() in await _alembic(url, "current")
    assert "No new upgrade operations detected" in await _alembic(url, "check")
    await _alembic(url, "downgrade", "base")
    assert not TABLES & await tables()


async def test_alembic_command_line_upgrades_checks_and_downgrades(engine: str, tmp_path: Path) -> None:
    if engine == "sqlite":
        path = tmp_path / "cli.db"

        async def sqlite_tables() -> set[str]:
            with sqlite3.connect(path) as connection:
                rows = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
            return {name for (name,) in rows}

        await _cli_round_trip(f"sqlite+aiosqlite:///{path}", sqlite_tables)
        return

    # The CLI cannot take a search_path, so it gets a database of its own.
    name = f"memorm_cli_{uuid.uuid4().hex[:12]}"
    url = make_url(POSTGRES_URL).set(database=name)
    admin = await asyncpg.connect(asyncpg_dsn())
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')

        async def postgres_tables() -> set[str]:
            connection = await asyncpg.connect(asyncpg_dsn(url.render_as_string(hide_password=False)))
            try:
                rows = await connection.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            finally:
                await connection.close()
            return {row["tablename"] for row in rows}

        await _cli_round_trip(url.render_as_string(hide_password=False), postgres_tables)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


# -- 0006: search words computed by memorm -----------------------------------------

# Texts that 0005's full-text indexes could not all find (issue #12).
LEGACY_TEXTS = [
    "İstanbul'da",
    unicodedata.normalize("NFD", "café crème"),
    "ΟΔΟΣ",
    "lorem " * 20_000 + "needle",
    "y" * 3_000,
]
BULK = 2_100  # more rows than one batch of 0006's backfill
EMPTY_AGENT = {"core_memory": {}, "llm_config": {}, "version": 1}
LEGACY_QUERIES = {"İSTANBUL": 0, "CAFÉ": 1, "οδος": 2, "needle": 3, "Y" * 3_000: 4, "lorem": 3}


async def _insert_at_0005(db: Database) -> uuid.UUID:
    """An agent, a session, messages and passages as 0005-era code wrote them: raw inserts."""
    agent, chat, now = uuid.uuid4(), uuid.uuid4(), utcnow()

    async def insert(connection: Any, model: sa.Table, *rows: dict[str, Any]) -> None:
        common = {"created_at": now, "updated_at": now, "meta": {}}
        rows = tuple({"id": uuid.uuid4(), **common, **row} for row in rows)
        clause = sa.table(model.name, *(sa.column(name, model.c[name].type) for name in rows[0]))
        await connection.execute(sa.insert(clause), list(rows))

    texts = LEGACY_TEXTS + [f"bulk {n}" for n in range(BULK)]
    async with db.engine.begin() as c:
        await insert(c, AGENTS, {"id": agent, "name": "legacy", "system": ""} | EMPTY_AGENT)
        await insert(c, SESSIONS, {"id": chat, "agent_id": agent, "next_seq": len(texts) + 1})
        await insert(
            c, EMBEDDING_MODELS, {"agent_id": agent, "name": "default", "dim": 2, "precision": "float32"}
        )
        message = {"session_id": chat, "agent_id": agent, "role": "user"}
        await insert(
            c, MESSAGES, *({**message, "seq": seq, "content": text} for seq, text in enumerate(texts, 1))
        )
        passage = {
            "agent_id": agent,
            "embedding": [1.0, 0.0],
            "embedding_model": "default",
            "embedding_dim": 2,
        }
        await insert(c, PASSAGES, *({**passage, "text": text} for text in LEGACY_TEXTS))
    return agent


async def _legacy_found(db: Database, agent: uuid.UUID) -> dict[str, tuple[list[str], list[str]]]:
    found = {}
    async with db.unit_of_work(read_only=True) as uow:
        for query in LEGACY_QUERIES:
            messages = await uow.messages.search(agent, query)
            passages = await uow.passages.search_text(agent, query)
            found[query[:20]] = ([m.content[:20] for m in messages], [p.text[:20] for p in passages])
    return found


async def test_0006_computes_the_search_words_of_rows_written_before_it(store: Store) -> None:
    expected = {
        query[:20]: ([LEGACY_TEXTS[i][:20]], [LEGACY_TEXTS[i][:20]]) for query, i in LEGACY_QUERIES.items()
    }
    async with store.database() as db:
        await db.upgrade("0005")
        agent = await _insert_at_0005(db)
        await db.upgrade()
        assert await _drift(db) == []
        assert await _legacy_found(db, agent) == expected
        async with db.unit_of_work(read_only=True) as uow:
            assert (await uow.messages.search(agent, "bulk")).total == BULK
            assert [m.content for m in await uow.messages.search(agent, str(BULK - 1))] == [
                f"bulk {BULK - 1}"
            ]
        # Down to 0005 the old indexes are back (and the column gone); up again, all is found.
        await db.downgrade("0005")
        async with db.engine.connect() as connection:
            columns = await connection.run_sync(lambda c: sa.inspect(c).get_columns("messages"))
            assert "search_words" not in {column["name"] for column in columns}
            if db.dialect == "sqlite":
                old = "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH 'needle'"
            else:
                old = (
                    "SELECT count(*) FROM messages WHERE to_tsvector('simple'::regconfig, "
                    "regexp_replace(left(content, 100000), '[^[:alnum:]]+', ' ', 'g')) "
                    "@@ plainto_tsquery('simple', 'lorem')"
                )
            assert (await connection.exec_driver_sql(old)).scalar() == 1
        await db.upgrade()
        assert await _legacy_found(db, agent) == expected
        async with db.unit_of_work() as uow:  # and new rows beside the migrated ones
            chat = (await uow.sessions.list(agent)).items[0]
            await uow.messages.append(chat.id, {"role": "user", "content": "İSTANBUL again"})
        async with db.unit_of_work(read_only=True) as uow:
            assert (await uow.messages.search(agent, "i̇stanbul")).total == 2


async def test_0007_lets_assistant_messages_have_no_content_and_keeps_what_search_finds(store: Store) -> None:
    async with store.database() as db:
        await db.upgrade("0005")
        agent = await _insert_at_0005(db)
        await db.upgrade("0006")
        async with db.engine.begin() as connection:  # gaps in the rowids, which the SQLite rebuild closes
            await connection.execute(MESSAGES.delete().where(MESSAGES.c.content.like("bulk 1%")))
        await db.upgrade("0007")
        await db.upgrade()  # the API needs head
        assert await _drift(db) == []
        bulk = BULK - sum(1 for n in range(BULK) if str(n).startswith("1"))
        expected = {
            query[:20]: ([LEGACY_TEXTS[i][:20]], [LEGACY_TEXTS[i][:20]])
            for query, i in LEGACY_QUERIES.items()
        }
        assert await _legacy_found(db, agent) == expected
        async with db.unit_of_work() as uow:
            chat = (await uow.sessions.list(agent)).items[0].id
            await uow.messages.append(
                chat, {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}
            )
            await uow.messages.append(chat, {"role": "user", "content": "bulk again"})
        async with db.unit_of_work(read_only=True) as uow:
            assert (await uow.messages.search(agent, "bulk")).total == bulk + 1
            assert [m.content for m in await uow.messages.window(chat, limit=2)] == [None, "bulk again"]
        async with db.engine.begin() as connection:  # the database keeps NULL to assistant messages
            with pytest.raises(sa.exc.IntegrityError):
                await connection.execute(
                    MESSAGES.update().where(MESSAGES.c.role == "user").values(content=None)
                )
        await db.downgrade("0006")  # content is required again: NULL becomes ''
        async with db.engine.connect() as connection:
            stored = MESSAGES.c.content
            query = sa.select(stored).order_by(MESSAGES.c.seq.desc()).limit(2)
            assert list((await connection.execute(query)).scalars()) == ["bulk again", ""]
            if db.dialect == "sqlite":  # the rebuilt FTS5 index finds every row
                found = "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH 'bulk'"
                assert (await connection.exec_driver_sql(found)).scalar() == bulk + 1
        await db.upgrade()
        assert await _legacy_found(db, agent) == expected


async def test_0008_puts_every_row_in_the_default_tenant_and_round_trips(store: Store) -> None:
    async with store.database() as db:
        await db.upgrade("0005")
        agent = await _insert_at_0005(db)
        await db.upgrade("0007")
        before = await _rows_by_table(db)
        await db.upgrade()  # 0008, and on to head for the API
        assert await _drift(db) == []
        after = await _rows_by_table(db)
        assert {name: {row[1:] for row in rows} for name, rows in after.items()} == {
            name: set(rows) for name, rows in before.items()
        }  # every row kept, as it was, with "default" in front
        assert {row[0] for rows in after.values() for row in rows} == {"default"}
        expected = {
            query[:20]: ([LEGACY_TEXTS[i][:20]], [LEGACY_TEXTS[i][:20]])
            for query, i in LEGACY_QUERIES.items()
        }
        assert await _legacy_found(db, agent) == expected
        async with db.unit_of_work("acme") as uow:  # the same name in another tenant is no conflict
            other = await uow.agents.create("legacy")
            chat = await uow.sessions.create(other.id)
            await uow.messages.append(chat.id, {"role": "user", "content": "needle in acme"})
        async with db.unit_of_work("acme", read_only=True) as uow:
            assert (await uow.messages.search(other.id, "needle")).total == 1
            assert (await uow.agents.list()).total == 1
        with pytest.raises(RuntimeError, match="tenant 'acme'"):
            await db.downgrade("0007")
        assert await db.current_revision() == head_revision()
        await db.delete_tenant("acme")
        await db.downgrade("0007")
        assert await _rows_by_table(db) == before
        await db.upgrade()
        assert await _legacy_found(db, agent) == expected


async def _rows_by_table(db: Database) -> dict[str, set[tuple[Any, ...]]]:
    """Every row of every table (the columns it has at this revision), read raw."""
    found: dict[str, set[tuple[Any, ...]]] = {}
    async with db.engine.connect() as connection:
        for table in (AGENTS, SESSIONS, MESSAGES, PASSAGES, EMBEDDING_MODELS):
            names: list[str] = await connection.run_sync(
                lambda c, t=table: [column["name"] for column in sa.inspect(c).get_columns(t.name)]
            )
            ordered = (["tenant"] if "tenant" in names else []) + sorted(
                n
                for n in names
                if n not in ("tenant", "search_words", "search_size")  # derived
            )
            rows = await connection.execute(sa.text(f"SELECT {', '.join(ordered)} FROM {table.name}"))
            found[table.name] = {tuple(_hashable(value) for value in row) for row in rows}
    return found


def _hashable(value: Any) -> Any:
    """JSON documents (dicts on Postgres) as canonical text, other objects (vectors, times) as text."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return value if isinstance(value, (str, int, float, bytes, type(None), uuid.UUID)) else str(value)
