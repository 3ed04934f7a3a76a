"""MemormStore's filters answer as LangGraph's InMemoryStore does, on both engines: objects and lists too.

The oracle (`_holds`) is InMemoryStore's `filter` semantics with memorm's two
documented differences (docs/integrations/langgraph.md): JSON types stay apart
(`True` is not `1`), and None is a JSON null that is there, not a missing key.
The property checks both engines against the oracle, and the oracle against a
real `InMemoryStore` wherever those differences cannot arise.
"""

from __future__ import annotations

import operator
import uuid
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from langgraph.store.base import PutOp
from langgraph.store.memory import InMemoryStore

from memorm import Database, ValidationError
from memorm.compat.langgraph import MemormStore
from memorm.search.json_match import MAX_NODES

pytestmark = pytest.mark.anyio

_ORDER = {"$gt": operator.gt, "$gte": operator.ge, "$lt": operator.lt, "$lte": operator.le}
_NESTED_KEYS = ["x", "y", "é", "a b", ""]  # keys inside values: any text a JSON path can name
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, 1, -2, 1.0, 2.5]),
    st.sampled_from(["", "a", "b", "é", "[1]", '{"x":1}']),
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(_NESTED_KEYS), inner, max_size=3)
    ),
    max_leaves=8,
)
_VALUES = st.dictionaries(st.sampled_from(["n", "s"]), _JSON, max_size=2)


# -- the oracle --------------------------------------------------------------------------------


def _kind(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, (int, float)):
        return "number"
    return type(value).__name__


def _same(have: Any, want: Any) -> bool:
    """JSON equality, whole: objects whatever their key order, `1` is `1.0`, `True` is not `1`."""
    if _kind(have) != _kind(want):
        return False
    if isinstance(want, dict):
        return have.keys() == want.keys() and all(_same(have[k], v) for k, v in want.items())
    if isinstance(want, list):
        return len(have) == len(want) and all(_same(h, w) for h, w in zip(have, want, strict=True))
    return bool(have == want)


def _operators(value: Any) -> bool:
    return isinstance(value, dict) and any(key.startswith("$") for key in value)


def _matches(have: Any, present: bool, want: Any) -> bool:
    """InMemoryStore's `_compare_values`, JSON types apart and None a null that is there."""
    if _operators(want):
        return all(_operator(have, present, name, operand) for name, operand in want.items())
    if isinstance(want, dict):
        return (
            present
            and isinstance(have, dict)
            and all(_matches(have.get(key), key in have, item) for key, item in want.items())
        )
    if isinstance(want, list):
        return (
            present
            and isinstance(have, list)
            and len(have) == len(want)
            and all(_matches(h, True, w) for h, w in zip(have, want, strict=True))
        )
    return present and _same(have, want)


def _operator(have: Any, present: bool, name: str, operand: Any) -> bool:
    if name == "$eq":
        return present and _same(have, operand)
    if name == "$ne":
        return not (present and _same(have, operand))
    of_type = isinstance(have, str) if isinstance(operand, str) else _kind(have) == "number"
    return present and of_type and bool(_ORDER[name](have, operand))


def _holds(value: dict[str, Any], where: dict[str, Any]) -> bool:
    return all(_matches(value.get(key), key in value, want) for key, want in where.items())


def _anywhere(value: Any, test: Any) -> bool:
    if test(value):
        return True
    if isinstance(value, dict):
        return any(_anywhere(k, test) or _anywhere(v, test) for k, v in value.items())
    if isinstance(value, list):
        return any(_anywhere(v, test) for v in value)
    return False


def _langgraph_would_agree(items: list[dict[str, Any]], where: dict[str, Any]) -> bool:
    """Whether none of memorm's documented differences from InMemoryStore can show in this search."""
    return not (
        _anywhere(where, lambda v: v is None)  # None: a missing key, to InMemoryStore
        or _anywhere([items, where], lambda v: isinstance(v, bool))  # True == 1 in Python
        or _anywhere(where, lambda v: isinstance(v, str) and v in _ORDER)  # it orders by float()
    )


# -- filters drawn from the items, so that they find some -------------------------------------


@st.composite
def _reordered(draw: st.DrawFn, value: Any) -> Any:
    """`value` with its objects' keys in another order (the same JSON value)."""
    if isinstance(value, dict):
        keys = draw(st.permutations(list(value)))
        return {key: draw(_reordered(value[key])) for key in keys}
    if isinstance(value, list):
        return [draw(_reordered(item)) for item in value]
    return value


