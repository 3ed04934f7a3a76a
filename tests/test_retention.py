"""Retention (issue #8): session expiry, deleting old history, and forgetting a person."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import count_rows
from hypothesis import given
from hypothesis import strategies as st

from memorm import Agent, Database, NotFoundError, ValidationError
from memorm.models import SESSIONS
from memorm.retention import Removed
from memorm.retention import purge_expired as purge_expired_in_batches
from memorm.search.fts_ddl import FTS_INDEXES

pytestmark = pytest.mark.anyio

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
NOW = datetime(2030, 6, 1, 12, 0, tzinfo=timezone.utc)
FAR_FUTURE = datetime(9000, 1, 1, tzinfo=timezone.utc)
PLUS5 = timezone(timedelta(hours=5))
MICRO = timedelta(microseconds=1)
TABLES = ("agents", "sessions", "messages", "archival_passages", "embedding_models")

SECRET = "zanzibarquux"  # every text of u42; no other word starts with "z" (FTS5 prefix-compresses terms)
OTHER = "pelicanmoss"  # u7's word


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def msg(
    role: str,
    content: str = "",
    created_at: datetime | None = None,
    *,
    calls: tuple[str, ...] = (),
    answers: str | None = None,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A message dict; ``calls``: an assistant's tool call ids; ``answers``: the call a tool answers."""
    out: dict[str, Any] = {"role": role, "content": content}
    if created_at is not None:
        out["created_at"] = created_at
    if calls:
        out["tool_calls"] = [{"id": c, "type": "function", "function": {"name": "f"}} for c in calls]
    if answers is not None:
        out["tool_call_id"] = answers
    if meta is not None:
        out["meta"] = meta
    return out


async def new_agent(db: Database, **options: Any) -> Agent:
    async with db.unit_of_work() as uow:
        return await uow.agents.create(f"agent-{uuid.uuid4().hex[:10]}", **options)


async def new_session(
    db: Database, agent_id: uuid.UUID, messages: list[dict[str, Any]] | None = None, **options: Any
) -> uuid.UUID:
    async with db.unit_of_work() as uow:
        chat = await uow.sessions.create(agent_id, **options)
        if messages:
            await uow.messages.append(chat.id, messages)
    return chat.id


async def table_counts(db: Database) -> dict[str, int]:
    return {table: await count_rows(db, table) for table in TABLES}


async def expiry_of(db: Database, session_id: uuid.UUID) -> datetime | None:
    async with db.unit_of_work(read_only=True) as uow:
        return (await uow.sessions.get(session_id)).expires_at


# -- 1. expiry -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ttl", "lifetime"),
    [
        (timedelta(hours=2), timedelta(hours=2)),
        (7200, timedelta(hours=2)),
        (1.5, timedelta(seconds=1.5)),
        (timedelta(days=365 * 1000), timedelta(days=365 * 1000)),  # the documented maximum
    ],
    ids=["timedelta", "int-seconds", "float-seconds", "1000-years"],
)
async def test_session_ttl_sets_expiry_from_its_creation(db: Database, ttl: Any, lifetime: timedelta) -> None:
    agent = await new_agent(db, retention=60)  # an explicit ttl beats the agent's retention
    async with db.unit_of_work() as uow:
        chat = await uow.sessions.create(agent.id, ttl=ttl)
        keyed = await uow.sessions.get_or_create(agent.id, "k", ttl=ttl)
    async with db.unit_of_work(read_only=True) as uow:
        stored = await uow.sessions.get(chat.id)
        stored_keyed = await uow.sessions.get(keyed.id)
    assert chat.expires_at == chat.created_at + lifetime
    assert stored.expires_at == stored.created_at + lifetime
    assert stored.expires_at.tzinfo == timezone.utc
    assert stored_keyed.expires_at == stored_keyed.created_at + lifetime


async def test_agent_retention_is_the_default_lifetime_of_new_sessions(db: Database) -> None:
    hourly = await new_agent(db, retention=timedelta(hours=1))
    forever = await new_agent(db)
    assert (hourly.retention, forever.retention) == (3600, None)
    async with db.unit_of_work() as uow:
        by_retention = await uow.sessions.create(hourly.id)
        by_ttl = await uow.sessions.create(hourly.id, ttl=timedelta(minutes=5))
        never = await uow.sessions.create(forever.id)
        keyed = await uow.sessions.get_or_create(hourly.id, "chat-1")
    async with db.unit_of_work() as uow:
        # get_or_create applies ttl only to a session it creates.
        again = await uow.sessions.get_or_create(hourly.id, "chat-1", ttl=timedelta(days=9))
        await uow.agents.update(hourly.id, retention=None)
        await uow.agents.update(forever.id, retention=120)
    async with db.unit_of_work() as uow:
        after_change = await uow.sessions.create(hourly.id)
        now_expiring = await uow.sessions.create(forever.id)
    assert await expiry_of(db, by_retention.id) == by_retention.created_at + timedelta(hours=1)
    assert await expiry_of(db, by_ttl.id) == by_ttl.created_at + timedelta(minutes=5)
    assert await expiry_of(db, never.id) is None
    assert await expiry_of(db, keyed.id) == keyed.created_at + timedelta(hours=1)
    assert (again.id, again.expires_at) == (keyed.id, keyed.expires_at)
    # A retention change applies to new sessions only.
    assert await expiry_of(db, after_change.id) is None
    assert await expiry_of(db, now_expiring.id) == now_expiring.created_at + timedelta(seconds=120)
    assert await expiry_of(db, by_retention.id) == by_retention.created_at + timedelta(hours=1)


