"""`db.scrub()` and `forget()` say what they cleaned, and what they could not.

On Postgres only the tables' owner (or a superuser) may VACUUM them; the
application role's VACUUM skips every table with a warning in the server's
log, and succeeds.  The scrub names what it skipped (`Scrubbed.skipped`, a
`ScrubWarning`) instead of reporting the work as done.
"""

from __future__ import annotations

import warnings

import asyncpg
import pytest
from conftest import Store, app_role

from memorm import Database
from memorm.retention import forget
from memorm.scrub import Scrubbed, ScrubWarning

pytestmark = pytest.mark.anyio

# Every table a purge, `forget` or `delete_tenant` deletes from, parents first.
TABLES = (
    "agent_names",
    "agents",
    "embedding_models",
    "sessions",
    "messages",
    "archival_passages",
    "graph_checkpoints",
    "graph_writes",
    "graph_blobs",
    "graph_store_items",
    "graph_store_vectors",
)
GIN = ("ix_messages_search_words_fts", "ix_archival_passages_search_words_fts")


async def _person(db: Database, tenant: str = "default") -> None:
    """A session and a passage of user u42, and a passage of no one."""
    async with db.unit_of_work(tenant) as uow:
        agent = await uow.agents.create("bot")
        chat = await uow.sessions.create(agent.id, meta={"user_id": "u42"})
        await uow.messages.append(chat.id, {"role": "user", "content": "my card ends in 4242"})
        await uow.passages.add(agent.id, "u42 prefers email", [1.0, 0.0], meta={"user_id": "u42"})
        await uow.passages.add(agent.id, "refunds take 5 days", [0.0, 1.0])


async def _vacuumed(store: Store) -> set[str]:
    """memorm's tables of the store's schema that VACUUM has processed (the server's statistics)."""
    admin = await asyncpg.connect(store.admin_dsn())
    try:
        rows = await admin.fetch(
            "SELECT relname FROM pg_stat_user_tables WHERE schemaname = $1 AND last_vacuum IS NOT NULL",
            store.schema,
        )
    finally:
        await admin.close()
    return {row["relname"] for row in rows} & set(TABLES)


@pytest.mark.owner  # as the tables' owner: the application role's run is the test below
async def test_forget_reports_the_scrub_it_ran_and_the_owner_skips_nothing(db: Database) -> None:
    await _person(db)
    planned = await forget(db, {"user_id": "u42"}, dry_run=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScrubWarning)  # none is issued
        removed = await forget(db, {"user_id": "u42"})
        again = await db.scrub(reindex=True)
    assert (removed.sessions, removed.messages, removed.passages) == (1, 1, 1)
    assert removed.scrubbed is not None
    assert removed.scrubbed.complete
    if db.dialect == "sqlite":
        assert removed.scrubbed == Scrubbed(merged=("messages_fts", "archival_passages_fts"))
        assert again == removed.scrubbed  # nothing to rebuild on SQLite: reindex is Postgres'
    else:
        assert removed.scrubbed == Scrubbed(vacuumed=TABLES)
        assert again == Scrubbed(vacuumed=TABLES, reindexed=GIN)
    assert planned.scrubbed is None  # a dry run scrubs nothing
    assert planned == removed  # the counts compare, not the scrub
    assert (await forget(db, {"user_id": "u42"})).scrubbed is None  # nothing left: no scrub ran


@pytest.mark.postgres
@pytest.mark.parametrize("engine", ["postgres"], indirect=True)
async def test_the_application_roles_scrub_names_every_table_vacuum_skipped(store: Store) -> None:
    async with app_role(store) as (owner, app, _):
        tenant = app.for_tenant("acme")
        await _person(tenant, "acme")
        with pytest.warns(ScrubWarning, match=f"scrub skipped {', '.join(TABLES)}:") as warned:
            removed = await forget(tenant, {"user_id": "u42"})
        assert len(warned) == 1  # once per scrub
        assert "only their owner (or a superuser) may VACUUM" in str(warned[0].message)
        assert (removed.sessions, removed.messages, removed.passages) == (1, 1, 1)  # the rows did go
        assert removed.scrubbed == Scrubbed(skipped=TABLES)
        assert removed.scrubbed is not None
        assert not removed.scrubbed.complete
        assert await _vacuumed(store) == set()  # and, true to its word, VACUUM cleaned nothing

        with pytest.warns(ScrubWarning, match="ix_messages_search_words_fts"):
            skipped = await app.scrub(reindex=True)  # not an error from REINDEX: skipped, and said so
        assert skipped == Scrubbed(skipped=TABLES + GIN)

        with warnings.catch_warnings():
            warnings.simplefilter("error", ScrubWarning)
            cleaned = await owner.scrub(reindex=True)  # the owner's scrub does it all
        assert cleaned == Scrubbed(vacuumed=TABLES, reindexed=GIN)
        assert await _vacuumed(store) == set(TABLES)
