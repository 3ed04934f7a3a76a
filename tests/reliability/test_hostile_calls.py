"""Every public repository method, every argument, hostile values: memorm errors only, nothing written.

Each method's valid call (:data:`CALLS`) is repeated with one argument (or one
field of the message or passage it stores) replaced by each of :data:`HOSTILE`:
huge and boundary integers, bools, None, wrong types, NaN and infinities,
extreme datetimes in several zones, extreme dates, NUL bytes, lone
surrogates, non-JSON values, unknown ids.  A call either succeeds (and is
rolled back) or raises a ``MemormError`` from memorm's own checks: the unit
of work is not failed by the database, and a caller that catches the error
and commits finds every row as it was.  After each method, the base session
and archive still read back whole.  A property then puts random values into
random arguments (examples: the hypothesis profile).
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Awaitable, Iterator
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from memorm import Database
from memorm.repositories import AgentRepository, MessageRepository, PassageRepository, SessionRepository
from memorm.uow import UnitOfWork
from memorm.validation import shown
from reliability.hostile_kit import (
    Call,
    Sweep,
    assert_readable,
    base_rows,
    report_counts,
    snapshot,
)

pytestmark = [pytest.mark.anyio, pytest.mark.reliability, pytest.mark.long]
_ = report_counts  # an autouse fixture: imported so pytest finds it here

UTC = timezone.utc
V3 = [1.0, 0.5, 0.25]
OLD = datetime(2000, 1, 1, tzinfo=UTC)

# The valid call of every public method; "@agent" and the like name the base rows.
CALLS: dict[str, dict[str, Any]] = {
    "agents.create": {
        "name": "fresh",
        "system": "",
        "core_memory": None,
        "llm_config": None,
        "meta": None,
        "retention": None,
    },
    "agents.get": {"agent_id": "@agent"},
    "agents.get_by_name": {"name": "base"},
    "agents.list": {"limit": 50, "offset": 0},
    "agents.update": {
        "agent_id": "@agent",
        "expected_version": None,
        "name": "renamed",
        "system": "s",
        "core_memory": {},
        "llm_config": {},
        "meta": {"tag": "base"},
        "retention": None,
    },
    "agents.update_core_memory": {
        "agent_id": "@agent",
        "label": "human",
        "value": "v",
        "expected_version": None,
    },
    "agents.delete": {"agent_id": "@agent"},
    "agents.forget": {"where": {"tag": "base"}, "dry_run": True},
    "sessions.create": {"agent_id": "@agent", "title": None, "key": None, "meta": None, "ttl": None},
    "sessions.get_or_create": {"agent_id": "@agent", "key": "k", "title": None, "meta": None, "ttl": None},
    "sessions.get_by_key": {"agent_id": "@agent", "key": "base"},
    "sessions.get": {"session_id": "@session"},
    "sessions.list": {"agent_id": "@agent", "limit": 50, "offset": 0},
    "sessions.delete": {"session_id": "@session"},
    "sessions.touch": {"session_id": "@session", "ttl": 60, "now": None},
    "sessions.purge_expired": {"now": None, "batch": 1000, "dry_run": False},
    "messages.append": {"session_id": "@session", "messages": {"role": "user", "content": "x"}},
    "messages.prepend": {"session_id": "@session", "messages": [{"role": "user", "content": "x"}]},
    "messages.replace_system": {"session_id": "@session", "content": "sys"},
    "messages.trim": {"session_id": "@session", "keep_last": 1},
    "messages.delete": {"message_id": "@message"},
    "messages.delete_after": {"session_id": "@session", "seq": 1},
    "messages.clear": {"session_id": "@session"},
    "messages.pop": {"session_id": "@session"},
    "messages.get": {"message_id": "@message"},
    "messages.window": {
        "session_id": "@session",
        "limit": 50,
        "before_seq": None,
        "after_seq": None,
        "roles": None,
    },
    "messages.context": {"session_id": "@session", "max_tokens": 100, "pinned_system": True},
    "messages.count": {"session_id": "@session", "roles": None},
    "messages.search": {
        "agent_id": "@agent",
        "query": "hello",
        "session_id": None,
        "roles": None,
        "limit": 10,
        "offset": 0,
    },
    "messages.between": {
        "agent_id": "@agent",
        "start": date(2000, 1, 1),
        "end": date(2100, 1, 1),
        "session_id": None,
        "roles": None,
        "limit": 50,
        "offset": 0,
    },
    "messages.delete_before": {"agent_id": "@agent", "cutoff": OLD, "session_id": None, "dry_run": False},
    "passages.define_model": {"agent_id": "@agent", "name": "m", "dim": 3, "precision": "float32"},
    "passages.get_model": {"agent_id": "@agent", "name": "default"},
    "passages.add": {
        "agent_id": "@agent",
        "text": "t",
        "embedding": V3,
        "embedding_model": "default",
        "meta": None,
    },
    "passages.add_many": {"agent_id": "@agent", "items": [{"text": "t", "embedding": V3}]},
    "passages.update_text": {"passage_id": "@passage", "text": "t", "embedding": V3},
    "passages.delete": {"passage_id": "@passage"},
    "passages.delete_where": {"agent_id": "@agent", "where": {"tag": "x"}},
    "passages.delete_many": {"agent_id": "@agent", "ids": ["@passage"]},
    "passages.delete_before": {"agent_id": "@agent", "cutoff": OLD, "dry_run": False},
    "passages.ensure_index": {
        "embedding_model": "default",
        "dim": 3,
        "metric": "cosine",
        "precision": "float32",
        "m": 16,
        "ef_construction": 64,
    },
    "passages.get": {"passage_id": "@passage"},
    "passages.get_many": {"ids": ["@passage"], "agent_id": "@agent"},
    "passages.count": {"agent_id": "@agent", "embedding_model": None},
    "passages.list": {"agent_id": "@agent", "limit": 50, "offset": 0},
    "passages.search": {
        "agent_id": "@agent",
        "embedding": V3,
        "k": 10,
        "embedding_model": "default",
        "metric": "cosine",
        "where": None,
        "offset": 0,
        "ef_search": None,
    },
    "passages.search_text": {"agent_id": "@agent", "query": "hello", "limit": 10, "offset": 0},
    "passages.hybrid_search": {
        "agent_id": "@agent",
        "query": "hello",
        "embedding": V3,
        "k": 10,
        "embedding_model": "default",
        "metric": "cosine",
        "where": None,
        "candidates": None,
    },
}
# Arguments whose value is a dict of fields: each field is perturbed too.
NESTED: dict[tuple[str, str], dict[str, Any]] = {
    ("messages.append", "messages"): {
        "role": "user",
        "content": "x",
        "name": None,
        "tool_calls": None,
        "tool_call_id": None,
        "token_count": None,
        "created_at": None,
        "meta": None,
        "id": None,
    },
    ("passages.add_many", "items"): {
        "text": "t",
        "embedding": V3,
        "embedding_model": "default",
        "meta": None,
        "id": None,
        "created_at": None,
    },
    ("passages.search", "where"): {"tag": "x", "created_at": {"$gte": OLD}},
    ("agents.forget", "where"): {"tag": "base", "created_at": {"$lt": OLD}},
}
_ZONES = [timezone(timedelta(hours=-12)), timezone(timedelta(hours=-5)), timezone(timedelta(hours=14))]
HOSTILE: list[Any] = [
    None,
    True,
    False,
    *(0, -1, 1, 7, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**62, 2**62 + 1),
    *(2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 10**400, -(10**400)),
    *(1.5, -0.0, float("nan"), float("inf"), float("-inf"), 1e308, Decimal("NaN"), Decimal("1e400"), 1j),
    *(np.float64("nan"), np.int64(7), np.array([1.0, 2.0]), np.zeros((2, 3))),
    *("", " ", "\x00", "a\x00b", "\ud800", "x\udfffy", "'; DROP TABLE agents; --", "🧠" * 3000),
    *("not-a-uuid", str(uuid.UUID(int=7)), uuid.UUID(int=7), "user", "hello"),
    *(b"bytes", bytearray(b"\x00"), [], [None], ["user", None], [float("inf"), float("-inf"), 1.0]),
    *([1e308, 1e308, 1.0], [10**400, 1.0, 1.0], [3.4e38, -3.4e38, 0.0], (1.0, 2.0), {}, {"a": {1, 2}}),
    *({1: "x"}, {"a": float("nan")}, {"a": 2**64}, {"\x00": 1}, set(), frozenset({"user"}), object()),
    *(Ellipsis, range(3)),
    *(datetime.min, datetime.max, datetime(2000, 1, 1)),
    *(datetime.min.replace(tzinfo=UTC), datetime.max.replace(tzinfo=UTC)),
    *(datetime(9999, 12, 31, 23, tzinfo=zone) for zone in _ZONES),
    *(datetime(1, 1, 1, 1, tzinfo=zone) for zone in _ZONES),
    *(datetime(9999, 12, 30, 23, tzinfo=zone) for zone in _ZONES),
    *(datetime(1, 1, 2, 1, tzinfo=zone) for zone in _ZONES),
    *(date.min, date.max, date(1, 1, 2), date(9999, 12, 30)),
    *(timedelta.max, timedelta.min, timedelta(0), timedelta(days=-1), timedelta(days=365 * 9000)),
]


def _resolve(value: Any, base: dict[str, Any]) -> Any:
    if isinstance(value, str) and value.startswith("@"):
        return base[value[1:]]
    if isinstance(value, list):
        return [_resolve(item, base) for item in value]
    return value


def _slots() -> Iterator[tuple[str, str, str | None]]:
    """(method, argument, field inside it or None) for every argument and nested field."""
    for path, template in CALLS.items():
        for argument in template:
            yield path, argument, None
            for field in NESTED.get((path, argument), {}):
                yield path, argument, field


SLOTS = list(_slots())


def call_with(path: str, argument: str, field: str | None, value: Any, base: dict[str, Any]) -> Call:
    """The valid call of ``path`` with one argument (or one field of it) replaced by ``value``."""
    kwargs = {name: _resolve(given, base) for name, given in CALLS[path].items()}
    if field is None:
        kwargs[argument] = value
    else:
        kwargs[argument] = {**NESTED[(path, argument)], field: value}
        if path == "passages.add_many":
            kwargs[argument] = [kwargs[argument]]
    repository, method = path.split(".")

    def run(uow: UnitOfWork) -> Awaitable[Any]:
        return getattr(getattr(uow, repository), method)(**kwargs)

    return run


def test_every_public_method_and_argument_is_covered() -> None:
    for path, template in CALLS.items():
        repository, method = path.split(".")
        classes = {
            "agents": AgentRepository,
            "sessions": SessionRepository,
            "messages": MessageRepository,
            "passages": PassageRepository,
        }
        parameters = inspect.signature(getattr(classes[repository], method)).parameters
        named = {name for name, p in parameters.items() if p.kind is not p.VAR_KEYWORD and name != "self"}
        assert named <= set(template), f"{path}: no hostile values for {named - set(template)}"
    for cls, repository in (
        (AgentRepository, "agents"),
        (SessionRepository, "sessions"),
        (MessageRepository, "messages"),
        (PassageRepository, "passages"),
    ):
        public = {name for name, member in inspect.getmembers(cls, inspect.isfunction) if name[0] != "_"}
        assert {f"{repository}.{name}" for name in public} <= set(CALLS), f"{repository}: methods untested"


async def test_hostile_values_in_every_argument_raise_memorm_errors_and_write_nothing(
    db: Database, engine: str
) -> None:
    base = await base_rows(db)
    before = await snapshot(db)
    for path in CALLS:
        slots = [slot for slot in SLOTS if slot[0] == path]
        # Rejections are committed as they come; one row hash per method checks them all.
        sweep = Sweep(db, engine, verify_each=False)
        for slot in slots:
            for value in HOSTILE:
                await sweep.run(f"call:{path.split('.')[0]}", call_with(*slot, value, base))
        await sweep.commit()
        if await snapshot(db) != before:  # find which: each call checked on its own
            sweep = Sweep(db, engine)
            for slot in slots:
                for value in HOSTILE:
                    await sweep.run(f"replay {slot} = {shown(value)}", call_with(*slot, value, base))
            raise AssertionError(f"{path}: rejected calls changed rows, but none did alone")
        await assert_readable(db, base)


WRONG = st.one_of(
    st.sampled_from(HOSTILE),
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(),
    st.decimals(),
    st.text(max_size=20),
    st.binary(max_size=8),
    st.uuids(),
    st.datetimes(timezones=st.none() | st.timezones() | st.sampled_from([UTC, *_ZONES])),
    st.dates(),
    st.timedeltas(),
    st.lists(st.one_of(st.none(), st.integers(), st.floats(), st.text(max_size=4)), max_size=4),
    st.dictionaries(st.text(max_size=4), st.one_of(st.none(), st.integers(), st.floats()), max_size=3),
)


@given(slot=st.sampled_from(SLOTS), value=WRONG)
async def test_random_values_in_random_arguments_raise_memorm_errors_and_write_nothing(
    db: Database, engine: str, slot: tuple[str, str, str | None], value: Any
) -> None:
    base = await base_rows(db)
    sweep = Sweep(db, engine)  # a rejection that ran statements is checked to have written nothing
    await sweep.run(f"random:{slot[0].split('.')[0]}", call_with(*slot, value, base))
    await sweep.commit()