async def test_touch_sets_expiry_from_now_and_none_clears_it(db: Database) -> None:
    agent = await new_agent(db)
    chat = await new_session(db, agent.id, ttl=60)
    async with db.unit_of_work() as uow:
        touched = await uow.sessions.touch(chat, ttl=timedelta(minutes=30), now=NOW)
    assert touched.expires_at == NOW + timedelta(minutes=30)
    assert await expiry_of(db, chat) == NOW + timedelta(minutes=30)
    async with db.unit_of_work() as uow:
        # The same instant written in UTC+5; seconds as the ttl.
        touched = await uow.sessions.touch(chat, ttl=90, now=(NOW + timedelta(hours=1)).astimezone(PLUS5))
    assert await expiry_of(db, chat) == NOW + timedelta(hours=1, seconds=90)
    assert touched.expires_at == NOW + timedelta(hours=1, seconds=90)
    async with db.unit_of_work() as uow:
        before = datetime.now(timezone.utc)
        await uow.sessions.touch(str(chat), ttl=timedelta(days=1))  # now defaults to the clock
    expires = await expiry_of(db, chat)
    assert expires is not None
    assert before + timedelta(days=1) <= expires <= datetime.now(timezone.utc) + timedelta(days=1)
    async with db.unit_of_work() as uow:
        loaded = await uow.sessions.get(chat)
        cleared = await uow.sessions.touch(chat, ttl=None, now=NOW)
        assert (await uow.sessions.get(chat)).expires_at is None  # not the stale loaded copy
    assert loaded.expires_at is None
    assert cleared.expires_at is None
    assert await expiry_of(db, chat) is None
    async with db.unit_of_work() as uow:
        with pytest.raises(NotFoundError):
            await uow.sessions.touch(uuid.uuid4(), ttl=60)
        with pytest.raises(NotFoundError):
            await uow.sessions.touch(uuid.uuid4(), ttl=None)


BAD_TTLS = [
    0,
    0.0,
    -1,
    -0.5,
    timedelta(0),
    timedelta(seconds=-1),
    1e-7,  # positive, but rounds to a zero timedelta
    math.nan,
    math.inf,
    10**30,
    timedelta.max,
    True,
    False,
    "60",
    [60],
]


async def test_invalid_ttl_or_now_raises_validation_error_and_writes_nothing(db: Database) -> None:
    agent = await new_agent(db)
    chat = await new_session(db, agent.id, [msg("user", "hi")], ttl=60)
    expires = await expiry_of(db, chat)
    counts = await table_counts(db)
    naive = datetime(2030, 1, 1)
    async with db.unit_of_work() as uow:
        for bad in BAD_TTLS:
            with pytest.raises(ValidationError):
                await uow.sessions.create(agent.id, ttl=bad)
            with pytest.raises(ValidationError):
                await uow.sessions.get_or_create(agent.id, "k", ttl=bad)
            with pytest.raises(ValidationError):
                await uow.sessions.touch(chat, ttl=bad, now=NOW)
            with pytest.raises(ValidationError):
                await uow.agents.create(f"bad-{uuid.uuid4().hex}", retention=bad)
            with pytest.raises(ValidationError):
                await uow.agents.update(agent.id, retention=bad)
        with pytest.raises(ValidationError):
            await uow.agents.create("fractional", retention=1.5)  # retention is whole seconds
        with pytest.raises(ValidationError):
            await uow.sessions.touch(chat, ttl=60, now=naive)
        with pytest.raises(ValidationError):
            await uow.sessions.touch(chat, ttl=None, now=naive)
        for now in (naive, "2030-01-01T00:00:00+00:00", 0):
            with pytest.raises(ValidationError):
                await uow.sessions.purge_expired(now=now)  # type: ignore[arg-type]
        for batch in (0, -1, 100_001, True, 2.0, "10"):
            with pytest.raises(ValidationError):
                await uow.sessions.purge_expired(now=FAR_FUTURE, batch=batch)  # type: ignore[arg-type]
    # The unit of work committed: nothing the failed calls began is in the database.
    assert await table_counts(db) == counts
    assert await expiry_of(db, chat) == expires
    async with db.unit_of_work(read_only=True) as uow:
        assert (await uow.agents.get(agent.id)).retention is None


# -- 2. purge_expired --------------------------------------------------------------


async def test_purge_expired_keeps_a_session_until_exactly_its_expiry(db: Database) -> None:
    agent = await new_agent(db)
    doomed = await new_session(db, agent.id, [msg("user", f"doomed {i}") for i in range(3)])
    later = await new_session(db, agent.id, [msg("user", "l1"), msg("user", "l2")])
    forever = await new_session(db, agent.id, [msg("user", "f1"), msg("user", "f2"), msg("user", "f3")])
    async with db.unit_of_work() as uow:
        expires = (await uow.sessions.touch(doomed, ttl=timedelta(hours=1), now=NOW)).expires_at
        await uow.sessions.touch(later, ttl=timedelta(hours=1, microseconds=1), now=NOW)
    assert expires == NOW + timedelta(hours=1)
    counts = await table_counts(db)

    async with db.unit_of_work() as uow:
        assert await uow.sessions.purge_expired(now=expires - MICRO) == Removed()
        assert await uow.sessions.purge_expired(now=(expires - MICRO).astimezone(PLUS5)) == Removed()
        assert await uow.sessions.purge_expired(now=expires, dry_run=True) == Removed(sessions=1, messages=3)
    assert await table_counts(db) == counts

    async with db.unit_of_work() as uow:
        assert await uow.sessions.purge_expired(now=expires) == Removed(sessions=1, messages=3)
    assert await count_rows(db, "sessions") == 2
    assert await count_rows(db, "messages", session_id=doomed) == 0
    assert await count_rows(db, "messages", session_id=later) == 2
    assert await count_rows(db, "messages", session_id=forever) == 3
    async with db.unit_of_work(read_only=True) as uow:
        with pytest.raises(NotFoundError):
            await uow.sessions.get(doomed)
        assert (await uow.messages.search(agent.id, "doomed")).total == 0

    # A session without expires_at is never purged, however late "now" is.
    async with db.unit_of_work() as uow:
        assert await uow.sessions.purge_expired(now=FAR_FUTURE, dry_run=True) == Removed(
            sessions=1, messages=2
        )
        assert await uow.sessions.purge_expired(now=FAR_FUTURE) == Removed(sessions=1, messages=2)
        assert await uow.sessions.purge_expired(now=FAR_FUTURE) == Removed()
    async with db.unit_of_work(read_only=True) as uow:
        assert [m.content for m in await uow.messages.window(forever)] == ["f1", "f2", "f3"]
        assert (await uow.sessions.get(forever)).expires_at is None


