"""Portable types: JSON, text, UTC datetimes and UUIDv7 ids round-trip alike on both engines."""

from __future__ import annotations

import copy
import itertools
import json
import math
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from conftest import count_rows
from hypothesis import given, settings
from hypothesis import strategies as st

from memorm import Database, Session, UnitOfWork, ValidationError
from memorm.ids import uuid7
from memorm.transfer import digest_database, export_jsonl, import_jsonl
from memorm.types.json import dumps, loads, loads_jsonb

pytestmark = pytest.mark.anyio


JSON_DOC: dict[str, Any] = {
    "nested": {"list": [1, [2, [3, {"deep": True}]]], "empty": {}, "none": None},
    "unicode": "日本語 עברית 🙂 e\u0301",
    "emoji key 🔑": ["👩‍👩‍👧", "🇯🇵"],
    "ints": [0, -1, 2**53 + 1, 2**63 - 1, -(2**63) + 1],
    "floats": [0.1, -2.5, 1.5e-10, 123456.789, 3.141592653589793],
    "bools": [True, False],
    "null": None,
    "escapes": 'quote " backslash \\ newline \n tab \t',
}

TRICKY_TEXT = [
    "汉字かなカナ한글",  # CJK
    "שלום עולם مرحبا",  # RTL
    "🙂👍🏽👨‍👩‍👧‍👦🏳️‍🌈",  # emoji, skin tones, ZWJ sequences
    "e\u0301 vs \u00e9 and a\u0308\u0304",  # combining marks, not normalised
    "\u200b\u200f\ufeff zero-width and BOM",
    "\x01\x1f\x7f control characters",
    "",
]


def _typed(value: Any) -> Any:
    """``value`` with each leaf paired with its type, so 1 and 1.0 (and True) differ."""
    if isinstance(value, dict):
        return {key: _typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_typed(item) for item in value]
    return (type(value).__name__, value)


async def _seed(db: Database) -> Session:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("sam")
        return await uow.sessions.create(agent.id)


async def test_json_documents_round_trip_with_their_types(db: Database) -> None:
    chat = await _seed(db)
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("json", meta=JSON_DOC, llm_config=JSON_DOC)
        await uow.messages.append(chat.id, {"role": "assistant", "meta": JSON_DOC, "tool_calls": [JSON_DOC]})
        passage = await uow.passages.add(agent.id, "p", [1.0], meta=JSON_DOC)
    async with db.unit_of_work() as uow:
        stored_agent = await uow.agents.get(agent.id)
        (message,) = await uow.messages.window(chat.id)
        stored_passage = await uow.passages.get(passage.id)
    expected = _typed(JSON_DOC)
    assert _typed(stored_agent.meta) == expected
    assert _typed(stored_agent.llm_config) == expected
    assert _typed(message.meta) == expected
    assert message.tool_calls is not None
    assert _typed(message.tool_calls[0]) == expected
    assert _typed(stored_passage.meta) == expected


async def test_json_floats_with_large_exponents_come_back_as_floats(db: Database) -> None:
    # jsonb prints 1e20 as 100000000000000000000; memorm reads integers past 64 bits as floats.
    floats = {"big": 1e20, "huge": 1e300, "tiny": 5e-324, "lowest_int": -(2**63)}
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("floats", meta=floats)
    async with db.unit_of_work() as uow:
        stored = await uow.agents.get(agent.id)
    assert _typed(stored.meta) == _typed(floats)


NEGATIVE_ZEROS: dict[str, Any] = {
    "zero": -0.0,
    "nested": [-0.0, {"deep": [-0.0]}, "-0.0 in a string stays"],
    "near": [-0.05, -0.0001, -1e-300, 0.0, -0],
}


