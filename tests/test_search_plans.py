"""Full-text search that does not scan: whichever plan reads a page, it is the brute-force answer.

`memorm.search.text` counts without scoring and reads a page either by
sorting every match or by walking the agent's rows in relevance order; both
must give exactly the order the engines' own scores (FTS5's `bm25`,
Postgres' `ts_rank`) give, and the statements must stay inside the agent.
"""

from __future__ import annotations

import random
import uuid
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from fts_oracle import oracle_matches, oracle_words
from hypothesis import given
from hypothesis import strategies as st

from memorm import Database, Message
from memorm.search import text as search_text

pytestmark = pytest.mark.anyio

VOCAB = ["amber", "birch", "cedar", "dune", "ember", "fjord", "grove", "heath", "isle", "jade"]
T0 = datetime(2024, 6, 1, 12, 0, tzinfo=timezone.utc)
ROLES = ["user", "assistant", "tool"]
_CORPORA: weakref.WeakKeyDictionary[Database, tuple[uuid.UUID, list[uuid.UUID], list[Message]]] = (
    weakref.WeakKeyDictionary()
)


def _text(rng: random.Random) -> str:
    """Vocabulary words (some repeated) and filler, so rows have many different lengths."""
    chosen = rng.sample(VOCAB, k=rng.randint(1, 6)) * rng.choice([1, 1, 2])
    filler = [f"f{rng.randrange(400)}" for _ in range(rng.choice([0, 0, 1, 3, 12, 80]))]
    words = chosen + filler
    rng.shuffle(words)
    return " ".join(word.upper() if rng.random() < 0.1 else word for word in words)


async def _corpus(db: Database) -> tuple[uuid.UUID, list[uuid.UUID], list[Message]]:
    """Agent ``model`` (two sessions, 400 messages, many created at the same instant), and neighbours.

    Another agent of the tenant and an agent of tenant ``acme`` hold the same texts: their
    matches must never count.
    """
    if db in _CORPORA:  # hypothesis examples share the database
        return _CORPORA[db]
    rng = random.Random(16)
    rows = [
        {
            "role": rng.choice(ROLES),
            "content": _text(rng),
            "created_at": T0 + timedelta(minutes=rng.randrange(30)),
        }
        for _ in range(400)
    ]
    stored = []
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("model")
        chats = [(await uow.sessions.create(agent.id)).id for _ in range(2)]
        stored += await uow.messages.append(chats[0], rows[:250])
        stored += await uow.messages.append(chats[1], rows[250:])
        neighbour = await uow.agents.create("neighbour")
        await uow.messages.append((await uow.sessions.create(neighbour.id)).id, rows)
    async with db.for_tenant("acme").unit_of_work() as uow:
        stranger = await uow.agents.create("model")
        await uow.messages.append((await uow.sessions.create(stranger.id)).id, rows)
    _CORPORA[db] = agent.id, chats, stored
    return _CORPORA[db]


def _model(stored: list[Message], query: str, scope: dict[str, Any]) -> list[uuid.UUID]:
    """Every match in the documented order: fewer distinct words, then newest, then id (descending)."""
    hits = [
        m
        for m in stored
        if oracle_matches(m.content or "", query)
        and m.session_id == scope.get("session_id", m.session_id)
        and m.role in scope.get("roles", [m.role])
    ]
    hits.sort(key=lambda m: m.id, reverse=True)
    hits.sort(key=lambda m: m.created_at, reverse=True)
    hits.sort(key=lambda m: len(set(oracle_words(m.content or ""))))
    return [m.id for m in hits]