async def test_purge_expired_compares_a_now_in_another_timezone_as_the_same_instant(db: Database) -> None:
    agent = await new_agent(db)
    chat = await new_session(db, agent.id, [msg("user", "x")])
    async with db.unit_of_work() as uow:
        # Expires at 17:00 UTC; in UTC+5 that instant reads 22:00, which as UTC would be long past.
        expires = (await uow.sessions.touch(chat, ttl=timedelta(hours=5), now=NOW)).expires_at
    local = expires.astimezone(PLUS5)
    assert local.hour == (expires.hour + 5) % 24
    async with db.unit_of_work() as uow:
        assert await uow.sessions.purge_expired(now=local - MICRO) == Removed()
        assert (
            await uow.sessions.purge_expired(now=NOW.replace(tzinfo=PLUS5) + timedelta(hours=9)) == Removed()
        )
    assert await count_rows(db, "sessions", id=chat) == 1
    async with db.unit_of_work() as uow:
        assert await uow.sessions.purge_expired(now=local) == Removed(sessions=1, messages=1)
    assert await count_rows(db, "sessions", id=chat) == 0


async def _expiring_sessions(db: Database) -> tuple[set[uuid.UUID], set[uuid.UUID]]:
    """Ten sessions expiring 1..10 s after NOW (with 0..9 messages), and two live ones (2 messages each)."""
    agent = await new_agent(db)
    expired, live = set(), set()
    async with db.unit_of_work() as uow:
        for i in range(10):
            chat = await uow.sessions.create(agent.id)
            if i:
                await uow.messages.append(chat.id, [msg("user", f"m{j}") for j in range(i)])
            await uow.sessions.touch(chat.id, ttl=i + 1, now=NOW)
            expired.add(chat.id)
        for ttl in (None, 11):
            chat = await uow.sessions.create(agent.id)
            await uow.messages.append(chat.id, [msg("user", "keep"), msg("assistant", "me")])
            await uow.sessions.touch(chat.id, ttl=ttl, now=NOW)
            live.add(chat.id)
    return expired, live


async def _session_ids(db: Database) -> set[uuid.UUID]:
    async with db.unit_of_work(read_only=True) as uow:
        return set((await uow.session.execute(sa.select(SESSIONS.c.id))).scalars())


@pytest.mark.parametrize("batch", [1, 3, 1000])
async def test_purge_expired_in_batches_deletes_every_expired_session(db: Database, batch: int) -> None:
    _, live = await _expiring_sessions(db)
    cutoff = NOW + timedelta(seconds=10)  # the last one expires exactly now
    async with db.unit_of_work() as uow:
        assert await uow.sessions.purge_expired(now=cutoff, batch=batch, dry_run=True) == Removed(
            sessions=10, messages=45
        )
        assert await uow.sessions.purge_expired(now=cutoff, batch=batch) == Removed(sessions=10, messages=45)
    assert await _session_ids(db) == live
    assert await count_rows(db, "messages") == 4


async def test_batched_purge_runner_commits_batches_with_exact_totals(db: Database) -> None:
    _, live = await _expiring_sessions(db)
    cutoff = NOW + timedelta(seconds=10)
    assert await purge_expired_in_batches(db, now=cutoff, batch=3, dry_run=True) == Removed(
        sessions=10, messages=45
    )
    assert await count_rows(db, "sessions") == 12
    assert await purge_expired_in_batches(db, now=cutoff - timedelta(seconds=5), batch=3) == Removed(
        sessions=5,
        messages=10,  # expiring at 1..5 s, with 0..4 messages
    )
    assert await purge_expired_in_batches(db, now=cutoff, batch=3) == Removed(sessions=5, messages=35)
    assert await _session_ids(db) == live
    assert await count_rows(db, "messages") == 4


# -- 3. messages.delete_before -----------------------------------------------------


async def _contents(db: Database, session_id: uuid.UUID) -> list[str]:
    async with db.unit_of_work(read_only=True) as uow:
        return [m.content for m in await uow.messages.window(session_id, limit=1000)]


async def test_delete_before_removes_strictly_older_messages_of_that_agent_only(db: Database) -> None:
    mine, theirs = await new_agent(db), await new_agent(db)
    timeline = [msg("user", f"m{i}", at(i)) for i in range(6)]
    main = await new_session(db, mine.id, timeline)
    old_only = await new_session(db, mine.id, [msg("user", "o0", at(0)), msg("user", "o2", at(2.9))])
    other = await new_session(db, theirs.id, timeline)
    cutoff = at(3)
    async with db.unit_of_work() as uow:
        assert await uow.messages.delete_before(mine.id, cutoff, dry_run=True) == 5
        assert await uow.messages.delete_before(mine.id, cutoff - MICRO, dry_run=True) == 5
        assert await uow.messages.delete_before(mine.id, at(0), dry_run=True) == 0
    assert await count_rows(db, "messages") == 14
    async with db.unit_of_work() as uow:
        assert await uow.messages.delete_before(str(mine.id), cutoff.astimezone(PLUS5)) == 5
        assert await uow.messages.delete_before(mine.id, cutoff) == 0
    assert await _contents(db, main) == ["m3", "m4", "m5"]  # created exactly at the cutoff: kept
    assert await _contents(db, other) == [f"m{i}" for i in range(6)]
    # An emptied session stays.
    assert await _contents(db, old_only) == []
    async with db.unit_of_work(read_only=True) as uow:
        assert (await uow.sessions.get(old_only)).agent_id == mine.id


async def test_delete_before_with_a_session_touches_only_that_session(db: Database) -> None:
    agent = await new_agent(db)
    first = await new_session(db, agent.id, [msg("user", f"a{i}", at(i)) for i in range(4)])
    second = await new_session(db, agent.id, [msg("user", f"b{i}", at(i)) for i in range(4)])
    async with db.unit_of_work() as uow:
        assert await uow.messages.delete_before(agent.id, at(2), session_id=second, dry_run=True) == 2
        assert await uow.messages.delete_before(agent.id, at(2), session_id=str(second)) == 2
    assert await _contents(db, first) == ["a0", "a1", "a2", "a3"]
    assert await _contents(db, second) == ["b2", "b3"]