def _signs(value: Any) -> Any:
    """``value`` with each float paired with its sign, so 0.0 and -0.0 differ."""
    if isinstance(value, dict):
        return {key: _signs(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_signs(item) for item in value]
    return (value, math.copysign(1.0, value)) if isinstance(value, float) else _typed(value)


async def test_json_negative_zero_reads_back_as_zero_on_both_engines(db: Database) -> None:
    # jsonb keeps numbers as numerics, which have no negative zero; SQLite's
    # text could keep one.  memorm stores what both engines hold: 0.0.
    chat = await _seed(db)
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("z", meta=NEGATIVE_ZEROS, core_memory={"n": "-0.0"})
        await uow.messages.append(chat.id, {"role": "assistant", "meta": NEGATIVE_ZEROS})
        passage = await uow.passages.add(agent.id, "p", [-0.0, 1.0], meta=NEGATIVE_ZEROS)
    async with db.unit_of_work(read_only=True) as uow:
        stored = [
            (await uow.agents.get(agent.id)).meta,
            (await uow.messages.window(chat.id))[0].meta,
            (await uow.passages.get(passage.id)).meta,
        ]
    expected = {
        "zero": 0.0,
        "nested": [0.0, {"deep": [0.0]}, "-0.0 in a string stays"],
        "near": [-0.05, -0.0001, -1e-300, 0.0, 0],
    }
    assert [_signs(meta) for meta in stored] == [_signs(expected)] * 3


async def test_vector_negative_zeros_keep_their_sign_through_export_and_import(
    db: Database, tmp_path: Path
) -> None:
    # JSON documents drop the sign (jsonb has no -0.0); vectors keep it on both
    # engines (pgvector, SQLite's packed floats), and `copy` carries it: so must a file.
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("zeros")
        await uow.passages.define_model(agent.id, "half", 3, precision="float16")
        full = await uow.passages.add(agent.id, "full", [-0.0, 1.0, 0.0])
        half = await uow.passages.add(agent.id, "half", [0.0, -0.0, 1.0], embedding_model="half")

    async def signs() -> list[list[float]]:
        async with db.unit_of_work(read_only=True) as uow:
            stored = [await uow.passages.get(passage.id) for passage in (full, half)]
        return [[math.copysign(1.0, x) for x in passage.vector] for passage in stored]

    assert await signs() == [[-1.0, 1.0, 1.0], [1.0, -1.0, 1.0]]  # as stored
    before = await digest_database(db, tenant=db.tenant)
    file = tmp_path / "zeros.jsonl"
    await export_jsonl(db, file, tenant=db.tenant)
    async with db.unit_of_work() as uow:
        await uow.agents.delete(agent.id)  # its models and passages with it
    await import_jsonl(db, file, tenant=db.tenant)
    assert await signs() == [[-1.0, 1.0, 1.0], [1.0, -1.0, 1.0]]
    assert await digest_database(db, tenant=db.tenant) == before


def _unsigned_zeros(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _unsigned_zeros(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_unsigned_zeros(item) for item in value]
    return 0.0 if isinstance(value, float) and value == 0 else value


_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([-0.0, 0.0, -0.05, -1e-300])
    | st.text(alphabet=st.sampled_from('-0.e5"\\ab'), max_size=12),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(value=_json_values)
def test_json_codec_keeps_every_value_but_the_sign_of_zero(value: Any) -> None:
    expected = _signs(_unsigned_zeros(value))
    assert _signs(loads(dumps(value))) == expected
    # Text another program wrote (with its negative zeros) reads the same way.
    assert _signs(loads(json.dumps(value))) == expected
    assert _signs(loads(json.dumps(value).encode())) == expected


@settings(max_examples=300, deadline=None)
@given(value=_json_values, spaced=st.booleans(), big=st.sampled_from([None, 2**63, -(2**70), 10**30]))
def test_postgres_json_reads_as_the_general_reader_reads_it(
    value: Any, spaced: bool, big: int | None
) -> None:
    """`loads_jsonb` (jsonb has no negative zero) and `loads` agree on what Postgres can send."""
    document = json.dumps([_unsigned_zeros(value), big], separators=(", ", ": ") if spaced else (",", ":"))
    assert _signs(loads_jsonb(document)) == _signs(loads(document))
    assert _signs(loads_jsonb(document.encode())) == _signs(loads(document))
    assert loads_jsonb("{}") == {}
    if big is not None:  # an integer past 64 bits reads as the float it was
        assert isinstance(loads_jsonb(document)[1], float)


def test_json_codec_reads_every_spelling_of_negative_zero_unsigned() -> None:
    for spelling in ("-0.0", "-0.00", "-0e5", "-0E-3", "-0.0e+1"):
        assert _signs(loads(f"[{spelling}, -0.05]")) == [(0.0, 1.0), (-0.05, -1.0)]
    assert loads("[-0]") == [0]
    # Inside strings nothing changes, escaped quotes included.
    assert dumps({"s": 'a\\"-0.0', "z": -0.0, "w": -0.05}) == '{"s":"a\\\\\\"-0.0","z":0.0,"w":-0.05}'


async def test_unicode_text_round_trips_exactly_in_every_text_field(db: Database) -> None:
    async with db.unit_of_work() as uow:
        agents = []
        for i, text in enumerate(TRICKY_TEXT):
            agent = await uow.agents.create(
                f"{text}#{i}", system=text, core_memory={text or "empty": text}, meta={text: text}
            )
            agents.append(agent)
            chat = await uow.sessions.create(agent.id, title=text)
            await uow.messages.append(chat.id, {"role": "tool", "content": text, "name": text})
            await uow.passages.add(agent.id, text, [1.0], embedding_model=text or "default")
    async with db.unit_of_work() as uow:
        for i, (text, created) in enumerate(zip(TRICKY_TEXT, agents, strict=True)):
            agent = await uow.agents.get(created.id)
            assert (agent.name, agent.system) == (f"{text}#{i}", text)
            assert agent.core_memory == {text or "empty": text}
            assert agent.meta == {text: text}
            assert await uow.agents.get_by_name(f"{text}#{i}") is not None
            (chat,) = (await uow.sessions.list(agent.id)).items
            assert chat.title == text
            (message,) = await uow.messages.window(chat.id)
            assert (message.content, message.name) == (text, text)
            assert await uow.passages.count(agent.id, embedding_model=text or "default") == 1


async def test_aware_datetimes_come_back_as_the_same_instant_in_utc(db: Database) -> None:
    chat = await _seed(db)
    zones = [timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8)), timezone.utc]
    given = [datetime(2024, 2, 29, 23, 59, 59, 123456 + i, tzinfo=zone) for i, zone in enumerate(zones)]
    async with db.unit_of_work() as uow:
        await uow.messages.append(chat.id, [{"role": "user", "created_at": at} for at in given])
    async with db.unit_of_work() as uow:
        window = await uow.messages.window(chat.id)
        stored_chat = await uow.sessions.get(chat.id)
    assert [m.created_at for m in window] == given  # same instants, microseconds kept
    for message, at in zip(window, given, strict=True):
        assert message.created_at.utcoffset() == timedelta(0)
        assert message.created_at.replace(tzinfo=None) == at.astimezone(timezone.utc).replace(tzinfo=None)
    # Timestamps memorm sets itself are aware UTC too.
    assert stored_chat.created_at.utcoffset() == timedelta(0)
    assert abs(stored_chat.created_at - datetime.now(timezone.utc)) < timedelta(minutes=5)