@contextmanager
def _statements(db: Database) -> Iterator[list[tuple[str, Any]]]:
    """The SQL (and parameters) sent to the database meanwhile."""
    sent: list[tuple[str, Any]] = []

    def record(
        conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool
    ) -> None:
        sent.append((statement, parameters))

    sa.event.listen(db.engine.sync_engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        sa.event.remove(db.engine.sync_engine, "before_cursor_execute", record)


@pytest.fixture(params=["sorted", "walked"])
def plan(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which plan reads pages: sort every match, or walk the order index whenever it may."""
    if request.param == "walked":
        monkeypatch.setattr(search_text, "SMALL", 0)
        monkeypatch.setattr(search_text, "_WALK_SHARE", 1)
    else:
        monkeypatch.setattr(search_text, "SMALL", 10**9)
    return str(request.param)


@given(
    terms=st.lists(st.sampled_from([*VOCAB, "absent"]), min_size=1, max_size=3),
    limit=st.integers(1, 40),
    offset=st.integers(0, 200),
    scope=st.sampled_from(["agent", "session", "roles"]),
)
async def test_every_page_is_the_brute_force_page(
    db: Database, plan: str, terms: list[str], limit: int, offset: int, scope: str
) -> None:
    agent, chats, stored = await _corpus(db)
    query = " ".join(terms)
    options: dict[str, Any] = {
        "agent": {},
        "session": {"session_id": chats[1]},
        "roles": {"roles": ["user", "tool"]},
    }[scope]
    expected = _model(stored, query, options)
    with _statements(db) as sent:
        async with db.unit_of_work(read_only=True) as uow:
            page = await uow.messages.search(agent, query, limit=limit, offset=offset, **options)
    assert page.total == len(expected)
    assert [m.id for m in page] == expected[offset : offset + limit]
    walked = any("fts_walk" in statement for statement, _ in sent)
    assert walked == (plan == "walked" and offset < len(expected))


async def test_walked_pages_are_served_by_the_walk_alone(db: Database, plan: str) -> None:
    agent, _, stored = await _corpus(db)
    with _statements(db) as sent:
        async with db.unit_of_work(read_only=True) as uow:
            page = await uow.messages.search(agent, "amber", limit=5)
    assert [m.id for m in page] == _model(stored, "amber", {})[:5]
    searches = [statement for statement, _ in sent if "search_words" in statement or "_fts" in statement]
    # A count, then one page statement: the walk filled the page, nothing sorted every match.
    assert len(searches) == 2
    assert ("fts_walk" in searches[1]) == (plan == "walked")
    assert not any("bm25" in s or "ts_rank" in s for s in searches)  # nothing is scored


@pytest.mark.parametrize("query", ["amber", "birch cedar", "dune ember fjord", "jade"])
async def test_order_is_the_engines_own_relevance_order(db: Database, plan: str, query: str) -> None:
    """bm25 (SQLite) and ts_rank (Postgres) put rows with fewer distinct words first, as the order index."""
    agent, _, _ = await _corpus(db)
    terms = list(dict.fromkeys(query.split()))
    async with db.unit_of_work(read_only=True) as uow:
        page = await uow.messages.search(agent, query, limit=1000)
        if db.dialect == "sqlite":
            ranked = await uow.session.execute(
                sa.text(
                    "SELECT m.id FROM messages_fts f JOIN messages m ON m.rowid = f.rowid "
                    "WHERE messages_fts MATCH :q AND m.agent_id = :a "
                    "ORDER BY bm25(messages_fts), m.created_at DESC, m.id DESC"
                ),
                {"q": "search_words : (" + " ".join(f'"{t}"' for t in terms) + ")", "a": agent.hex},
            )
        else:
            ranked = await uow.session.execute(
                sa.text(
                    "SELECT id FROM messages WHERE agent_id = :a AND search_words @@ CAST(:q AS tsquery) "
                    "ORDER BY ts_rank(search_words, CAST(:q AS tsquery), 1) DESC, created_at DESC, id DESC"
                ),
                {"q": " & ".join(f"'{t}'" for t in terms), "a": agent},
            )
        engine_order = [uuid.UUID(str(i)) for i in ranked.scalars()]
    assert len(engine_order) > 10
    assert [m.id for m in page] == engine_order


_OTHER_INDEXES = """
    SELECT i.relname, c.conname FROM pg_index x
    JOIN pg_class i ON i.oid = x.indexrelid
    LEFT JOIN pg_constraint c ON c.conindid = x.indexrelid AND c.conrelid = x.indrelid
    WHERE x.indrelid = 'messages'::regclass AND i.relname <> 'ix_messages_search_words_fts'
"""


async def _explain(db: Database, statement: str, parameters: Any, *, gin_only: bool = False) -> str:
    """The plan the engine would run `statement` with.

    Postgres `gin_only`: with no sequential scans and every other index of
    `messages` dropped, in a transaction that is rolled back.
    """
    async with db.engine.connect() as connection:
        if gin_only:
            await connection.exec_driver_sql("SET LOCAL enable_seqscan = off")
            for index, constraint in (await connection.exec_driver_sql(_OTHER_INDEXES)).all():
                table = "ALTER TABLE messages DROP CONSTRAINT"
                await connection.exec_driver_sql(
                    f"DROP INDEX {index}" if constraint is None else f"{table} {constraint}"
                )
        explain = "EXPLAIN QUERY PLAN " if db.dialect == "sqlite" else "EXPLAIN "
        rows = await connection.exec_driver_sql(explain + statement, parameters)
        plan = "\n".join(str(row[-1]) for row in rows)
        await connection.rollback()
    return plan


@pytest.mark.single_node  # plans of one server (a Citus coordinator plans per shard)
@pytest.mark.owner  # drops indexes (in a rolled-back transaction) to show what the GIN index can do
async def test_count_and_walk_read_the_agents_index_entries(db: Database) -> None:
    agent, _, _ = await _corpus(db)
    search_text_small = search_text.SMALL
    try:
        search_text.SMALL = 10  # the agent's 400 rows stand for a large history
        with _statements(db) as sent:
            async with db.unit_of_work(read_only=True) as uow:
                page = await uow.messages.search(agent, "amber", limit=3)
                rare = await uow.messages.search(agent, "jade birch cedar", roles=["user"], limit=3)
    finally:
        search_text.SMALL = search_text_small
    assert page.total > 100
    assert len(page.items) == 3
    assert rare.total < 10
    count, walk, rare_count, rare_page = [
        (statement, parameters)
        for statement, parameters in sent
        if "search_words" in statement or "_fts" in statement
    ]
    if db.dialect == "sqlite":
        # The count is the FTS5 table alone (the scope token is the owner); the walk reads the order index.
        plan = await _explain(db, *count)
        assert all("VIRTUAL TABLE INDEX" in line for line in plan.splitlines()), plan
        plan = await _explain(db, *walk)
        assert "ix_messages_search_order" in plan, plan
        assert "TEMP B-TREE" not in plan, plan  # rows come in order: the walk stops with the page
        for statement in (rare_count, rare_page):
            plan = await _explain(db, *statement)
            assert "VIRTUAL TABLE INDEX" in plan, plan
    else:
        # The GIN index holds tenant and agent beside the words: it finds the agent's matches only.
        # (The planner would rather read 400 rows by the agent's btree indexes: those are set aside.)
        for statement in (count, rare_count, rare_page):
            plan = await _explain(db, *statement, gin_only=True)
            assert "Bitmap Index Scan on ix_messages_search_words_fts" in plan, plan
            assert "agent_id =" in plan.split("ix_messages_search_words_fts")[1], plan
        plan = await _explain(db, *walk)
        assert "ix_messages_search_order" in plan, plan
        assert "Sort" not in plan, plan  # rows come in order: the walk stops with the page
