"""Hostile input: every public call either round-trips exactly or raises a ``MemormError``.

Property-based over both engines (examples per property: the hypothesis
profile, 200 in CI).  A rejected call must leave the database byte-for-byte
unchanged (a hash of every row of the five tables, before and after), even when
the caller catches the error and commits.  Counts of inputs tried, accepted
and rejected per category go to ``.bench/reliability-hostile-<engine>.json``.
"""

from __future__ import annotations

import math
import re
import struct
import uuid
from collections.abc import Awaitable, Callable
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from memorm import Database
from memorm.errors import ValidationError
from memorm.page import Page
from memorm.uow import UnitOfWork
from reliability.hostile_kit import (
    MAX_TIME,
    MIN_TIME,
    Sweep,
    assert_readable,
    attempt,
    base_rows,
    report_counts,
    snapshot,
)

pytestmark = [pytest.mark.anyio, pytest.mark.reliability, pytest.mark.long]
_ = report_counts  # an autouse fixture: imported so pytest finds it here

BIG = ("memorm 🧠 ü\u200b " * 100_000)[:1_000_000]  # one million characters, most of them multi-byte
EXPLICIT_TEXT = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "\ud800",
    "x\udfffy",
    "\ufeff\u202e\u2028",
    "🧠" * 50,
    "'; DROP TABLE agents; --",
    "\\'\"%_*",
]
TEXTS = st.one_of(
    st.text(alphabet=st.characters(blacklist_categories=()), max_size=40),
    st.sampled_from(EXPLICIT_TEXT),
)


# -- text -----------------------------------------------------------------------


@given(name=TEXTS, system=TEXTS, block=TEXTS)
@example(name=BIG, system=BIG, block=BIG)
@example(name="ok", system="a\x00", block="b")
@example(name="ok", system="a", block="\udc00")
async def test_agent_text_round_trips_or_is_rejected(
    db: Database, engine: str, name: str, system: str, block: str
) -> None:
    ok, agent = await attempt(
        db,
        engine,
        "text:agent",
        lambda uow: uow.agents.create(name, system=system, core_memory={"human": block}),
    )
    if ok:
        async with db.unit_of_work(read_only=True) as uow:
            got = await uow.agents.get(agent.id)
        assert (got.name, got.system, got.core_memory) == (name, system, {"human": block})
        async with db.unit_of_work() as uow:  # keeps the per-call row hash cheap
            await uow.agents.delete(agent.id)
    base = await base_rows(db)
    ok, _ = await attempt(
        db, engine, "text:core_memory", lambda uow: uow.agents.update_core_memory(base["agent"], block, name)
    )
    if ok:
        async with db.unit_of_work(read_only=True) as uow:
            assert (await uow.agents.get(base["agent"])).core_memory[block] == name
        async with db.unit_of_work() as uow:  # a megabyte block would slow every later row hash
            await uow.agents.update(base["agent"], core_memory={})


@given(content=TEXTS, name=st.none() | TEXTS)
@example(content=BIG, name=BIG)
@example(content="\x00", name=None)
@example(content="x", name="\ud83d")
async def test_message_text_round_trips_or_is_rejected(
    db: Database, engine: str, content: str, name: str | None
) -> None:
    base = await base_rows(db)
    ok, stored = await attempt(
        db,
        engine,
        "text:message",
        lambda uow: uow.messages.append(base["session"], {"role": "user", "content": content, "name": name}),
    )
    if ok:
        async with db.unit_of_work(read_only=True) as uow:
            got = await uow.messages.get(stored[0].id)
        assert (got.content, got.name) == (content, name)
        async with db.unit_of_work() as uow:
            await uow.messages.delete(got.id)
    ok, _ = await attempt(
        db, engine, "text:system", lambda uow: uow.messages.replace_system(base["session"], content)
    )
    if ok:
        async with db.unit_of_work(read_only=True) as uow:
            [head] = await uow.messages.window(base["session"], limit=1, after_seq=-(2**31))
        assert (head.role, head.content) == ("system", content)


