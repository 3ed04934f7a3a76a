"""One set of limits on both engines: integers, timestamps and dates accepted exactly as documented.

Each property draws a value for one argument and checks the outcome against
the limit in ``docs/concepts.md`` ("Limits"): outside it, a ``ValidationError``
that names the argument, with every row unchanged; inside it, no
``ValidationError`` (a ``ConflictError`` for a stale version is fine).  Both
engines must give the same answer, so SQLite no longer accepts what Postgres
refuses.  Timestamps that are accepted are stored for real and read back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import date, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from memorm import Database
from memorm.errors import ValidationError
from memorm.uow import UnitOfWork
from memorm.validation import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, MAX_COUNT, MAX_TIME, MIN_TIME
from reliability.hostile_kit import (
    Sweep,
    base_rows,
    record,
    report_counts,
)

pytestmark = [pytest.mark.anyio, pytest.mark.reliability, pytest.mark.long]
_ = report_counts  # an autouse fixture: imported so pytest finds it here

UTC = timezone.utc
V3 = [1.0, 0.5, 0.25]
MAX_SECONDS = 365 * 1000 * 86400  # a ttl or retention: at most 1,000 years
Builder = Callable[[UnitOfWork, dict[str, Any], Any], Awaitable[Any]]


def _message(**fields: Any) -> dict[str, Any]:
    return {"role": "user", "content": "x", **fields}


# argument -> (lowest accepted, highest accepted, the call with that argument set)
INTEGERS: dict[str, tuple[int, int, Builder]] = {
    "offset/sessions.list": (0, MAX_COUNT, lambda u, b, v: u.sessions.list(b["agent"], offset=v)),
    "offset/agents.list": (0, MAX_COUNT, lambda u, b, v: u.agents.list(offset=v)),
    "offset/passages.list": (0, MAX_COUNT, lambda u, b, v: u.passages.list(b["agent"], offset=v)),
    "offset/messages.search": (
        0,
        MAX_COUNT,
        lambda u, b, v: u.messages.search(b["agent"], "hello", offset=v),
    ),
    "offset/messages.between": (
        0,
        MAX_COUNT,
        lambda u, b, v: u.messages.between(b["agent"], MIN_TIME, MAX_TIME, offset=v),
    ),
    "offset/passages.search": (
        0,
        MAX_COUNT,
        lambda u, b, v: u.passages.search(b["agent"], V3, k=1, offset=v),
    ),
    "offset/passages.search_text": (
        0,
        MAX_COUNT,
        lambda u, b, v: u.passages.search_text(b["agent"], "hello", offset=v),
    ),
    "limit/messages.window": (1, 1000, lambda u, b, v: u.messages.window(b["session"], limit=v)),
    "limit/sessions.list": (1, 1000, lambda u, b, v: u.sessions.list(b["agent"], limit=v)),
    "k/passages.search": (1, 1000, lambda u, b, v: u.passages.search(b["agent"], V3, k=v)),
    "ef_search/passages.search": (1, 1000, lambda u, b, v: u.passages.search(b["agent"], V3, ef_search=v)),
    "candidates/passages.hybrid_search": (
        1,
        1000,
        lambda u, b, v: u.passages.hybrid_search(b["agent"], "hello", V3, candidates=v),
    ),
    "token_count/messages.append": (
        0,
        INT32_MAX,
        lambda u, b, v: u.messages.append(b["session"], _message(token_count=v)),
    ),
    "max_tokens/messages.context": (
        1,
        INT32_MAX,
        lambda u, b, v: u.messages.context(b["session"], max_tokens=v),
    ),
    "keep_last/messages.trim": (0, MAX_COUNT, lambda u, b, v: u.messages.trim(b["session"], keep_last=v)),
    "expected_version/agents.update": (
        INT32_MIN,
        INT32_MAX,
        lambda u, b, v: u.agents.update(b["agent"], system="s", expected_version=v),
    ),
    "seq/messages.delete_after": (
        INT64_MIN,
        INT64_MAX,
        lambda u, b, v: u.messages.delete_after(b["session"], v),
    ),
    "before_seq/messages.window": (
        INT64_MIN,
        INT64_MAX,
        lambda u, b, v: u.messages.window(b["session"], before_seq=v),
    ),
    "after_seq/messages.window": (
        INT64_MIN,
        INT64_MAX,
        lambda u, b, v: u.messages.window(b["session"], after_seq=v),
    ),
    "batch/sessions.purge_expired": (1, 100_000, lambda u, b, v: u.sessions.purge_expired(batch=v)),
    "dim/passages.define_model": (1, 16000, lambda u, b, v: u.passages.define_model(b["agent"], "m", v)),
    "m/passages.ensure_index": (
        2,
        100,
        lambda u, b, v: u.passages.ensure_index("default", 3, m=v, ef_construction=200),
    ),
    "ef_construction/passages.ensure_index": (
        32,
        1000,
        lambda u, b, v: u.passages.ensure_index("default", 3, m=16, ef_construction=v),
    ),
    "retention/agents.update": (1, MAX_SECONDS, lambda u, b, v: u.agents.update(b["agent"], retention=v)),
    "ttl/sessions.touch": (1, MAX_SECONDS, lambda u, b, v: u.sessions.touch(b["session"], ttl=v)),
    "ttl/sessions.create": (1, MAX_SECONDS, lambda u, b, v: u.sessions.create(b["agent"], ttl=v)),
}
_EDGES = {0, 1, 2, 32, 100, 1000, 16000, 100_000, MAX_SECONDS, 2**31, 2**62, 2**63, 2**64}
_NEAR = sorted({sign * edge + step for edge in _EDGES for sign in (1, -1) for step in (-1, 0, 1)})
WHOLE = st.one_of(
    st.sampled_from(_NEAR),
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.booleans(),
)


async def _expect(sweep: Sweep, name: str, call: Callable[[UnitOfWork], Awaitable[Any]], valid: bool) -> Any:
    """Run ``call``: a ``ValidationError`` naming the argument exactly when ``valid`` is false."""
    field = name.split("/")[0].split(".")[-1]
    outcome = await sweep.run("limit:" + field, call)
    if valid:
        assert not isinstance(outcome.error, ValidationError), (
            f"{name}: refused a valid value: {outcome.error}"
        )
    else:
        assert isinstance(outcome.error, ValidationError), f"{name}: accepted an invalid value"
        assert field in str(outcome.error), f"{name}: the error does not name {field}: {outcome.error}"
    return outcome.result


@given(name=st.sampled_from(sorted(INTEGERS)), value=WHOLE)
@example(name="token_count/messages.append", value=2**31)
@example(name="seq/messages.delete_after", value=2**31 - 1)
@example(name="max_tokens/messages.context", value=2**62)
@example(name="offset/passages.search", value=MAX_COUNT)
async def test_integers_are_accepted_exactly_within_their_limits(
    db: Database, engine: str, name: str, value: int
) -> None:
    base = await base_rows(db)
    lowest, highest, build = INTEGERS[name]
    valid = not isinstance(value, bool) and lowest <= value <= highest
    sweep = Sweep(db, engine)  # an accepted call is rolled back; a rejected one must write nothing
    await _expect(sweep, name, lambda uow: build(uow, base, value), valid)
    await sweep.commit()


ZONES = [
    UTC,
    timezone(timedelta(hours=-12)),
    timezone(timedelta(hours=14)),
    timezone(timedelta(hours=5, minutes=30)),
]
_EDGE_TIMES = [
    instant + shift
    for instant in (MIN_TIME, MAX_TIME)
    for shift in (timedelta(0), timedelta(microseconds=-1), timedelta(microseconds=1))
]
INSTANTS = st.one_of(
    st.datetimes(timezones=st.none() | st.sampled_from(ZONES)),
    st.datetimes(min_value=datetime(9999, 12, 29), timezones=st.sampled_from(ZONES)),
    st.datetimes(max_value=datetime(1, 1, 3), timezones=st.sampled_from(ZONES)),
    st.builds(
        lambda instant, zone: instant.astimezone(zone), st.sampled_from(_EDGE_TIMES), st.sampled_from(ZONES)
    ),
    st.sampled_from(
        [datetime.min, datetime.max, datetime.min.replace(tzinfo=UTC), datetime.max.replace(tzinfo=UTC)]
    ),
)


def _in_range(instant: datetime) -> bool:
    return instant.tzinfo is not None and MIN_TIME <= instant <= MAX_TIME


# argument -> the call with that instant; valid when the instant (and what it computes) is in range
INSTANT_CALLS: dict[str, tuple[Builder, Callable[[datetime], bool]]] = {
    "now/sessions.touch": (
        lambda u, b, v: u.sessions.touch(b["session"], ttl=60, now=v),
        lambda v: _in_range(v) and v <= MAX_TIME - timedelta(seconds=60),
    ),
    "now/sessions.purge_expired": (lambda u, b, v: u.sessions.purge_expired(now=v, dry_run=True), _in_range),
    "cutoff/messages.delete_before": (
        lambda u, b, v: u.messages.delete_before(b["agent"], v, dry_run=True),
        _in_range,
    ),
    "cutoff/passages.delete_before": (
        lambda u, b, v: u.passages.delete_before(b["agent"], v, dry_run=True),
        _in_range,
    ),
    "start/messages.between": (lambda u, b, v: u.messages.between(b["agent"], v, MAX_TIME), _in_range),
    "end/messages.between": (lambda u, b, v: u.messages.between(b["agent"], MIN_TIME, v), _in_range),
    "created_at/passages.search": (
        lambda u, b, v: u.passages.search(b["agent"], V3, where={"created_at": {"$gte": v}}),
        _in_range,
    ),
    "created_at/agents.forget": (
        lambda u, b, v: u.agents.forget({"tag": "base", "created_at": {"$lt": v}}, dry_run=True),
        _in_range,
    ),
}


@given(name=st.sampled_from(sorted(INSTANT_CALLS)), instant=INSTANTS)
@example(name="now/sessions.touch", instant=datetime(9999, 12, 30, 23, 59, 30, tzinfo=UTC))
@example(
    name="start/messages.between", instant=datetime(9999, 12, 31, 20, tzinfo=timezone(timedelta(hours=-5)))
)
async def test_instants_are_accepted_exactly_within_the_range(
    db: Database, engine: str, name: str, instant: datetime
) -> None:
    base = await base_rows(db)
    build, valid = INSTANT_CALLS[name]
    sweep = Sweep(db, engine)
    await _expect(sweep, name, lambda uow: build(uow, base, instant), valid(instant))
    await sweep.commit()


@given(day=st.dates(), end=st.booleans())
@example(day=date.min, end=False)
@example(day=date.max, end=True)
@example(day=date(9999, 12, 30), end=True)
async def test_dates_are_accepted_exactly_within_the_range(
    db: Database, engine: str, day: date, end: bool
) -> None:
    base = await base_rows(db)
    valid = date(1, 1, 2) <= day <= date(9999, 12, 30)
    sweep = Sweep(db, engine)
    if end:
        page = await _expect(
            sweep, "end", lambda uow: uow.messages.between(base["agent"], date(1, 1, 2), day), valid
        )
    else:
        page = await _expect(
            sweep, "start", lambda uow: uow.messages.between(base["agent"], day, date(9999, 12, 30)), valid
        )
    await sweep.commit()
    if valid:  # a date end includes its whole day, a date start begins with it
        assert page.total == (2 if (day >= base["day"] if end else day <= base["day"]) else 0)


@given(instant=INSTANTS)
@example(instant=MAX_TIME.astimezone(timezone(timedelta(hours=-12))))
@example(instant=MIN_TIME.astimezone(timezone(timedelta(hours=14))))
@example(instant=datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5))))
async def test_created_at_is_stored_and_read_back_or_refused(
    db: Database, engine: str, instant: datetime
) -> None:
    base = await base_rows(db)
    message = _message(content="dated", created_at=instant)
    item = {"text": "dated", "embedding": V3, "created_at": instant}
    if not _in_range(instant):
        sweep = Sweep(db, engine)
        await _expect(sweep, "created_at", lambda uow: uow.messages.append(base["session"], message), False)
        await _expect(sweep, "created_at", lambda uow: uow.passages.add_many(base["agent"], [item]), False)
        await sweep.commit()
        return
    async with db.unit_of_work() as uow:
        [stored] = await uow.messages.append(base["session"], message)
        [passage] = await uow.passages.add_many(base["agent"], [item])
    record(engine, "limit:created_at", "ok")
    record(engine, "limit:created_at", "ok")
    # Stored as the same instant, read back in UTC; the session's reads all still work.
    async with db.unit_of_work() as uow:
        window = await uow.messages.window(base["session"], limit=1000)
        context = await uow.messages.context(base["session"], max_tokens=10**6)
        found = await uow.messages.between(base["agent"], instant, instant)
        hits = await uow.passages.search(base["agent"], V3, k=10, where={"created_at": {"$lte": instant}})
        await uow.messages.delete(stored.id)
        await uow.passages.delete(passage.id)
    assert window[-1].id == stored.id
    assert window[-1].created_at == instant
    assert window[-1].created_at.tzinfo is UTC
    assert context[-1].id == stored.id
    assert [m.id for m in found.items] == [stored.id]
    assert passage.id in {hit.passage.id for hit in hits}
    assert next(hit.passage for hit in hits if hit.passage.id == passage.id).created_at == instant