async def test_delete_before_rejects_a_foreign_session_unknown_agent_or_naive_cutoff(db: Database) -> None:
    mine, theirs = await new_agent(db), await new_agent(db)
    await new_session(db, mine.id, [msg("user", "a", at(0))])
    foreign = await new_session(db, theirs.id, [msg("user", "b", at(0))])
    async with db.unit_of_work() as uow:
        for dry_run in (False, True):
            with pytest.raises(NotFoundError):
                await uow.messages.delete_before(mine.id, at(5), session_id=foreign, dry_run=dry_run)
            with pytest.raises(NotFoundError):
                await uow.messages.delete_before(mine.id, at(5), session_id=uuid.uuid4(), dry_run=dry_run)
            with pytest.raises(NotFoundError):
                await uow.messages.delete_before(uuid.uuid4(), at(5), dry_run=dry_run)
            with pytest.raises(NotFoundError):
                await uow.messages.delete_before(uuid.uuid4(), at(5), session_id=foreign, dry_run=dry_run)
            with pytest.raises(ValidationError):
                await uow.messages.delete_before(mine.id, datetime(2030, 1, 1), dry_run=dry_run)
            with pytest.raises(ValidationError):
                await uow.messages.delete_before(mine.id, "2030-01-01", dry_run=dry_run)  # type: ignore[arg-type]
    assert await count_rows(db, "messages") == 2


async def test_delete_before_takes_tool_answers_whose_call_it_deleted(db: Database) -> None:
    agent = await new_agent(db)
    chat = await new_session(
        db,
        agent.id,
        [
            msg("system", "rules", at(0)),
            msg("assistant", "", at(1), calls=("c1", "c2")),
            msg("tool", "answer one", at(3), answers="c1"),  # the cutoff splits the block
            msg("tool", "answer two", at(3), answers="c2"),
            msg("assistant", "done", at(4)),
            msg("assistant", "", at(5), calls=("c3",)),
            msg("tool", "answer three", at(6), answers="c3"),
        ],
    )
    untouched = await new_session(
        db, agent.id, [msg("tool", "stray", at(9), answers="c9"), msg("user", "u", at(9))]
    )
    async with db.unit_of_work() as uow:
        assert await uow.messages.delete_before(agent.id, at(2), dry_run=True) == 4
        assert await uow.messages.delete_before(agent.id, at(2), session_id=chat, dry_run=True) == 4
    assert await count_rows(db, "messages") == 9
    async with db.unit_of_work() as uow:
        assert await uow.messages.delete_before(agent.id, at(2)) == 4
    assert await _contents(db, chat) == ["done", "", "answer three"]
    # A session the cutoff did not touch is left as it was.
    assert await _contents(db, untouched) == ["stray", "u"]


async def test_delete_before_takes_split_tool_answers_even_behind_a_prepended_summary(db: Database) -> None:
    # prepend() gives a summary a low seq but a new created_at, so the cutoff
    # can delete a tool call while a newer message still precedes its answers.
    agent = await new_agent(db)
    chat = await new_session(
        db,
        agent.id,
        [
            msg("system", "rules", at(0)),
            msg("user", "question", at(1)),
            msg("assistant", "", at(1), calls=("c1",)),
            msg("tool", "answer", at(3), answers="c1"),
            msg("assistant", "done", at(4)),
        ],
    )
    async with db.unit_of_work() as uow:
        await uow.messages.prepend(chat, msg("user", "summary", at(10)))
    assert await _contents(db, chat) == ["rules", "summary", "question", "", "answer", "done"]
    async with db.unit_of_work() as uow:
        predicted = await uow.messages.delete_before(agent.id, at(2), dry_run=True)
    async with db.unit_of_work() as uow:
        deleted = await uow.messages.delete_before(agent.id, at(2))
    async with db.unit_of_work(read_only=True) as uow:
        kept = await uow.messages.window(chat, limit=100)
    assert [m.content for m in kept] == ["summary", "done"], "a tool answer outlived its deleted call"
    assert deleted == predicted == 4


async def test_deleted_messages_leave_every_read_and_appends_continue(db: Database) -> None:
    agent = await new_agent(db)
    chat = await new_session(
        db,
        agent.id,
        [msg("user", f"apple {i}", at(i)) for i in range(3)]
        + [msg("user", f"banana {i}", at(3 + i)) for i in range(2)],
    )
    async with db.unit_of_work(read_only=True) as uow:
        assert (await uow.messages.search(agent.id, "apple")).total == 3  # the index had them
    async with db.unit_of_work() as uow:
        assert await uow.messages.delete_before(agent.id, at(3)) == 3
    async with db.unit_of_work() as uow:
        assert (await uow.messages.search(agent.id, "apple")).total == 0
        assert (await uow.messages.search(agent.id, "apple", session_id=chat)).total == 0
        assert [m.content for m in await uow.messages.search(agent.id, "banana")] == ["banana 1", "banana 0"]
        between = await uow.messages.between(agent.id, at(-60), at(60))
        assert ([m.content for m in between], between.total) == (["banana 0", "banana 1"], 2)
        assert await uow.messages.count(chat) == 2
        window = await uow.messages.window(chat)
        assert [(m.seq, m.content) for m in window] == [(4, "banana 0"), (5, "banana 1")]
        (added,) = await uow.messages.append(chat, msg("user", "apple again"))
    assert added.seq == 6
    async with db.unit_of_work(read_only=True) as uow:
        assert [m.id for m in await uow.messages.search(agent.id, "apple")] == [added.id]
        assert await uow.messages.count(chat) == 3


# A timeline step: a plain message of a role, or an assistant call with 1-2 tool answers.
_step = st.one_of(
    st.tuples(st.just("say"), st.sampled_from(["system", "user", "assistant"])),
    st.tuples(st.just("call"), st.integers(1, 2)),
)
_timeline = st.lists(st.tuples(_step, st.integers(0, 2), st.integers(0, 2)), max_size=6)