@given(text=TEXTS)
@example(text=BIG)
@example(text="\x00")
@example(text="\udfff")
async def test_passage_text_round_trips_or_is_rejected(db: Database, engine: str, text: str) -> None:
    base = await base_rows(db)
    ok, passage = await attempt(
        db, engine, "text:passage", lambda uow: uow.passages.add(base["agent"], text, [0.1, 0.2, 0.3])
    )
    if ok:
        async with db.unit_of_work(read_only=True) as uow:
            assert (await uow.passages.get(passage.id)).text == text
        async with db.unit_of_work() as uow:
            await uow.passages.delete(passage.id)
    ok, _ = await attempt(
        db,
        engine,
        "text:passage_update",
        lambda uow: uow.passages.update_text(base["passage"], text, [1.0, 0.5, 0.25]),
    )
    if ok:
        async with db.unit_of_work(read_only=True) as uow:
            assert (await uow.passages.get(base["passage"])).text == text


# -- metadata -------------------------------------------------------------------


def _nested(depth: int) -> dict[str, Any]:
    value: Any = "bottom"
    for _ in range(depth):
        value = {"d": value}
    return value  # type: ignore[no-any-return]


_WEIRD = [set(), {1, 2}, frozenset({"a"}), b"bytes", bytearray(b"x"), object(), 1j, Decimal("1.5")]
_WEIRD += [datetime(2020, 1, 1, tzinfo=timezone.utc), date(2020, 1, 1), uuid.UUID(int=1), Ellipsis]
_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from([2**63 - 1, -(2**63), 2**63, -(2**63) - 1, 10**100]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=st.characters(blacklist_categories=()), max_size=8),
    st.sampled_from(_WEIRD),
)
_KEYS = st.one_of(
    st.text(alphabet=st.characters(blacklist_categories=()), max_size=6),
    st.integers(-3, 3),
    st.sampled_from([None, 1.5, float("nan"), (1, 2), b"k", True, "\x00", "\ud800"]),
)
JSONISH = st.recursive(
    _LEAVES,
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner) | st.dictionaries(_KEYS, inner, max_size=3),
    max_leaves=12,
)
METAS = st.one_of(
    st.dictionaries(st.text(max_size=6), JSONISH, max_size=4),
    st.dictionaries(_KEYS, JSONISH, max_size=3),
    st.sampled_from([_nested(63), _nested(64), _nested(65), _nested(200), "meta", [1, 2], 5, {"a": {1, 2}}]),
)


