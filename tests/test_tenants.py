"""Whole tenants through the API, on both engines.

`list_tenants` and `db.delete_tenant`; and retention (`memorm.retention`) in
one tenant (a `for_tenant` view) or, with `all_tenants=True`, in every one.
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from tenant_data import FILLED, NO_LANGGRAPH, TABLES, WORDS, fill, rows_of

from memorm import Database, NotFoundError, ValidationError
from memorm.retention import Removed, forget, purge_expired, purge_older_than
from memorm.tenants import delete_tenant, list_tenants

# Maintenance across tenants: the role must bypass row-level security, which the
# application role's run (MEMORM_TEST_POSTGRES_ROLE=app) does not.
pytestmark = [pytest.mark.anyio, pytest.mark.owner]


async def warm_vector_cache(db: Database, tenant: str, agents: dict[str, uuid.UUID]) -> None:
    async with db.unit_of_work(tenant, read_only=True) as uow:
        for agent in agents.values():
            assert await uow.passages.search(agent, [1.0, 0.0], k=5)
        assert await uow.passages.search(agents["sam"], [1.0, 0.0, 0.0], k=5, embedding_model="wide")


async def fts_matches(db: Database, word: str) -> dict[str, int]:
    """How many rows the full-text indexes themselves find for `word` (SQLite's FTS5 tables)."""
    async with db.engine.connect() as connection:
        return {
            fts: int(
                await connection.scalar(
                    sa.text(f"SELECT count(*) FROM {fts} WHERE {fts} MATCH :w"), {"w": word}
                )
                or 0
            )
            for fts in ("messages_fts", "archival_passages_fts")
        }


@pytest.mark.owner  # lists every tenant: row-level security shows a tenant's role only its own
async def test_list_tenants_counts_each_tenants_rows_per_table(db: Database) -> None:
    assert await list_tenants(db) == {}
    await fill(db, "globex")
    await fill(db, "acme")
    async with db.unit_of_work("acme") as uow:  # one more message for acme only
        sam = await uow.agents.get_by_name("sam")
        assert sam is not None
        chat = await uow.sessions.create(sam.id)
        await uow.messages.append(chat.id, [{"role": "user", "content": "extra"}])
    tenants = await list_tenants(db)
    assert list(tenants) == ["acme", "globex"]  # by name
    assert tenants["globex"] == FILLED
    assert tenants["acme"] == {**FILLED, "sessions": 4, "messages": 8}


async def test_delete_tenant_removes_every_row_of_it_and_nothing_of_another(db: Database) -> None:
    agents = {tenant: await fill(db, tenant) for tenant in ("acme", "globex", "default")}
    for tenant, ids in agents.items():
        await warm_vector_cache(db, tenant, ids)
    before = {tenant: await rows_of(db, tenant) for tenant in agents}
    if db.dialect == "sqlite":
        assert {key[0] for key in db.vector_cache._entries} == set(agents)
        assert await fts_matches(db, WORDS["acme"]) == {"messages_fts": 7, "archival_passages_fts": 4}

    assert await db.delete_tenant("acme", dry_run=True) == {**FILLED, **NO_LANGGRAPH}
    assert {tenant: await rows_of(db, tenant) for tenant in agents} == before

    assert await db.delete_tenant("acme", batch=2) == {**FILLED, **NO_LANGGRAPH}  # several batches a table
    assert await rows_of(db, "acme") == {
        table.name: (0, hashlib.sha256(b"[]").hexdigest()) for table in TABLES
    }
    assert await rows_of(db, "globex") == before["globex"]
    assert await rows_of(db, "default") == before["default"]
    assert list(await list_tenants(db)) == ["default", "globex"]
    if db.dialect == "sqlite":
        assert {key[0] for key in db.vector_cache._entries} == {"globex", "default"}
        assert await fts_matches(db, WORDS["acme"]) == {"messages_fts": 0, "archival_passages_fts": 0}
        assert await fts_matches(db, WORDS["globex"]) == {"messages_fts": 7, "archival_passages_fts": 4}
    async with db.unit_of_work("globex", read_only=True) as uow:  # the others' search is whole
        hits = await uow.messages.search(agents["globex"]["sam"], WORDS["globex"], limit=10)
        assert len(hits) == 5
        assert len(await uow.passages.search(agents["globex"]["sam"], [1.0, 0.0], k=5)) == 1

    assert await db.delete_tenant("acme") == {**dict.fromkeys(FILLED, 0), **NO_LANGGRAPH}  # nothing left
    async with db.for_tenant("acme").unit_of_work() as uow:  # the name is free to use again
        assert (await uow.agents.create("sam")).name == "sam"


async def test_delete_tenant_reports_each_table_as_its_batches_commit(db: Database) -> None:
    await fill(db, "acme")
    seen: list[tuple[str, str, int]] = []

    class Recorder:
        def start(self, task: str, total: int) -> None:
            seen.append(("start", task, total))

        def advance(self, task: str, rows: int) -> None:
            seen.append(("advance", task, rows))

    await delete_tenant(db, "acme", batch=3, reporter=Recorder())
    starts = [(task, total) for kind, task, total in seen if kind == "start"]
    assert starts == [  # children first: memorm's tables (`DATA_TABLES`) reversed
        ("graph_store_vectors", 0),
        ("graph_store_items", 0),
        ("graph_blobs", 0),
        ("graph_writes", 0),
        ("graph_checkpoints", 0),
        ("archival_passages", 4),
        ("messages", 7),
        ("sessions", 3),
        ("embedding_models", 3),
        ("agents", 2),
    ]
    advanced: dict[str, list[int]] = {}
    for kind, task, rows in seen:
        if kind == "advance":
            advanced.setdefault(task, []).append(rows)
    assert advanced["messages"] == [3, 3, 1]
    assert {task: sum(rows) for task, rows in advanced.items()} == dict(starts)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"tenant": ""}, "tenant: must not be empty"),
        ({"tenant": "x" * 129}, "more than the 128"),
        ({"tenant": "a\x00b"}, "NUL"),
        ({"tenant": 7}, "tenant: expected a string"),
        ({"tenant": "acme", "batch": 0}, "batch"),
        ({"tenant": "acme", "batch": True}, "batch"),
        ({"tenant": "acme", "dry_run": "no"}, "dry_run"),
    ],
)
async def test_delete_tenant_refuses_bad_input_and_deletes_nothing(
    db: Database, arguments: dict[str, Any], message: str
) -> None:
    await fill(db, "acme")
    before = await rows_of(db, "acme")
    with pytest.raises(ValidationError, match=message):
        await db.delete_tenant(**arguments)
    assert await rows_of(db, "acme") == before


