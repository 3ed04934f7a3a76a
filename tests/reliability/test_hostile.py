"""Hostile input: every public call either round-trips exactly or raises a ``MemormError``.

Property-based over both engines.  A rejected call must leave the database
byte-for-byte unchanged (a hash of every row of the five tables, before and
after).  Counts of inputs tried, accepted and rejected per category go to
``.bench/reliability-hostile-<engine>.json``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import date, datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from memorm import Database
from memorm.errors import MemormError
from memorm.page import Page
from memorm.uow import UnitOfWork

pytestmark = [pytest.mark.anyio, pytest.mark.reliability]

BENCH = Path(__file__).resolve().parents[2] / ".bench"
TABLES = ("agents", "sessions", "messages", "archival_passages", "embedding_models")
COUNTS: dict[str, dict[str, dict[str, int]]] = {}
HOSTILE = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

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


# -- bookkeeping ----------------------------------------------------------------


def _record(engine: str, category: str, outcome: str) -> None:
    counts = COUNTS.setdefault(engine, {}).setdefault(category, {"tried": 0, "ok": 0, "rejected": 0})
    counts["tried"] += 1
    counts[outcome] += 1


@pytest.fixture(autouse=True)
def _report(engine: str) -> Iterator[None]:
    yield
    BENCH.mkdir(exist_ok=True)
    counts = COUNTS.get(engine, {})
    total = {key: sum(c[key] for c in counts.values()) for key in ("tried", "ok", "rejected")}
    path = BENCH / f"reliability-hostile-{engine}.json"
    path.write_text(json.dumps({"engine": engine, "total": total, "categories": counts}, indent=2) + "\n")


async def snapshot(db: Database) -> str:
    """A hash of every row of memorm's tables, ordered by id."""
    digest = hashlib.sha256()
    async with db.unit_of_work(read_only=True) as uow:
        for table in TABLES:
            rows = (await uow.session.execute(sa.text(f"SELECT * FROM {table} ORDER BY id"))).all()
            digest.update(repr(rows).encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


async def attempt(
    db: Database,
    engine: str,
    category: str,
    call: Callable[[UnitOfWork], Awaitable[Any]],
) -> tuple[bool, Any]:
    """Run ``call`` in its own unit of work: (True, result), or (False, None) after a clean rejection."""
    before = await snapshot(db)
    try:
        async with db.unit_of_work() as uow:
            result = await call(uow)
    except MemormError:
        assert await snapshot(db) == before, f"{category}: a rejected call changed the database"
        _record(engine, category, "rejected")
        return False, None
    _record(engine, category, "ok")
    return True, result


async def _fixture_rows(db: Database) -> dict[str, Any]:
    """One agent with a session, a message and passages of a float32 and a float16 model (3-d)."""
    async with db.unit_of_work() as uow:
        agent = await uow.agents.get_by_name("base")
        if agent is None:
            agent = await uow.agents.create("base")
            await uow.passages.define_model(agent.id, "default", 3)
            await uow.passages.define_model(agent.id, "half", 3, precision="float16")
            chat = await uow.sessions.create(agent.id, key="base")
            [message] = await uow.messages.append(chat.id, {"role": "user", "content": "hello world"})
            passage = await uow.passages.add(agent.id, "hello world", [1.0, 0.5, 0.25])
        else:
            chat = await uow.sessions.get_by_key(agent.id, "base")
            assert chat is not None
            [message] = await uow.messages.window(chat.id, limit=1, after_seq=0)
            [passage] = (await uow.passages.list(agent.id, limit=1)).items
    return {"agent": agent.id, "session": chat.id, "message": message.id, "passage": passage.id}


# -- text -----------------------------------------------------------------------


@HOSTILE
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
    base = await _fixture_rows(db)
    ok, _ = await attempt(
        db, engine, "text:core_memory", lambda uow: uow.agents.update_core_memory(base["agent"], block, name)
    )
    if ok:
        async with db.unit_of_work(read_only=True) as uow:
            assert (await uow.agents.get(base["agent"])).core_memory[block] == name


@HOSTILE
@given(content=TEXTS, name=st.none() | TEXTS)
@example(content=BIG, name=BIG)
@example(content="\x00", name=None)
@example(content="x", name="\ud83d")
async def test_message_text_round_trips_or_is_rejected(
    db: Database, engine: str, content: str, name: str | None
) -> None:
    base = await _fixture_rows(db)
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


@HOSTILE
@given(text=TEXTS)
@example(text=BIG)
@example(text="\x00")
@example(text="\udfff")
async def test_passage_text_round_trips_or_is_rejected(db: Database, engine: str, text: str) -> None:
    base = await _fixture_rows(db)
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


@HOSTILE
@given(meta=METAS)
@example(meta={"big": 2**63})
@example(meta={"nan": float("nan")})
@example(meta={"deep": _nested(70)})
@example(meta={1: "int key"})
async def test_metadata_round_trips_or_is_rejected(db: Database, engine: str, meta: Any) -> None:
    base = await _fixture_rows(db)
    want = _plain(meta)
    ok, agent = await attempt(
        db,
        engine,
        "meta:agent",
        lambda uow: uow.agents.create(f"m-{uuid.uuid4().hex}", meta=meta, llm_config=meta),
    )
    if ok:
        async with db.unit_of_work(read_only=True) as uow:
            got = await uow.agents.get(agent.id)
        assert _same_json(got.meta, want), (got.meta, want)
        assert _same_json(got.llm_config, want), (got.llm_config, want)
    ok, chat = await attempt(
        db, engine, "meta:session", lambda uow: uow.sessions.create(base["agent"], meta=meta)
    )
    if ok:
        async with db.unit_of_work(read_only=True) as uow:
            assert _same_json((await uow.sessions.get(chat.id)).meta, want)
    ok, stored = await attempt(
        db,
        engine,
        "meta:message",
        lambda uow: uow.messages.append(
            base["session"], {"role": "assistant", "content": "x", "meta": meta, "tool_calls": [meta]}
        ),
    )
    if ok:
        async with db.unit_of_work(read_only=True) as uow:
            got_message = await uow.messages.get(stored[0].id)
        assert _same_json(got_message.meta, want or {})
        assert _same_json(got_message.tool_calls, [want])
    ok, passage = await attempt(
        db,
        engine,
        "meta:passage",
        lambda uow: uow.passages.add(base["agent"], "m", [1.0, 0.0, 0.0], meta=meta),
    )
    if ok:
        async with db.unit_of_work(read_only=True) as uow:
            assert _same_json((await uow.passages.get(passage.id)).meta, want)


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


@HOSTILE
@given(query=QUERIES)
@example(query='"hello')
@example(query="hello' OR 1=1 --")
@example(query="hello AND NOT world")
@example(query="\x00")
@example(query="*")
async def test_search_metacharacters_are_words(db: Database, engine: str, query: str) -> None:
    base = await _fixture_rows(db)
    found = _expect_found(query)
    ok, page = await attempt(
        db, engine, "search:messages", lambda uow: uow.messages.search(base["agent"], query)
    )
    if ok:
        assert isinstance(page, Page)
        assert page.total >= len(page.items)
        assert all(m.agent_id == base["agent"] for m in page.items)
        if found is not None:
            assert (page.total >= 1) == found, (query, page.total)
    ok, page = await attempt(
        db, engine, "search:passages", lambda uow: uow.passages.search_text(base["agent"], query)
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


@HOSTILE
@given(embedding=VECTORS, model=st.sampled_from(["default", "half"]))
@example(embedding=[float("inf"), 0.0, 0.0], model="default")
@example(embedding=[1.0, 2.0], model="default")
@example(embedding=[1.0, "x", 2.0], model="half")
async def test_embeddings_round_trip_or_are_rejected(
    db: Database, engine: str, embedding: Any, model: str
) -> None:
    base = await _fixture_rows(db)
    half = model == "half"
    ok, passage = await attempt(
        db,
        engine,
        "embedding:add",
        lambda uow: uow.passages.add(base["agent"], "v", embedding, embedding_model=model),
    )
    if ok:
        async with db.unit_of_work(read_only=True) as uow:
            got = (await uow.passages.get(passage.id)).vector
        want = [_stored(float(x), half) for x in embedding]
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7 if half else 1e-37), (got, want)
    ok, hits = await attempt(
        db,
        engine,
        "embedding:search",
        lambda uow: uow.passages.search(base["agent"], embedding, embedding_model=model, k=5),
    )
    if ok:
        assert all(hit.passage.agent_id == base["agent"] for hit in hits)
        # Finite distances are pinned by test_cosine_search_never_returns_nan below.


async def test_cosine_search_never_returns_nan(db: Database, engine: str) -> None:
    base = await _fixture_rows(db)
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


@HOSTILE
@given(bad=BAD_IDS)
@example(bad=None)
@example(bad=0)
@example(bad=uuid.UUID(int=0))
async def test_wrong_ids_are_rejected_everywhere(db: Database, engine: str, bad: Any) -> None:
    base = await _fixture_rows(db)
    before = await snapshot(db)
    for name, call in ID_CALLS.items():
        if bad is None and name.endswith("/session"):
            continue  # session_id=None is the documented "every session"
        try:
            async with db.unit_of_work() as uow:
                result = await call(uow, bad, base)
        except MemormError:
            _record(engine, "id:" + name.split(".")[0], "rejected")
            continue
        _record(engine, "id:" + name.split(".")[0], "ok")
        assert _empty(result), f"{name}({bad!r}) found something: {result!r:.200}"
    # Every call above was a no-op or a rejection: together they changed nothing.
    assert await snapshot(db) == before