def _plain(value: Any) -> Any:
    """What a JSON round trip should give back: tuples become lists."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _same_json(got: Any, want: Any) -> bool:
    """Equality where the types match too: ``True`` is not ``1``, nor ``1e16`` ``10**16``."""
    if type(got) is not type(want):
        return False
    if isinstance(want, dict):
        return got.keys() == want.keys() and all(_same_json(got[k], want[k]) for k in want)
    if isinstance(want, list):
        return len(got) == len(want) and all(_same_json(a, b) for a, b in zip(got, want, strict=True))
    return bool(got == want)


@given(meta=METAS)
@example(meta={"big": 2**63})
@example(meta={"nan": float("nan")})
@example(meta={"deep": _nested(70)})
@example(meta={1: "int key"})
async def test_metadata_round_trips_or_is_rejected(db: Database, engine: str, meta: Any) -> None:
    base = await base_rows(db)
    want = _plain(meta)
    ok, agent = await attempt(
        db,
        engine,
        "meta:agent",
        lambda uow: uow.agents.create(f"m-{uuid.uuid4().hex}", meta=meta, llm_config=meta),
    )
    # Each accepted row is read back, then deleted: the row hash stays cheap.
    if ok:
        async with db.unit_of_work() as uow:
            got = await uow.agents.get(agent.id)
            await uow.agents.delete(agent.id)
        assert _same_json(got.meta, want), (got.meta, want)
        assert _same_json(got.llm_config, want), (got.llm_config, want)
    ok, chat = await attempt(
        db, engine, "meta:session", lambda uow: uow.sessions.create(base["agent"], meta=meta)
    )
    if ok:
        async with db.unit_of_work() as uow:
            assert _same_json((await uow.sessions.get(chat.id)).meta, want)
            await uow.sessions.delete(chat.id)
    ok, stored = await attempt(
        db,
        engine,
        "meta:message",
        lambda uow: uow.messages.append(
            base["session"], {"role": "assistant", "content": "x", "meta": meta, "tool_calls": [meta]}
        ),
    )
    if ok:
        async with db.unit_of_work() as uow:
            got_message = await uow.messages.get(stored[0].id)
            await uow.messages.delete(got_message.id)
        assert _same_json(got_message.meta, want or {})
        assert _same_json(got_message.tool_calls, [want])
    ok, passage = await attempt(
        db,
        engine,
        "meta:passage",
        lambda uow: uow.passages.add(base["agent"], "m", [1.0, 0.0, 0.0], meta=meta),
    )
    if ok:
        async with db.unit_of_work() as uow:
            assert _same_json((await uow.passages.get(passage.id)).meta, want)
            await uow.passages.delete(passage.id)


async def test_large_floats_keep_their_type(db: Database) -> None:
    # jsonb keeps a numeric's scale but not its exponent: 4.5e16 written as such
    # came back as the int 45264503686869700, so memorm writes it with a point.
    floats = {"f": 4.52645036868697e16, "g": -1e16, "h": 1.7976931348623157e308, "text": "4.5e+16"}
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("floats", meta=floats)
        chat = await uow.sessions.create(agent.id)
        # 64 rows: the Postgres bulk path (COPY) serialises too.
        rows = [{"role": "tool", "content": "", "tool_call_id": "c", "meta": floats}] * 64
        await uow.messages.append(chat.id, rows)
    async with db.unit_of_work(read_only=True) as uow:
        stored = (await uow.agents.get(agent.id)).meta
        window = await uow.messages.window(chat.id, limit=64)
        matched = await uow.agents.forget({"f": 4.52645036868697e16}, dry_run=True)
    for got in (stored, *(message.meta for message in window)):
        assert got == floats
        assert all(type(got[key]) is type(value) for key, value in floats.items())
    assert matched.agents == 1  # a filter on the float finds it


# -- search -----------------------------------------------------------------------

_META_CHARS = ['"', "'", "*", "(", ")", ":", "^", "-", "+", "~", "|", "&", "!", "<", ">", "%", "_", ";"]
_META_CHARS += ["\\", "{", "}", "[", "]", "@@", "--", "/*", "*/", ".", ",", "$", "?", "NEAR", "AND", "OR"]
_META_CHARS += ["NOT", "NEAR(", "hello*", "content:", "'rebuild'", " "]
QUERIES = st.one_of(
    st.lists(st.sampled_from([*_META_CHARS, "hello", "world", "HeLLo"]), max_size=8).map("".join),
    st.lists(st.sampled_from([*_META_CHARS, "hello", "world"]), max_size=6).map(" ".join),
    TEXTS,
)


def _expect_found(query: str) -> bool | None:
    """Whether the one 'hello world' row must match (None: no opinion, for arbitrary text)."""
    if not re.fullmatch(r"[\x20-\x7e]*", query):
        return None
    words = {word.lower() for word in re.findall(r"[A-Za-z0-9]+", query)}
    if not words:
        return None
    return words <= {"hello", "world"}


@given(query=QUERIES)
@example(query='"hello')
@example(query="hello' OR 1=1 --")
@example(query="hello AND NOT world")
@example(query="\x00")
@example(query="*")
async def test_search_metacharacters_are_words(db: Database, engine: str, query: str) -> None:
    base = await base_rows(db)
    found = _expect_found(query)
    ok, page = await attempt(
        db, engine, "search:messages", lambda uow: uow.messages.search(base["agent"], query), read_only=True
    )
    if ok:
        assert isinstance(page, Page)
        assert page.total >= len(page.items)
        assert all(m.agent_id == base["agent"] for m in page.items)
        if found is not None:
            assert (page.total >= 1) == found, (query, page.total)
    ok, page = await attempt(
        db,
        engine,
        "search:passages",
        lambda uow: uow.passages.search_text(base["agent"], query),
        read_only=True,
    )
    if ok:
        assert all(p.agent_id == base["agent"] for p in page.items)
        if found is not None:
            assert any(p.id == base["passage"] for p in page.items) == found, (query, page.total)
    ok, hits = await attempt(
        db,
        engine,
        "search:hybrid",
        lambda uow: uow.passages.hybrid_search(base["agent"], query, [1.0, 0.5, 0.25]),
        read_only=True,
    )
    if ok:
        assert hits
        assert hits[0].passage.id == base["passage"]
        assert all(hit.passage.agent_id == base["agent"] and math.isfinite(hit.score) for hit in hits)


# -- embeddings -------------------------------------------------------------------

_ODD_VECTORS: list[Any] = [None, "1,2,3", b"\x00\x00\x80?", 3, 3.0, {"a": 1}, {1.0, 2.0, 3.0}]
_ODD_VECTORS += [[[1.0, 2.0, 3.0]], (1.0, 2.0, 3.0), [1, 2, 3], [True, 0.0, 1.0], ["1", "2", "3"]]
_ODD_VECTORS += [[1e39, 0.0, 0.0], [3.4e38, 0.0, 1.0], [70000.0, 1.0, 0.0], [float("nan")] * 3]
_ODD_VECTORS += [[0.0, 0.0, 0.0], [5e-324, 0.0, 0.0], [1e-40, 1.0, 0.0], [Decimal("1.5"), 1.0, 1.0], []]
# Sums that overflow, or that fsum refuses: each must be a ValidationError, never an OverflowError.
_ODD_VECTORS += [[float("inf"), float("-inf"), 1.0], [1e308, 1e308, 1.0], [-1e308, -1e308, 1.0]]
_ODD_VECTORS += [[3.4e38, 3.4e38, 3.4e38], [10**400, 1.0, 1.0], [float("nan"), float("inf"), 1.0]]
VECTORS = st.one_of(
    st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=0, max_size=5),
    st.lists(st.floats(-1e6, 1e6), min_size=3, max_size=3),
    st.lists(
        st.one_of(st.floats(), st.integers(-(10**40), 10**40), st.text(max_size=3), st.none(), st.booleans()),
        max_size=4,
    ),
    st.sampled_from(_ODD_VECTORS),
)


def _stored(value: float, half: bool) -> float:
    fmt = "<e" if half else "<f"
    return float(struct.unpack(fmt, struct.pack(fmt, value))[0])


@given(embedding=VECTORS, model=st.sampled_from(["default", "half"]))
@example(embedding=[float("inf"), 0.0, 0.0], model="default")
@example(embedding=[1.0, 2.0], model="default")
@example(embedding=[1.0, "x", 2.0], model="half")
@example(embedding=[float("inf"), float("-inf"), 1.0], model="default")
@example(embedding=[1e308, 1e308, 1.0], model="half")
async def test_embeddings_round_trip_or_are_rejected(
    db: Database, engine: str, embedding: Any, model: str
) -> None:
    base = await base_rows(db)
    half = model == "half"
    ok, passage = await attempt(
        db,
        engine,
        "embedding:add",
        lambda uow: uow.passages.add(base["agent"], "v", embedding, embedding_model=model),
    )
    if ok:
        async with db.unit_of_work() as uow:
            got = (await uow.passages.get(passage.id)).vector
            await uow.passages.delete(passage.id)
        want = [_stored(float(x), half) for x in embedding]
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7 if half else 1e-37), (got, want)
    ok, hits = await attempt(
        db,
        engine,
        "embedding:search",
        lambda uow: uow.passages.search(base["agent"], embedding, embedding_model=model, k=5),
        read_only=True,
    )
    if ok:
        assert all(hit.passage.agent_id == base["agent"] for hit in hits)
        # Finite distances are pinned by test_cosine_search_never_returns_nan below.


async def test_cosine_search_never_returns_nan(db: Database, engine: str) -> None:
    base = await base_rows(db)
    async with db.unit_of_work() as uow:
        await uow.passages.add(base["agent"], "zero", [5e-324, 0.0, 0.0])  # 0 as float32
    async with db.unit_of_work(read_only=True) as uow:
        hits = await uow.passages.search(base["agent"], [1.0, 0.0, 0.0], k=5)
    assert all(hit.distance is not None and math.isfinite(hit.distance) for hit in hits), hits
    assert all(math.isfinite(hit.score) for hit in hits), hits


# -- ids of the wrong type ----------------------------------------------------------

BAD_IDS = st.one_of(
    st.integers(),
    st.none(),
    st.floats(),
    st.text(max_size=40),
    st.binary(max_size=16),
    st.uuids(),
    st.uuids().map(str),
    st.sampled_from(
        ["", "not-a-uuid", "' OR 1=1 --", "00000000-0000-0000-0000-00000000000g", [1], {"id": 1}]
    ),
)
_D1 = date(2000, 1, 1)
_D2 = date(2100, 1, 1)
_MSG = {"role": "user", "content": "x"}
_V = [1.0, 0.0, 0.0]
ID_CALLS: dict[str, Callable[[UnitOfWork, Any, dict[str, Any]], Awaitable[Any]]] = {
    "agents.get": lambda u, x, b: u.agents.get(x),
    "agents.update": lambda u, x, b: u.agents.update(x, system="s"),
    "agents.update_core_memory": lambda u, x, b: u.agents.update_core_memory(x, "l", "v"),
    "agents.delete": lambda u, x, b: u.agents.delete(x),
    "sessions.create": lambda u, x, b: u.sessions.create(x),
    "sessions.get_or_create": lambda u, x, b: u.sessions.get_or_create(x, "k"),
    "sessions.get_by_key": lambda u, x, b: u.sessions.get_by_key(x, "k"),
    "sessions.get": lambda u, x, b: u.sessions.get(x),
    "sessions.list": lambda u, x, b: u.sessions.list(x),
    "sessions.delete": lambda u, x, b: u.sessions.delete(x),
    "messages.get": lambda u, x, b: u.messages.get(x),
    "messages.window": lambda u, x, b: u.messages.window(x),
    "messages.context": lambda u, x, b: u.messages.context(x, max_tokens=100),
    "messages.count": lambda u, x, b: u.messages.count(x),
    "messages.search": lambda u, x, b: u.messages.search(x, "hello"),
    "messages.search/session": lambda u, x, b: u.messages.search(b["agent"], "hello", session_id=x),
    "messages.between": lambda u, x, b: u.messages.between(x, _D1, _D2),
    "messages.between/session": lambda u, x, b: u.messages.between(b["agent"], _D1, _D2, session_id=x),
    "messages.append": lambda u, x, b: u.messages.append(x, _MSG),
    "messages.prepend": lambda u, x, b: u.messages.prepend(x, _MSG),
    "messages.replace_system": lambda u, x, b: u.messages.replace_system(x, "s"),
    "messages.trim": lambda u, x, b: u.messages.trim(x, keep_last=0),
    "messages.delete": lambda u, x, b: u.messages.delete(x),
    "messages.delete_after": lambda u, x, b: u.messages.delete_after(x, 0),
    "messages.clear": lambda u, x, b: u.messages.clear(x),
    "messages.pop": lambda u, x, b: u.messages.pop(x),
    "passages.get": lambda u, x, b: u.passages.get(x),
    "passages.get_many": lambda u, x, b: u.passages.get_many([x]),
    "passages.count": lambda u, x, b: u.passages.count(x),
    "passages.list": lambda u, x, b: u.passages.list(x),
    "passages.search": lambda u, x, b: u.passages.search(x, _V),
    "passages.search_text": lambda u, x, b: u.passages.search_text(x, "hello"),
    "passages.hybrid_search": lambda u, x, b: u.passages.hybrid_search(x, "hello", _V),
    "passages.add": lambda u, x, b: u.passages.add(x, "t", _V),
    "passages.add_many": lambda u, x, b: u.passages.add_many(x, [{"text": "t", "embedding": _V}]),
    "passages.update_text": lambda u, x, b: u.passages.update_text(x, "t", _V),
    "passages.delete": lambda u, x, b: u.passages.delete(x),
    "passages.delete_where": lambda u, x, b: u.passages.delete_where(x, {"topic": "x"}),
    "passages.delete_many/agent": lambda u, x, b: u.passages.delete_many(x, [b["passage"]]),
    "passages.delete_many/ids": lambda u, x, b: u.passages.delete_many(b["agent"], [x]),
    "passages.define_model": lambda u, x, b: u.passages.define_model(x, "m", 3),
    "passages.get_model": lambda u, x, b: u.passages.get_model(x, "default"),
}


def _empty(result: Any) -> bool:
    if isinstance(result, Page):
        return result.total == 0 and not result.items
    return result is None or result == 0 or result == []


@given(bad=BAD_IDS)
@example(bad=None)
@example(bad=0)
@example(bad=uuid.UUID(int=0))
async def test_wrong_ids_are_rejected_everywhere(db: Database, engine: str, bad: Any) -> None:
    base = await base_rows(db)
    sweep = Sweep(db, engine, keep_successes=True)
    for name, call in ID_CALLS.items():
        if bad is None and name.endswith("/session"):
            continue  # session_id=None is the documented "every session"
        outcome = await sweep.run("id:" + name.split(".")[0], lambda uow, call=call: call(uow, bad, base))
        if not outcome.rejected:
            assert _empty(outcome.result), f"{name}({bad!r}) found something: {outcome.result!r:.200}"
    # Every call above was a no-op or a rejection: together they changed nothing.
    await sweep.commit(unwritten=True)


# -- issue 12: each reproduction, on both engines ----------------------------------------

WEST = timezone(timedelta(hours=-5))


async def _rows(db: Database, session: uuid.UUID) -> list[tuple[int, str, str]]:
    async with db.unit_of_work(read_only=True) as uow:
        return [(m.seq, m.role, m.content) for m in await uow.messages.window(session, limit=1000)]


async def test_created_at_year_9999_west_of_utc_is_refused_before_the_counter_moves(db: Database) -> None:
    base = await base_rows(db)
    late = datetime(9999, 12, 31, 23, tzinfo=WEST)  # 10000-01-01 04:00 UTC: past datetime's range
    async with db.unit_of_work() as uow:
        # A caller that catches each error and carries on, then commits.
        for write in (uow.messages.append, uow.messages.prepend):
            with pytest.raises(ValidationError, match=r"messages\[0\]\.created_at"):
                await write(base["session"], {"role": "user", "content": "late", "created_at": late})
        await uow.messages.append(base["session"], {"role": "user", "content": "next"})
    # The counter never moved and the system message stayed first: seqs 1, 2, 3.
    assert await _rows(db, base["session"]) == [
        (1, "system", ""),
        (2, "user", "hello world"),
        (3, "user", "next"),
    ]


@pytest.mark.parametrize(
    "vector",
    [[float("inf"), float("-inf"), 1.0], [1e308, 1e308, 1.0], [-1e308, 1e308, 1.0]],
    ids=["inf-minus-inf", "sum-overflows", "beyond-float32"],
)
async def test_vectors_that_break_fsum_are_validation_errors_on_add_and_search(
    db: Database, vector: list[float]
) -> None:
    base = await base_rows(db)
    before = await snapshot(db)
    async with db.unit_of_work() as uow:
        for call in (
            lambda: uow.passages.add(base["agent"], "v", vector),
            lambda: uow.passages.update_text(base["passage"], "v", vector),
            lambda: uow.passages.search(base["agent"], vector),
            lambda: uow.passages.hybrid_search(base["agent"], "hello", vector),
        ):
            with pytest.raises(ValidationError, match="embedding"):
                await call()
    assert await snapshot(db) == before


def _past_the_columns(b: dict[str, Any]) -> dict[str, Callable[[UnitOfWork], Awaitable[Any]]]:
    """Calls whose integer is past its column on both engines (SQLite raised OverflowError)."""
    message = {"role": "user", "content": "x"}
    return {
        "sessions.list offset": lambda u: u.sessions.list(b["agent"], offset=2**63),
        "agents.list offset": lambda u: u.agents.list(offset=2**63),
        "passages.list offset": lambda u: u.passages.list(b["agent"], offset=2**63),
        "messages.search offset": lambda u: u.messages.search(b["agent"], "hello", offset=2**63),
        "messages.between offset": lambda u: u.messages.between(b["agent"], _D1, _D2, offset=2**63),
        "passages.search offset": lambda u: u.passages.search(b["agent"], _V, offset=2**63),
        "passages.search_text offset": lambda u: u.passages.search_text(b["agent"], "hello", offset=2**63),
        "token_count 2**63": lambda u: u.messages.append(b["session"], {**message, "token_count": 2**63}),
        "token_count 2**31": lambda u: u.messages.append(b["session"], {**message, "token_count": 2**31}),
        "max_tokens": lambda u: u.messages.context(b["session"], max_tokens=2**63),
        "keep_last": lambda u: u.messages.trim(b["session"], keep_last=2**63),
        "expected_version": lambda u: u.agents.update(b["agent"], system="s", expected_version=2**63),
        "expected_version 2**31": lambda u: u.agents.update_core_memory(
            b["agent"], "human", "v", expected_version=2**31
        ),
        "delete_after seq": lambda u: u.messages.delete_after(b["session"], 2**63),
        "window before_seq": lambda u: u.messages.window(b["session"], before_seq=2**63),
        "window after_seq": lambda u: u.messages.window(b["session"], after_seq=-(2**63) - 1),
    }


async def test_integers_past_the_columns_are_validation_errors_on_both_engines(db: Database) -> None:
    base = await base_rows(db)
    before = await snapshot(db)
    async with db.unit_of_work() as uow:
        for name, call in _past_the_columns(base).items():
            with pytest.raises(ValidationError, match="expected an integer"):
                await call(uow)
            assert uow.link.state.failed is None, f"{name}: the database, not memorm, refused it"
    assert await snapshot(db) == before


async def test_engines_agree_at_the_32_bit_boundaries(db: Database) -> None:
    base = await base_rows(db)
    async with db.unit_of_work() as uow:
        # token_count=2**31 was stored by SQLite and refused by Postgres.
        with pytest.raises(ValidationError, match="token_count"):
            await uow.messages.append(base["session"], {"role": "user", "content": "x", "token_count": 2**31})
        [top] = await uow.messages.append(
            base["session"], {"role": "user", "content": "x", "token_count": 2**31 - 1}
        )
        # delete_after(2**31 - 1) succeeded on SQLite and failed on Postgres: nothing follows it.
        assert await uow.messages.delete_after(base["session"], 2**31 - 1) == 0
        assert await uow.messages.window(base["session"], after_seq=2**31 - 1) == []
        assert await uow.messages.window(base["session"], before_seq=-(2**31)) == []
        assert [m.seq for m in await uow.messages.window(base["session"], after_seq=-(2**63))] == [1, 2, 3]
        assert [m.seq for m in await uow.messages.window(base["session"], before_seq=2**63 - 1)] == [1, 2, 3]
        # The largest budget: the newest message alone fills it, so after the system message's
        # own tokens nothing else fits.
        context = await uow.messages.context(base["session"], max_tokens=2**31 - 1)
        assert [m.id for m in context] == [base["system"]]
        assert top.token_count == 2**31 - 1


async def test_delete_after_below_every_seq_deletes_everything(db: Database) -> None:
    base = await base_rows(db)
    async with db.unit_of_work() as uow:
        assert await uow.messages.delete_after(base["session"], -(2**63)) == 2
        [first] = await uow.messages.append(base["session"], {"role": "user", "content": "again"})
    assert first.seq == -(2**31)  # the counter restarts at the lowest seq there can be
    assert await _rows(db, base["session"]) == [(-(2**31), "user", "again")]


async def test_between_date_min_and_date_max_is_refused_and_the_widest_range_works(db: Database) -> None:
    base = await base_rows(db)
    async with db.unit_of_work(read_only=True) as uow:
        with pytest.raises(ValidationError, match="start: 0001-01-01"):
            await uow.messages.between(base["agent"], date.min, date.max)
        with pytest.raises(ValidationError, match="end: 9999-12-31"):
            await uow.messages.between(base["agent"], date(2000, 1, 1), date.max)
        page = await uow.messages.between(base["agent"], date(1, 1, 2), date(9999, 12, 30))
    assert page.total == 2


async def test_touch_past_the_last_timestamp_is_refused_and_changes_nothing(db: Database) -> None:
    base = await base_rows(db)
    before = await snapshot(db)
    async with db.unit_of_work() as uow:
        with pytest.raises(ValidationError, match=r"now \+ ttl"):
            await uow.sessions.touch(
                base["session"], ttl=7200, now=datetime(9999, 12, 30, 23, tzinfo=timezone.utc)
            )
        with pytest.raises(ValidationError, match="now: "):
            await uow.sessions.touch(base["session"], ttl=60, now=datetime.max.replace(tzinfo=timezone.utc))
        with pytest.raises(ValidationError, match="now: "):
            await uow.sessions.purge_expired(now=datetime(9999, 12, 31, 20, tzinfo=WEST))
    assert await snapshot(db) == before


@pytest.mark.parametrize(
    "call",
    [
        lambda u, b: u.messages.append(b["session"], None),
        lambda u, b: u.messages.prepend(b["session"], 5),
        lambda u, b: u.passages.add_many(b["agent"], None),
        lambda u, b: u.passages.get_many(None),
        lambda u, b: u.passages.delete_many(b["agent"], None),
        lambda u, b: u.messages.window(b["session"], roles=5),
        lambda u, b: u.messages.count(b["session"], roles=[["user"]]),
        lambda u, b: u.messages.append(b["session"], {"role": ["user"], "content": "x"}),
        lambda u, b: u.messages.context(b["session"], max_tokens=10, pinned_system=np.array([1, 2])),
        lambda u, b: u.passages.search(b["agent"], _V, metric=np.array([1, 2])),
        lambda u, b: u.passages.define_model(b["agent"], "m", 3, precision=np.array([1, 2])),
        lambda u, b: u.sessions.purge_expired(dry_run=np.array([1, 2])),
        lambda u, b: u.agents.create("x", meta={"big": 10**5000}),
        lambda u, b: u.passages.add(b["agent"], "t", [10**400, 1.0, 1.0]),
        lambda u, b: u.sessions.create(b["agent"], ttl=10**5000),
    ],
    ids=[
        "append-None",
        "prepend-int",
        "add_many-None",
        "get_many-None",
        "delete_many-None",
        "window-roles-int",
        "count-roles-unhashable",
        "role-unhashable",
        "pinned_system-array",
        "metric-array",
        "precision-array",
        "dry_run-array",
        "meta-int-past-str-digits",
        "vector-int-past-float",
        "ttl-int-past-str-digits",
    ],
)
async def test_wrong_types_are_validation_errors(
    db: Database, call: Callable[[UnitOfWork, dict[str, Any]], Awaitable[Any]]
) -> None:
    base = await base_rows(db)
    async with db.unit_of_work() as uow:
        with pytest.raises(ValidationError):
            await call(uow, base)


_EDGES = [  # the first and last instants memorm stores, in zones from -12:00 to +14:00
    MIN_TIME,
    MIN_TIME.astimezone(timezone(timedelta(hours=14))),
    MAX_TIME,
    MAX_TIME.astimezone(timezone(timedelta(hours=-12))),
]
_OUTSIDE = [
    datetime.min.replace(tzinfo=timezone.utc),  # Postgres stored it as -infinity
    datetime.max.replace(tzinfo=timezone.utc),  # ... and this as infinity
    datetime(9999, 12, 30, 23, tzinfo=timezone(timedelta(hours=-12))),  # 9999-12-31 11:00 UTC
    datetime(1, 1, 2, 1, tzinfo=timezone(timedelta(hours=14))),  # 0001-01-01 11:00 UTC
    MIN_TIME - timedelta(microseconds=1),
    MAX_TIME + timedelta(microseconds=1),
]


async def test_timestamps_outside_the_range_are_refused_and_its_edges_read_back(db: Database) -> None:
    base = await base_rows(db)
    async with db.unit_of_work() as uow:
        for instant in _OUTSIDE:
            with pytest.raises(ValidationError, match="is outside the range"):
                await uow.messages.append(
                    base["session"], {"role": "user", "content": "x", "created_at": instant}
                )
            with pytest.raises(ValidationError, match="is outside the range"):
                await uow.passages.add_many(
                    base["agent"], [{"text": "x", "embedding": _V, "created_at": instant}]
                )
            with pytest.raises(ValidationError, match="is outside the range"):
                await uow.messages.delete_before(base["agent"], instant)
            with pytest.raises(ValidationError, match="is outside the range"):
                await uow.passages.search(base["agent"], _V, where={"created_at": {"$lt": instant}})
        stored = await uow.messages.append(
            base["session"],
            [{"role": "user", "content": f"edge {i}", "created_at": edge} for i, edge in enumerate(_EDGES)],
        )
        await uow.passages.add_many(
            base["agent"],
            [{"text": f"edge {i}", "embedding": _V, "created_at": edge} for i, edge in enumerate(_EDGES)],
        )
    # Before the fix, Postgres held ±infinity here, and every read of the session raised
    # "year 0 is out of range".
    await assert_readable(db, base)
    async with db.unit_of_work(read_only=True) as uow:
        window = await uow.messages.window(base["session"], limit=1000)
        assert [m.created_at for m in window[2:]] == _EDGES
        assert all(m.created_at.tzinfo is timezone.utc for m in window)
        assert (await uow.messages.get(stored[0].id)).created_at == MIN_TIME
        assert (await uow.messages.search(base["agent"], "edge")).total == 4
        every = await uow.messages.between(base["agent"], MIN_TIME, MAX_TIME, limit=1000)
        assert (every.items[0].created_at, every.items[-1].created_at) == (MIN_TIME, MAX_TIME)
        passages = await uow.passages.list(base["agent"], limit=1000)
        assert {p.created_at for p in passages.items} >= set(_EDGES)
        hits = await uow.passages.search(base["agent"], _V, k=10, where={"created_at": {"$lte": MIN_TIME}})
        assert [hit.passage.created_at for hit in hits] == [MIN_TIME, MIN_TIME]