@pytest.mark.parametrize("created_at", [datetime(2024, 1, 1, 12, 0), "2024-01-01T12:00:00+00:00", 1704110400])
async def test_naive_or_non_datetime_created_at_raises_validation_error(
    db: Database, created_at: Any
) -> None:
    chat = await _seed(db)
    async with db.unit_of_work() as uow:
        with pytest.raises(ValidationError):
            await uow.messages.append(chat.id, [{"role": "user"}, {"role": "user", "created_at": created_at}])
    assert await count_rows(db, "messages") == 0


@pytest.mark.parametrize(
    "instant",
    [
        datetime.max.replace(tzinfo=timezone.utc),  # asyncpg would send infinity
        datetime.min.replace(tzinfo=timezone.utc),  # ... and -infinity
        datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5))),  # past datetime's range in UTC
    ],
    ids=["max", "min", "west-of-the-last-day"],
)
async def test_the_column_type_refuses_instants_outside_the_range_even_past_the_repositories(
    db: Database, instant: datetime
) -> None:
    # Raw ORM writes (and imports) skip the repositories' checks; the column type still refuses.
    chat = await _seed(db)

    async def write() -> None:
        async with db.unit_of_work() as uow:
            (await uow.sessions.get(chat.id)).expires_at = instant  # flushed by the commit on exit

    with pytest.raises(ValidationError, match="outside the range"):
        await write()
    async with db.unit_of_work(read_only=True) as uow:
        assert (await uow.sessions.get(chat.id)).expires_at is None


def test_uuid7_ids_strictly_increase_in_creation_order() -> None:
    ids = [uuid7() for _ in range(10_000)]
    assert all(a < b for a, b in itertools.pairwise(ids))
    assert all(a.bytes < b.bytes for a, b in itertools.pairwise(ids))  # byte order too (Postgres uuid sort)
    assert {i.version for i in ids} == {7}
    assert {i.variant for i in ids} == {uuid.RFC_4122}
    assert len(set(ids)) == len(ids)
    # Built without UUID's constructor: equal, in every form, to the UUID of the same value.
    for made in ids[:100]:
        same = uuid.UUID(int=made.int)
        assert (made, hash(made), str(made), made.bytes, made.is_safe) == (
            same,
            hash(same),
            str(same),
            same.bytes,
            same.is_safe,
        )
        assert uuid.UUID(str(made)) == made
        assert copy.deepcopy(made) == made


# -- bad input is refused before anything is written ---------------------------

Write = Callable[[UnitOfWork, Session, Any], Awaitable[Any]]