@st.composite
def _condition(draw: st.DrawFn, value: Any) -> Any:
    """A condition on `value`: itself, a part of it, an operator on it, or anything."""
    kind = draw(st.sampled_from(["same", "part", "eq", "ne", "order", "other"]))
    if kind == "part" and isinstance(value, dict):
        keys = draw(st.lists(st.sampled_from(list(value)), unique=True)) if value else []
        return {key: draw(_condition(value[key])) for key in keys}
    if kind == "part" and isinstance(value, list):
        return [draw(_condition(item)) for item in value]
    if kind == "eq":
        return {"$eq": draw(_reordered(value))}
    if kind == "ne":
        return {"$ne": draw(st.one_of(_reordered(value), _JSON))}
    if kind == "order":
        near = [value, value - 1, value + 0.5] if _kind(value) == "number" else []
        bound = draw(st.sampled_from([*near, 0, 1, 2.5, "", "a", "b"]))
        return {draw(st.sampled_from(list(_ORDER))): bound}
    if kind == "other":
        return draw(_JSON)
    return draw(_reordered(value))


@st.composite
def _searches(draw: st.DrawFn) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    items = draw(st.lists(_VALUES, min_size=1, max_size=6))
    model = draw(st.sampled_from(items))
    keys = draw(st.lists(st.sampled_from(["n", "s"]), min_size=1, max_size=2, unique=True))
    where = {key: draw(_condition(model[key])) if key in model else draw(_JSON) for key in keys}
    return items, where


async def _memorm_finds(db: Database, items: list[dict[str, Any]], where: dict[str, Any]) -> set[str]:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.get_by_name("filters") or await uow.agents.create("filters")
    store = MemormStore(db, agent=agent.id)
    namespace = ("f", uuid.uuid4().hex)  # each example its own items
    await store.abatch([PutOp(namespace, f"k{i}", value) for i, value in enumerate(items)])
    return {item.key for item in await store.asearch(namespace, filter=where, limit=100)}


@given(search=_searches())
# Objects compare whatever their keys' order (SQLite compared their text)...
@example(search=([{"n": {"x": 1, "y": 2}}], {"n": {"y": 2, "x": 1}}))
@example(search=([{"n": {"x": 1, "y": 2}}], {"n": {"$eq": {"y": 2, "x": 1}}}))
# ...a list holds for a list of its length, item by item (Postgres' @> took any list holding its items)...
@example(search=([{"n": ["a", "b"]}, {"n": ["b", "a"]}], {"n": ["a"]}))
@example(search=([{"n": ["a", "b"]}, {"n": ["b", "a"]}], {"n": ["b", "a"]}))
# ...an object for an object with those keys (others allowed), operators inside it too.
@example(search=([{"n": {"x": 1, "y": 2}}, {"n": {"x": 2}}], {"n": {"x": 1}}))
@example(search=([{"n": {"x": [1, {"y": 2.5}]}}], {"n": {"x": [{"$gte": 1}, {"y": {"$ne": 2}}]}}))
async def test_filters_find_what_langgraphs_in_memory_store_finds(
    db: Database, search: tuple[list[dict[str, Any]], dict[str, Any]]
) -> None:
    items, where = search
    expected = {f"k{i}" for i, value in enumerate(items) if _holds(value, where)}
    assert await _memorm_finds(db, items, where) == expected
    if _langgraph_would_agree(items, where):
        reference = InMemoryStore()
        for i, value in enumerate(items):
            reference.put(("f",), f"k{i}", value)
        assert {item.key for item in reference.search(("f",), filter=where, limit=100)} == expected


async def test_a_filter_that_sql_could_not_spell_alike_is_refused_before_any_statement(db: Database) -> None:
    store = MemormStore(db, agent=(await _agent(db)).id)
    for where, words in (
        ({"n": {'a"b': 1}}, "cannot name"),  # keys SQLite's JSON paths cannot name on every version
        ({"n": {"a\\b": 1}}, "cannot name"),
        ({"n": {"x": {"$regex": "a"}}}, "is not one of"),  # operators at any depth are LangGraph's
        ({"n": {"x": {"$gt": [1]}}}, "number or a string"),
        ({"n": list(range(MAX_NODES))}, "values to compare"),
    ):
        with pytest.raises(ValidationError, match=words):
            await store.asearch(("f",), filter=where)


async def _agent(db: Database) -> Any:
    async with db.unit_of_work() as uow:
        return await uow.agents.create("refused")
