"""Recall memory, finding old messages by date: ``between`` bounds, order, paging and scope."""

from __future__ import annotations

import random
import uuid
from datetime import date, datetime, timedelta, timezone

import pytest

from memorm import Database, NotFoundError, ValidationError

pytestmark = pytest.mark.anyio

UTC = timezone.utc


async def make_agent(db: Database, name: str, sessions: int = 1) -> tuple[uuid.UUID, list[uuid.UUID]]:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create(name)
        chats = [(await uow.sessions.create(agent.id)).id for _ in range(sessions)]
    return agent.id, chats


MOMENTS = {
    "eve": datetime(2024, 3, 9, 23, 59, 59, 999999, tzinfo=UTC),
    "midnight": datetime(2024, 3, 10, tzinfo=UTC),
    "noon": datetime(2024, 3, 10, 12, tzinfo=UTC),
    "noon-too": datetime(2024, 3, 10, 12, tzinfo=UTC),
    "last": datetime(2024, 3, 10, 23, 59, 59, 999999, tzinfo=UTC),
    "next": datetime(2024, 3, 11, tzinfo=UTC),
    "after": datetime(2024, 3, 11, 0, 0, 0, 1, tzinfo=UTC),
}


async def seed_moments(db: Database) -> tuple[uuid.UUID, list[uuid.UUID]]:
    agent, chats = await make_agent(db, "diarist", sessions=2)
    _, (other,) = await make_agent(db, "neighbour")
    names = list(MOMENTS)
    random.Random(3).shuffle(names)  # stored out of time order
    async with db.unit_of_work() as uow:
        for i, name in enumerate(names):
            role = "assistant" if name in ("noon", "next") else "user"
            message = {"role": role, "content": name, "created_at": MOMENTS[name]}
            await uow.messages.append(chats[i % 2], message)
        await uow.messages.append(other, {"role": "user", "content": "theirs", "created_at": MOMENTS["noon"]})
    return agent, chats


PARIS, NEW_YORK = timezone(timedelta(hours=1)), timezone(timedelta(hours=-5))


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (date(2024, 3, 10), date(2024, 3, 10), ["midnight", "noon", "noon-too", "last"]),
        (MOMENTS["midnight"], MOMENTS["next"], ["midnight", "noon", "noon-too", "last", "next"]),
        (MOMENTS["eve"], MOMENTS["eve"], ["eve"]),
        (date(2024, 3, 10), MOMENTS["noon"], ["midnight", "noon", "noon-too"]),
        (MOMENTS["last"], date(2024, 3, 11), ["last", "next", "after"]),
        (date(2024, 3, 9), date(2024, 3, 9), ["eve"]),
        (datetime(2024, 3, 10, 1, tzinfo=PARIS), datetime(2024, 3, 10, 18, 59, 59, 999999, NEW_YORK), None),
        (
            datetime(2024, 3, 10, 0, 59, 59, 999999, tzinfo=PARIS),
            datetime(2024, 3, 10, 7, tzinfo=NEW_YORK),
            None,
        ),
        (date(2024, 3, 12), date(2024, 3, 31), []),
    ],
    ids=[
        "whole-day",
        "inclusive",
        "one-instant",
        "date-to-time",
        "time-to-date",
        "day-before",
        "zones",
        "zones-2",
        "empty",
    ],
)
async def test_between_includes_exactly_the_bounds(
    db: Database, start: datetime | date, end: datetime | date, expected: list[str] | None
) -> None:
    agent, _ = await seed_moments(db)
    if expected is None:  # aware non-UTC bounds: compare as instants
        expected = [n for n, t in MOMENTS.items() if start <= t <= end]
        assert expected, "the zoned case must select something"
    async with db.unit_of_work(read_only=True) as uow:
        page = await uow.messages.between(agent, start, end)
    assert sorted(m.content for m in page) == sorted(expected)
    assert page.total == len(expected)
    assert [(m.created_at, m.id) for m in page] == sorted((m.created_at, m.id) for m in page)
    assert all(m.created_at == MOMENTS[m.content] for m in page)


async def test_between_pages_chronologically_within_scope(db: Database) -> None:
    agent, chats = await seed_moments(db)
    start, end = date(2024, 3, 9), date(2024, 3, 11)
    async with db.unit_of_work(read_only=True) as uow:
        full = await uow.messages.between(agent, start, end)
        pages = [await uow.messages.between(agent, start, end, limit=2, offset=o) for o in range(0, 8, 2)]
        in_session = await uow.messages.between(agent, start, end, session_id=chats[1])
        answers = await uow.messages.between(agent, start, end, roles=["assistant"])
    assert [MOMENTS[m.content] for m in full] == sorted(MOMENTS.values())
    assert [(m.created_at, m.id) for m in full] == sorted((m.created_at, m.id) for m in full)  # ties by id
    assert [m.id for p in pages for m in p] == [m.id for m in full]
    assert {p.total for p in pages} == {7}
    assert {m.session_id for m in in_session} == {chats[1]}
    assert in_session.total == 3
    assert [m.content for m in answers] == ["noon", "next"]


async def test_between_rejects_bad_bounds_and_foreign_sessions(db: Database) -> None:
    agent, _ = await seed_moments(db)
    _, (foreign,) = await make_agent(db, "foreigner")
    async with db.unit_of_work(read_only=True) as uow:
        for start, end in [(datetime(2024, 3, 10), date(2024, 3, 11)), ("2024-03-10", date(2024, 3, 11))]:
            with pytest.raises(ValidationError):
                await uow.messages.between(agent, start, end)
        with pytest.raises(ValidationError):
            await uow.messages.between(agent, date(2024, 3, 10), date(2024, 3, 11), limit=0)
        with pytest.raises(NotFoundError):
            await uow.messages.between(agent, date(2024, 3, 10), date(2024, 3, 11), session_id=foreign)
        with pytest.raises(NotFoundError):
            await uow.messages.between(uuid.uuid4(), date(2024, 3, 10), date(2024, 3, 11))