# -- retention in one tenant, or across every tenant -------------------------------

NOW = datetime(2030, 6, 1, tzinfo=timezone.utc)
OLD = NOW - timedelta(days=40)
CUTOFF = NOW - timedelta(days=30)


async def history(db: Database, tenant: str, *, ada: bool = False) -> dict[str, uuid.UUID]:
    """In `tenant`, "sam" (and "ada"), each with two old messages and a recent one, an old
    passage and a recent one, and an expired session of two messages.

    The session of the three messages and the old passage are user u42's (`meta`).
    """
    u42 = {"user_id": "u42"}
    ids: dict[str, uuid.UUID] = {}
    async with db.unit_of_work(tenant) as uow:
        for name in ("sam", "ada") if ada else ("sam",):
            agent = await uow.agents.create(name)
            ids[name] = agent.id
            chat = await uow.sessions.create(agent.id, meta=u42)
            await uow.messages.append(
                chat.id,
                [
                    {"role": "user", "content": "old", "created_at": OLD},
                    {"role": "assistant", "content": "old too", "created_at": OLD},
                    {"role": "user", "content": "recent", "created_at": NOW},
                ],
            )
            await uow.passages.add_many(
                agent.id,
                [
                    {"text": "old fact", "embedding": [1.0, 0.0], "created_at": OLD, "meta": u42},
                    {"text": "recent fact", "embedding": [0.0, 1.0], "created_at": NOW},
                ],
            )
            gone = await uow.sessions.create(agent.id)
            await uow.sessions.touch(gone.id, ttl=60, now=OLD)
            await uow.messages.append(
                gone.id,
                [{"role": "user", "content": "bye", "created_at": NOW}] * 2,
            )
    return ids


async def counts_of(db: Database) -> dict[str, dict[str, int]]:
    return {
        tenant: {table: counts[table] for table in ("sessions", "messages", "archival_passages")}
        for tenant, counts in (await list_tenants(db)).items()
    }