TEXT_WRITES: dict[str, Write] = {
    "agent.name": lambda uow, chat, v: uow.agents.create(f"n{v}"),
    "agent.system": lambda uow, chat, v: uow.agents.create("n", system=v),
    "agent.core_memory": lambda uow, chat, v: uow.agents.create("n", core_memory={"human": v}),
    "agent.update.system": lambda uow, chat, v: uow.agents.update(chat.agent_id, system=v),
    "agent.core_memory.label": lambda uow, chat, v: uow.agents.update_core_memory(chat.agent_id, v, "x"),
    "agent.core_memory.value": lambda uow, chat, v: uow.agents.update_core_memory(chat.agent_id, "h", v),
    "session.title": lambda uow, chat, v: uow.sessions.create(chat.agent_id, title=v),
    "message.content": lambda uow, chat, v: uow.messages.append(chat.id, {"role": "user", "content": v}),
    "message.name": lambda uow, chat, v: uow.messages.append(chat.id, {"role": "tool", "name": v}),
    "message.tool_call_id": lambda uow, chat, v: uow.messages.append(
        chat.id, {"role": "tool", "tool_call_id": v}
    ),
    "passage.text": lambda uow, chat, v: uow.passages.add(chat.agent_id, v, [1.0]),
    "passage.embedding_model": lambda uow, chat, v: uow.passages.add(
        chat.agent_id, "t", [1.0], embedding_model=v
    ),
}

JSON_WRITES: dict[str, Write] = {
    "agent.meta": lambda uow, chat, v: uow.agents.create("n", meta=v),
    "agent.llm_config": lambda uow, chat, v: uow.agents.create("n", llm_config=v),
    "agent.update.meta": lambda uow, chat, v: uow.agents.update(chat.agent_id, meta=v),
    "session.meta": lambda uow, chat, v: uow.sessions.create(chat.agent_id, meta=v),
    "message.meta": lambda uow, chat, v: uow.messages.append(chat.id, {"role": "user", "meta": v}),
    "message.tool_calls": lambda uow, chat, v: uow.messages.append(
        chat.id, {"role": "user", "tool_calls": [v]}
    ),
    "passage.meta": lambda uow, chat, v: uow.passages.add(chat.agent_id, "t", [1.0], meta=v),
}


async def _assert_all_refused(
    db: Database, chat: Session, writes: dict[str, Write], values: list[Any]
) -> None:
    """Every write with every value raises ValidationError, and the database is unchanged."""
    accepted = []
    async with db.unit_of_work() as uow:
        for field, write in writes.items():
            for value in values:
                try:
                    await write(uow, chat, value)
                except ValidationError:
                    continue
                accepted.append((field, value))
    assert accepted == []
    counts = [await count_rows(db, t) for t in ("agents", "sessions", "messages", "archival_passages")]
    assert counts == [1, 1, 0, 0]
    async with db.unit_of_work() as uow:
        agent = await uow.agents.get(chat.agent_id)
        assert (await uow.sessions.get(chat.id)).next_seq == 1
    assert (agent.system, agent.core_memory, agent.meta, agent.version) == ("", {}, {}, 1)


@pytest.mark.parametrize(
    "bad",
    [pytest.param(["a\x00b", "\x00"], id="nul"), pytest.param(["a\ud800b", "\udfff"], id="lone-surrogate")],
)
async def test_text_with_nul_or_lone_surrogate_is_refused_everywhere(db: Database, bad: list[str]) -> None:
    documents = [{"k": text} for text in bad] + [{text: "v"} for text in bad] + [{"k": [{"deep": bad[0]}]}]
    chat = await _seed(db)
    await _assert_all_refused(db, chat, TEXT_WRITES, bad)
    await _assert_all_refused(db, chat, JSON_WRITES, documents)


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param([{"x": math.nan}, {"x": [1.0, math.inf]}, {"x": {"y": -math.inf}}], id="nan-inf"),
        pytest.param([{1: "one"}, {"x": {None: 1}}, {"x": [{(1, 2): 3}]}, {b"k": 1}], id="non-string-keys"),
        pytest.param([{"x": 2**63}, {"x": -(2**64)}], id="int-past-64-bits"),
        pytest.param(
            [{"x": {1, 2}}, {"x": b"bytes"}, {"x": object()}, {"x": datetime.now(timezone.utc)}],
            id="not-json",
        ),
        pytest.param(["not a dict", [("k", "v")]], id="not-a-dict"),
    ],
)
async def test_json_values_that_are_not_json_are_refused_everywhere(db: Database, bad: list[Any]) -> None:
    writes = dict(JSON_WRITES)
    if not all(isinstance(value, dict) for value in bad):
        del writes["message.tool_calls"]  # a list item there may be any JSON value, not only a dict
    await _assert_all_refused(db, await _seed(db), writes, bad)