@given(
    sessions=st.lists(_timeline, min_size=1, max_size=3),
    cutoff=st.integers(0, 16),
    scope=st.none() | st.integers(0, 2),
)
async def test_delete_before_dry_run_and_remaining_messages_match_the_rule(
    db: Database, sessions: list[list[tuple[tuple[str, Any], int, int]]], cutoff: int, scope: int | None
) -> None:
    # Each session's clock runs forward (minutes from T0); a tool answer comes
    # ``lag`` minutes after its call, so a cutoff can fall inside a block.
    agent = await new_agent(db)
    model: dict[uuid.UUID, list[tuple[uuid.UUID, str, int]]] = {}  # session -> (id, role, minute)
    for steps in sessions:
        items: list[dict[str, Any]] = []
        clock = 0
        for n, ((kind, arg), gap, lag) in enumerate(steps):
            clock += gap
            if kind == "say":
                items.append(msg(arg, f"w{n}", at(clock)) | {"id": uuid.uuid4()})
                continue
            calls = tuple(f"c{n}-{i}" for i in range(arg))
            items.append(msg("assistant", "", at(clock), calls=calls) | {"id": uuid.uuid4()})
            clock += lag
            items += [msg("tool", f"t{n}", at(clock), answers=c) | {"id": uuid.uuid4()} for c in calls]
        chat = await new_session(db, agent.id, items)
        model[chat] = [(m["id"], m["role"], int((m["created_at"] - T0).total_seconds() // 60)) for m in items]
    chats = list(model)
    only = chats[scope] if scope is not None and scope < len(chats) else None

    expected_kept: set[uuid.UUID] = set()
    for chat, rows in model.items():
        if only is not None and chat != only:
            expected_kept |= {row[0] for row in rows}
            continue
        survivors = [row for row in rows if row[2] >= cutoff]
        if len(survivors) < len(rows):  # a touched session loses the tool answers now at its head
            while survivors and survivors[0][1] == "tool":
                survivors.pop(0)
        expected_kept |= {row[0] for row in survivors}
    total = sum(len(rows) for rows in model.values())

    async with db.unit_of_work() as uow:
        predicted = await uow.messages.delete_before(agent.id, at(cutoff), session_id=only, dry_run=True)
    async with db.unit_of_work() as uow:
        deleted = await uow.messages.delete_before(agent.id, at(cutoff), session_id=only)
    async with db.unit_of_work(read_only=True) as uow:
        kept = {m.id for chat in chats for m in await uow.messages.window(chat, limit=1000)}
    assert kept == expected_kept
    assert deleted == predicted == total - len(expected_kept)


# -- 4. passages.delete_before -----------------------------------------------------


async def _archive_version(db: Database, agent_id: uuid.UUID) -> int:
    async with db.unit_of_work(read_only=True) as uow:
        return (await uow.agents.get(agent_id)).archive_version


async def test_passage_delete_before_is_strict_and_bumps_the_archive_only_when_deleting(db: Database) -> None:
    agent, other = await new_agent(db), await new_agent(db)
    items = [{"text": f"p{i}", "embedding": [1.0, float(i), 0.0], "created_at": at(i)} for i in range(5)]
    async with db.unit_of_work() as uow:
        added = await uow.passages.add_many(agent.id, items)
        await uow.passages.add_many(other.id, items)
    version = await _archive_version(db, agent.id)
    async with db.unit_of_work() as uow:
        assert await uow.passages.delete_before(agent.id, at(0)) == 0
        assert await uow.passages.delete_before(agent.id, at(3), dry_run=True) == 3
        assert await uow.passages.delete_before(agent.id, at(3) - MICRO, dry_run=True) == 3
        with pytest.raises(NotFoundError):
            await uow.passages.delete_before(uuid.uuid4(), at(3))
        with pytest.raises(ValidationError):
            await uow.passages.delete_before(agent.id, datetime(2030, 1, 1))
    assert await _archive_version(db, agent.id) == version  # nothing deleted, nothing bumped
    assert await count_rows(db, "archival_passages") == 10
    async with db.unit_of_work() as uow:
        assert await uow.passages.delete_before(str(agent.id), at(3).astimezone(PLUS5)) == 3
    assert await _archive_version(db, agent.id) > version
    async with db.unit_of_work(read_only=True) as uow:
        assert [p.id for p in await uow.passages.list(agent.id)] == [p.id for p in added[3:]]
        assert await uow.passages.count(other.id) == 5
        for gone in added[:3]:
            with pytest.raises(NotFoundError):
                await uow.passages.get(gone.id)


async def test_deleted_passages_leave_every_search_even_with_a_warm_vector_cache(db: Database) -> None:
    agent = await new_agent(db)
    async with db.unit_of_work() as uow:
        old = await uow.passages.add_many(
            agent.id,
            [
                {"text": f"walrus tusk {i}", "embedding": [1.0, 0.1 * i, 0.0], "created_at": at(i)}
                for i in range(3)
            ],
        )
        new = await uow.passages.add_many(
            agent.id,
            [
                {"text": f"otter den {i}", "embedding": [0.0, 1.0, 0.1 * i], "created_at": at(10 + i)}
                for i in range(2)
            ],
        )
    query = [1.0, 0.0, 0.0]
    async with db.unit_of_work(read_only=True) as uow:
        assert {h.passage.id for h in await uow.passages.search(agent.id, query, k=10)} == {
            p.id for p in old + new
        }
    if db.dialect == "sqlite":
        assert any(key[1] == agent.id for key in db.vector_cache._entries)  # warmed
    async with db.unit_of_work() as uow:
        assert await uow.passages.delete_before(agent.id, at(10)) == 3
    if db.dialect == "sqlite":
        assert not any(key[1] == agent.id for key in db.vector_cache._entries)
    new_ids = {p.id for p in new}
    async with db.unit_of_work(read_only=True) as uow:
        assert {h.passage.id for h in await uow.passages.search(agent.id, query, k=10)} == new_ids
        assert {
            h.passage.id for h in await uow.passages.search(agent.id, query, k=10, metric="l2")
        } == new_ids
        assert (await uow.passages.search_text(agent.id, "walrus")).total == 0
        assert (await uow.passages.search_text(agent.id, "otter")).total == 2
        assert {
            h.passage.id for h in await uow.passages.hybrid_search(agent.id, "walrus tusk", query, k=10)
        } == new_ids


# -- 5. agents.forget --------------------------------------------------------------


@dataclass
class People:
    """u42 and u7's data: ``u42_*`` is what forgetting u42 must remove, the rest must stay."""

    private: uuid.UUID = field(default_factory=uuid.uuid4)  # u42's own agent
    shared: uuid.UUID = field(default_factory=uuid.uuid4)  # an agent both talk to
    seven: uuid.UUID = field(default_factory=uuid.uuid4)  # u7's own agent
    u7_session: uuid.UUID = field(default_factory=uuid.uuid4)
    u42_sessions: list[uuid.UUID] = field(default_factory=list)
    u42_messages: list[uuid.UUID] = field(default_factory=list)
    u42_passages: list[uuid.UUID] = field(default_factory=list)
    kept_shared_passages: set[uuid.UUID] = field(default_factory=set)


U42 = {"user_id": "u42"}
U7 = {"user_id": "u7"}
FORGET_U42 = Removed(agents=1, sessions=3, messages=8, passages=5)


async def _people(db: Database) -> People:
    people = People()
    async with db.unit_of_work() as uow:
        people.private = (await uow.agents.create("u42-private", meta=U42)).id
        people.shared = (await uow.agents.create("shared")).id
        people.seven = (await uow.agents.create("u7-private", meta=U7)).id

        # u42's own agent: two sessions (no meta of their own), passages, a second embedding model.
        for texts in ([f"{SECRET} alpha", f"{SECRET} beta"], [f"{SECRET} gamma"]):
            chat = await uow.sessions.create(people.private)
            stored = await uow.messages.append(
                chat.id, [msg("user", t, meta=U42 if "gamma" in t else None) for t in texts]
            )
            people.u42_sessions.append(chat.id)
            people.u42_messages += [m.id for m in stored]
        stored = await uow.passages.add_many(
            people.private,
            [
                {"text": f"{SECRET} fact one", "embedding": [1.0, 0.0, 0.0]},
                {"text": f"{SECRET} fact two", "embedding": [0.9, 0.1, 0.0], "meta": U42},
                {"text": f"{SECRET} wide", "embedding": [1.0, 0.0], "embedding_model": "wide"},
            ],
        )
        people.u42_passages += [p.id for p in stored]

        # The shared agent: u42's session, u7's session with some of u42's messages in it.
        chat = await uow.sessions.create(people.shared, meta=U42)
        stored = await uow.messages.append(
            chat.id,
            [
                msg("user", f"{SECRET} hello"),
                msg("assistant", f"hi {SECRET}"),
                msg("user", f"{SECRET} bye", meta=U7),
            ],
        )
        people.u42_sessions.append(chat.id)
        people.u42_messages += [m.id for m in stored]
        chat = await uow.sessions.create(people.shared, meta=U7)
        people.u7_session = chat.id
        stored = await uow.messages.append(
            chat.id,
            [
                msg("user", f"{OTHER} one", meta=U7),
                msg("user", f"{SECRET} interjects", meta=U42),
                msg("assistant", f"{OTHER} two"),
                msg("user", f"{SECRET} again", meta={"user_id": "u42", "extra": 1}),
                msg("user", f"{OTHER} three", meta={"user_id": "u77"}),
            ],
        )
        people.u42_messages += [stored[1].id, stored[3].id]
        stored = await uow.passages.add_many(
            people.shared,
            [
                {"text": f"{SECRET} likes tea", "embedding": [1.0, 0.0, 0.0], "meta": U42},
                {
                    "text": f"{SECRET} lives far",
                    "embedding": [0.8, 0.2, 0.0],
                    "meta": {"user_id": "u42", "n": 2},
                },
                {"text": f"{OTHER} likes coffee", "embedding": [0.7, 0.3, 0.0], "meta": U7},
                {"text": f"{OTHER} lives near", "embedding": [0.0, 1.0, 0.0], "meta": U7},
                {"text": f"{OTHER} common knowledge", "embedding": [0.0, 0.0, 1.0]},
            ],
        )
        people.u42_passages += [stored[0].id, stored[1].id]
        people.kept_shared_passages = {p.id for p in stored[2:]}

        # u7's own agent.
        chat = await uow.sessions.create(people.seven, meta=U7)
        await uow.messages.append(chat.id, [msg("user", f"{OTHER} private")])
        await uow.passages.add(people.seven, f"{OTHER} diary", [1.0, 0.0, 0.0])
    return people


async def _warm_vector_cache(db: Database, people: People) -> None:
    async with db.unit_of_work(read_only=True) as uow:
        for agent in (people.private, people.shared, people.seven):
            assert await uow.passages.search(agent, [1.0, 0.0, 0.0], k=10)
        assert await uow.passages.search(people.private, [1.0, 0.0], k=10, embedding_model="wide")
    if db.dialect == "sqlite":
        assert {key[1] for key in db.vector_cache._entries} == {people.private, people.shared, people.seven}


async def _index_traces(db: Database, word: str) -> dict[str, int]:
    """How often the full-text indexes themselves still know ``word`` (not the tables they index)."""
    traces: dict[str, int] = {}
    async with db.engine.connect() as c:
        if db.dialect == "sqlite":
            for fts in ("messages_fts", "archival_passages_fts"):
                found = await c.execute(sa.text(f"SELECT rowid FROM {fts} WHERE {fts} MATCH :w"), {"w": word})
                traces[f"{fts} match"] = len(found.all())
                await c.execute(
                    sa.text(f"CREATE VIRTUAL TABLE temp.vocab USING fts5vocab(main, {fts}, 'row')")
                )
                vocab = await c.execute(sa.text("SELECT doc FROM temp.vocab WHERE term = :w"), {"w": word})
                traces[f"{fts} vocab"] = sum(vocab.scalars())
                await c.execute(sa.text("DROP TABLE temp.vocab"))
                blobs = (await c.execute(sa.text(f"SELECT block FROM {fts}_data"))).scalars()
                traces[f"{fts}_data blobs"] = sum(
                    bytes(b).count(word.encode()) for b in blobs if b is not None
                )
        else:
            if db.distributed:  # the shards' plans are made on the workers: take the setting there
                await c.execute(sa.text("SET LOCAL citus.propagate_set_commands = 'local'"))
            await c.execute(sa.text("SET LOCAL enable_seqscan = off"))
            for index in FTS_INDEXES:
                table, words = index.table.name, index.words
                query = f"FROM {table} WHERE {words} @@ CAST(:q AS tsquery)"
                plan = "\n".join(
                    (await c.execute(sa.text(f"EXPLAIN SELECT id {query}"), {"q": word})).scalars()
                )
                assert index.gin_index in plan, plan  # the query goes through the GIN index
                traces[f"{table} gin"] = (
                    await c.execute(sa.text(f"SELECT count(*) {query}"), {"q": word})
                ).scalar_one()
                stat = sa.text("SELECT coalesce(sum(ndoc), 0) FROM ts_stat(:q) WHERE word = :w")
                traces[f"{table} ts_stat"] = (
                    await c.execute(stat, {"q": f"SELECT {words} FROM {table}", "w": word})
                ).scalar_one()
            await c.rollback()
    return traces


@pytest.mark.owner  # DDL, or plans that differ under row-level security
async def test_forget_erases_a_person_everywhere_and_keeps_everyone_else(db: Database) -> None:
    people = await _people(db)
    before = await table_counts(db)
    secret_traces = await _index_traces(db, SECRET)
    assert all(secret_traces.values()), secret_traces  # the checks below can see the word
    other_traces = await _index_traces(db, OTHER)
    async with db.unit_of_work(read_only=True) as uow:
        assert (await uow.messages.search(people.shared, SECRET)).total == 5
        u7_found = (await uow.messages.search(people.shared, OTHER)).total
        u7_passages = (await uow.passages.search_text(people.shared, OTHER)).total
    assert (u7_found, u7_passages) == (3, 3)

    async with db.unit_of_work() as uow:
        assert await uow.agents.forget(U42, dry_run=True) == FORGET_U42
    assert await table_counts(db) == before
    assert await _index_traces(db, SECRET) == secret_traces

    await _warm_vector_cache(db, people)
    async with db.unit_of_work() as uow:
        assert await uow.agents.forget(U42) == FORGET_U42
    assert await table_counts(db) == {
        "agents": before["agents"] - 1,
        "sessions": before["sessions"] - 3,
        "messages": before["messages"] - 8,
        "archival_passages": before["archival_passages"] - 5,
        "embedding_models": before["embedding_models"] - 2,  # u42's "default" and "wide"
    }
    assert await count_rows(db, "embedding_models", agent_id=people.private) == 0
    if db.dialect == "sqlite":
        assert {key[1] for key in db.vector_cache._entries} == {people.seven}

    # Nothing of u42 through memorm's reads ...
    async with db.unit_of_work(read_only=True) as uow:
        assert (await uow.messages.search(people.shared, SECRET)).total == 0
        window = await uow.messages.between(people.shared, T0, datetime.now(timezone.utc) + timedelta(days=1))
        assert window.total == 3
        assert all(SECRET not in m.content for m in window)
        assert (await uow.passages.search_text(people.shared, SECRET)).total == 0
        for metric in ("cosine", "l2"):
            hits = await uow.passages.search(people.shared, [1.0, 0.0, 0.0], k=10, metric=metric)
            assert {h.passage.id for h in hits} == people.kept_shared_passages
        hybrid = await uow.passages.hybrid_search(people.shared, SECRET, [1.0, 0.0, 0.0], k=10)
        assert {h.passage.id for h in hybrid} == people.kept_shared_passages
        for gone in people.u42_messages:
            with pytest.raises(NotFoundError):
                await uow.messages.get(gone)
        for gone in people.u42_passages:
            with pytest.raises(NotFoundError):
                await uow.passages.get(gone)
        for gone in people.u42_sessions:
            with pytest.raises(NotFoundError):
                await uow.sessions.get(gone)
        with pytest.raises(NotFoundError):
            await uow.agents.get(people.private)
        with pytest.raises(NotFoundError):
            await uow.messages.search(people.private, SECRET)
        with pytest.raises(NotFoundError):
            await uow.passages.search(people.private, [1.0, 0.0, 0.0])

        # ... and u7's data intact.
        assert (await uow.messages.search(people.shared, OTHER)).total == 3
        assert (await uow.passages.search_text(people.shared, OTHER)).total == 3
        assert [m.content for m in await uow.messages.window(people.u7_session)] == [
            f"{OTHER} one",
            f"{OTHER} two",
            f"{OTHER} three",
        ]
        assert (await uow.agents.get(people.seven)).meta == U7
        assert [h.passage.text for h in await uow.passages.search(people.seven, [1.0, 0.0, 0.0])] == [
            f"{OTHER} diary"
        ]
        assert (await uow.messages.search(people.seven, OTHER)).total == 1

    # ... nor in the full-text indexes' own storage (merging rewrites u7's blobs: only presence counts).
    assert await _index_traces(db, SECRET) == dict.fromkeys(secret_traces, 0)
    still = await _index_traces(db, OTHER)
    assert {k: v for k, v in still.items() if "blobs" not in k} == {
        k: v for k, v in other_traces.items() if "blobs" not in k
    }
    assert all(still.values()), still


async def test_forget_matches_with_in_and_is_idempotent(db: Database) -> None:
    people = await _people(db)
    async with db.unit_of_work() as uow:
        assert await uow.agents.forget({"user_id": {"$in": ["u42", "nobody"]}}, dry_run=True) == FORGET_U42
        assert await uow.agents.forget({"user_id": {"$in": ["u42", "u77"]}}) == FORGET_U42 + Removed(
            messages=1
        )
    async with db.unit_of_work() as uow:
        assert await uow.agents.forget(U42) == Removed()
        assert await uow.agents.forget({"user_id": "nobody"}) == Removed()
    async with db.unit_of_work(read_only=True) as uow:
        assert [m.content for m in await uow.messages.window(people.u7_session)] == [
            f"{OTHER} one",
            f"{OTHER} two",
        ]


async def test_forget_narrowed_by_created_at_keeps_newer_rows(db: Database) -> None:
    agent = await new_agent(db)
    chat = await new_session(
        db,
        agent.id,
        [msg("user", f"m{i}", at(i), meta=U42) for i in range(4)] + [msg("user", "u7", at(0), meta=U7)],
    )
    async with db.unit_of_work() as uow:
        await uow.passages.add_many(
            agent.id,
            [{"text": f"p{i}", "embedding": [1.0, 0.0], "created_at": at(i), "meta": U42} for i in range(4)],
        )
    where = {"user_id": "u42", "created_at": {"$gte": at(1), "$lt": at(3)}}
    async with db.unit_of_work() as uow:
        assert await uow.agents.forget(where) == Removed(messages=2, passages=2)
    assert await _contents(db, chat) == ["m0", "m3", "u7"]
    async with db.unit_of_work(read_only=True) as uow:
        assert [p.text for p in await uow.passages.list(agent.id)] == ["p0", "p3"]


async def test_forget_takes_the_tool_answers_of_the_calls_it_deletes(db: Database) -> None:
    # The answer holds what the call fetched about u42, but only the call was tagged.
    agent = await new_agent(db)
    chat = await new_session(
        db,
        agent.id,
        [
            msg("user", "weather?", meta=U7),
            msg("assistant", "", calls=("c1", "c2"), meta=U42),
            msg("tool", f"{SECRET} lives in Oslo", answers="c1"),
            msg("tool", f"{SECRET} is 41", answers="c2", meta=U7),
            msg("assistant", "done", meta=U7),
            msg("assistant", "", calls=("c3",), meta=U7),
            msg("tool", "sunny", answers="c3"),
        ],
    )
    other = await new_session(
        db, agent.id, [msg("assistant", "", calls=("c1",)), msg("tool", "kept", answers="c1")]
    )
    before = await table_counts(db)
    async with db.unit_of_work() as uow:
        assert await uow.agents.forget(U42, dry_run=True) == Removed(messages=3)
    assert await table_counts(db) == before
    async with db.unit_of_work() as uow:
        assert await uow.agents.forget(U42) == Removed(messages=3)
    assert await _contents(db, chat) == ["weather?", "done", "", "sunny"]
    assert await _contents(db, other) == ["", "kept"]
    async with db.unit_of_work(read_only=True) as uow:
        assert (await uow.messages.search(agent.id, SECRET)).total == 0


@pytest.mark.parametrize(
    "where",
    [
        {},
        {"created_at": {"$gte": T0}},
        {"created_at": {"$gte": T0, "$lt": FAR_FUTURE}},
        {"user id": "u42"},
        {"user.id": "u42"},
        {"$where": "1"},
        {"": "u42"},
        {"x" * 65: "u42"},
        {1: "u42"},
        {"user_id": ["u42"]},
        {"user_id": {"u42": 1}},
        {"user_id": {"$nin": ["u7"]}},
        {"user_id": {"$in": []}},
        {"user_id": {"$in": "u42"}},
        {"user_id": {"$in": [["u42"]]}},
        {"user_id": "u42", "created_at": {"$gte": datetime(2024, 1, 1)}},
        {"user_id": "u42", "created_at": "2024-01-01"},
        "u42",
        ["user_id", "u42"],
        None,
    ],
    ids=lambda where: repr(where)[:40],
)
async def test_forget_rejects_a_where_without_a_valid_meta_key_and_changes_nothing(
    db: Database, where: Any
) -> None:
    await _people(db)
    before = await table_counts(db)
    async with db.unit_of_work() as uow:
        for dry_run in (True, False):
            with pytest.raises(ValidationError):
                await uow.agents.forget(where, dry_run=dry_run)
    assert await table_counts(db) == before


# -- 6. type-exact matching ---------------------------------------------------------


async def test_forget_compares_meta_values_type_exactly(db: Database) -> None:
    agent = await new_agent(db)
    values: list[Any] = ["42", 42, "1", 1, True, False, 0, None, "true", "null"]
    sessions: dict[str, uuid.UUID] = {}
    async with db.unit_of_work() as uow:
        for value in values:
            chat = await uow.sessions.create(agent.id, meta={"user_id": value})
            await uow.messages.append(chat.id, msg("user", repr(value)))
            sessions[repr(value)] = chat.id
        missing = await uow.sessions.create(agent.id, meta={"other": 42})
        await uow.passages.add_many(
            agent.id,
            [{"text": repr(v), "embedding": [1.0, 0.0], "meta": {"user_id": v}} for v in values],
        )

    async def forget(where: dict[str, Any]) -> Removed:
        async with db.unit_of_work() as uow:
            return await uow.agents.forget(where)

    async def left() -> tuple[set[str], set[str]]:
        chats = {name for name, chat in sessions.items() if await count_rows(db, "sessions", id=chat)}
        async with db.unit_of_work(read_only=True) as uow:
            texts = {p.text for p in await uow.passages.list(agent.id, limit=100)}
        return chats, texts

    assert await forget({"user_id": 42}) == Removed(sessions=1, messages=1, passages=1)
    remaining = {repr(v) for v in values} - {"42"}
    assert await left() == (remaining, remaining)
    assert await forget({"user_id": {"$in": ["1", True]}}) == Removed(sessions=2, messages=2, passages=2)
    remaining -= {"'1'", "True"}
    assert await left() == (remaining, remaining)
    assert await forget({"user_id": None}) == Removed(sessions=1, messages=1, passages=1)
    remaining -= {"None"}
    assert await left() == (remaining, remaining)
    assert await forget({"user_id": {"$in": [0, "1"]}}) == Removed(sessions=1, messages=1, passages=1)
    remaining -= {"0"}
    assert await left() == (remaining, remaining)
    assert remaining == {"'42'", "1", "False", "'true'", "'null'"}
    assert await count_rows(db, "sessions", id=missing.id) == 1