async def test_purge_expired_runs_in_the_views_tenant_or_with_all_tenants_in_every_one(db: Database) -> None:
    await history(db, "acme")
    await history(db, "globex")
    acme = db.for_tenant("acme")
    assert await purge_expired(acme, now=NOW, dry_run=True) == Removed(sessions=1, messages=2)
    assert await purge_expired(acme, now=NOW) == Removed(sessions=1, messages=2)
    assert await purge_expired(db, now=NOW) == Removed()  # the default tenant has nothing
    assert await counts_of(db) == {
        "acme": {"sessions": 1, "messages": 3, "archival_passages": 2},
        "globex": {"sessions": 2, "messages": 5, "archival_passages": 2},
    }
    await history(db, "default")
    assert await purge_expired(db, now=NOW, all_tenants=True, dry_run=True) == Removed(sessions=2, messages=4)
    # all_tenants goes across every tenant, whatever the view's tenant
    assert await purge_expired(acme, now=NOW, all_tenants=True, batch=1) == Removed(sessions=2, messages=4)
    assert {tenant: counts["sessions"] for tenant, counts in (await counts_of(db)).items()} == {
        "acme": 1,
        "default": 1,
        "globex": 1,
    }


async def test_purge_older_than_runs_each_agents_deletes_in_its_own_tenant(db: Database) -> None:
    acme = await history(db, "acme", ada=True)
    await history(db, "globex")
    old = Removed(messages=2, passages=1)  # one agent's
    view = db.for_tenant("globex")
    assert await purge_older_than(view, CUTOFF, dry_run=True) == old
    with pytest.raises(NotFoundError, match=f"no agent {acme['sam']}"):  # another tenant's id: unknown
        await purge_older_than(view, CUTOFF, agent=acme["sam"])
    assert await purge_older_than(view, CUTOFF, agent="sam") == old
    assert (await counts_of(db))["acme"]["messages"] == 10

    assert await purge_older_than(db, CUTOFF, agent="sam", all_tenants=True, dry_run=True) == old
    with pytest.raises(NotFoundError, match="no agent named 'bob'"):
        await purge_older_than(db, CUTOFF, agent="bob", all_tenants=True)
    with pytest.raises(NotFoundError, match=f"no agent {uuid.UUID(int=7)}"):
        await purge_older_than(db, CUTOFF, agent=uuid.UUID(int=7), all_tenants=True)
    assert await purge_older_than(db, CUTOFF, agent=acme["ada"], all_tenants=True) == old
    await history(db, "default")
    # Every agent of every tenant: acme's sam and default's sam (globex's and acme's ada are done).
    assert await purge_older_than(db, CUTOFF, all_tenants=True, batch=1) == Removed(messages=4, passages=2)
    assert await counts_of(db) == {
        "acme": {"sessions": 4, "messages": 6, "archival_passages": 2},
        "default": {"sessions": 2, "messages": 3, "archival_passages": 1},
        "globex": {"sessions": 2, "messages": 3, "archival_passages": 1},
    }


async def test_forget_runs_in_the_views_tenant_or_with_all_tenants_in_every_one(db: Database) -> None:
    for tenant in ("acme", "globex", "default"):
        await history(db, tenant)
    u42 = {"user_id": "u42"}
    person = Removed(sessions=1, messages=3, passages=1)  # in one tenant
    assert await forget(db.for_tenant("acme"), u42, dry_run=True) == person
    assert await forget(db.for_tenant("acme"), u42) == person
    assert await forget(db.for_tenant("acme"), u42) == Removed()
    assert await forget(db, u42, all_tenants=True, dry_run=True) == person + person
    assert await forget(db, u42, all_tenants=True) == person + person
    assert await counts_of(db) == {
        tenant: {"sessions": 1, "messages": 2, "archival_passages": 1}
        for tenant in ("acme", "default", "globex")
    }


async def test_retention_refuses_an_all_tenants_that_is_not_a_bool(db: Database) -> None:
    await history(db, "default")
    with pytest.raises(ValidationError, match="all_tenants"):
        await purge_expired(db, all_tenants="yes")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="all_tenants"):
        await purge_older_than(db, CUTOFF, all_tenants=1)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="all_tenants"):
        await forget(db, {"user_id": "u42"}, all_tenants=None)  # type: ignore[arg-type]
    assert (await counts_of(db))["default"] == {"sessions": 2, "messages": 5, "archival_passages": 2}
