"""JSON values compared in SQL as LangGraph's in-memory store compares them, alike on both engines.

A wanted value is unrolled into conditions on paths into the column (its
type there, a list's length, an object's number of keys, a scalar's
value), so that neither engine's own notion of JSON equality decides:
SQLite would compare objects as text (key order counting) and Postgres'
containment (`@>`) would take a list for any list holding its items.

* `matching`: LangGraph's `InMemoryStore` filter.  An object holds for an
  object whose keys it names match (other keys may be there), a list for
  a list of the same length whose items match in order, a scalar for the
  same JSON value; an object of operators (`{"$gt": 3}`) applies them at
  that point, at any depth.
* `equality` (`$eq`, `$ne`, the saver's metadata filters): the whole value
  is equal: an object with the same keys in any order and equal values, a
  list of the same length with equal items.

Scalars compare with their JSON types: `1` is `1.0`, `True` is not `1`,
and None is a JSON null that is there, not a missing key (LangGraph's
in-memory store takes a missing key for None, and Python's `True == 1`;
its Postgres store neither).  Keys inside a wanted value are any text
without `"`, `\\` or control characters (which SQLite's JSON paths cannot
name alike on every version).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql import ColumnElement

from memorm.errors import ValidationError
from memorm.types.json import dumps
from memorm.validation import check_json, shown

__all__ = [
    "COMPARISONS",
    "MAX_NODES",
    "Kind",
    "Parts",
    "check_condition",
    "check_value",
    "condition_sql",
    "equality",
    "matching",
]

COMPARISONS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")
"""The operators a condition takes (LangGraph's store filters)."""
MAX_NODES = 1000
"""The most JSON values (objects, lists and scalars, nested ones counted) one filter may hold."""

_ORDER = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}
_UNNAMEABLE = re.compile(r'["\\\x00-\x1f]')

Kind = tuple[Any, ...]
"""What a condition's SQL looks like, its values left out (they are `Parts`, named in it)."""
Step = str | int
Bind = Callable[..., Any]
"""`bind(name, type_=None)`: the bind parameter of one part of a condition's values."""


class Parts:
    """A condition's values by parameter name (`{prefix}{n}`): the same shape names them alike."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.values: dict[str, Any] = {}

    def add(self, value: Any) -> str:
        name = f"{self.prefix}{len(self.values)}"
        self.values[name] = value
        return name


def operators(value: object) -> bool:
    """Whether `value` is an object of operators (`{"$gt": 3}`) rather than a value to match."""
    return isinstance(value, Mapping) and any(isinstance(key, str) and key.startswith("$") for key in value)


# -- checks -------------------------------------------------------------------------------------


def check_value(value: object, field: str) -> None:
    """`value` is JSON whose keys SQL can name, of at most `MAX_NODES` values: a value to compare with."""
    check_json(value, field)
    if _walk(value, field, conditions=False) > MAX_NODES:
        raise ValidationError(f"{field}: more than {MAX_NODES:,} values to compare")


def check_condition(condition: object, field: str) -> int:
    """`condition` checked for `matching`: a value, or operators, at any depth; its size (values).

    Raises:
        ValidationError: not JSON, an unknown operator, an ordering operator
            whose operand is not a number or a string, or a key SQL cannot name.
    """
    check_json(condition, field)  # bounds the depth of the walk too
    return _walk(condition, field, conditions=True)


def _walk(value: object, field: str, *, conditions: bool) -> int:
    if conditions and operators(value):
        assert isinstance(value, Mapping)
        size = 0
        for name, operand in value.items():
            where = f"{field}.{name}"
            if name not in COMPARISONS:
                raise ValidationError(f"{field}: {name!r} is not one of {', '.join(COMPARISONS)}")
            if name in _ORDER and (isinstance(operand, bool) or not isinstance(operand, (int, float, str))):
                got = type(operand).__name__
                raise ValidationError(f"{where}: compare with a number or a string, got {got}")
            size += _walk(operand, where, conditions=False)
        return size
    if isinstance(value, Mapping):
        size = 1
        for key, item in value.items():
            if _UNNAMEABLE.search(key):
                raise ValidationError(
                    f"{field}: key {shown(key, 40)} holds a '\"', a '\\' or a control character, "
                    "which a filter cannot name"
                )
            size += _walk(item, f"{field}.{key}", conditions=conditions)
        return size
    if isinstance(value, (list, tuple)):
        return 1 + sum(_walk(item, f"{field}[{i}]", conditions=conditions) for i, item in enumerate(value))
    return 1


# -- conditions ---------------------------------------------------------------------------------


def matching(dialect: str, path: tuple[Step, ...], wanted: Any, parts: Parts) -> Kind:
    """The condition that the value at `path` matches `wanted` (checked by `check_condition`)."""
    if operators(wanted):
        return ("all", *(_operator(dialect, path, name, operand, parts) for name, operand in wanted.items()))
    if isinstance(wanted, Mapping):
        inside = (matching(dialect, (*path, key), item, parts) for key, item in wanted.items())
        return ("all", _is(dialect, path, "object", parts), *inside)
    if isinstance(wanted, (list, tuple)):
        inside = (matching(dialect, (*path, i), item, parts) for i, item in enumerate(wanted))
        return ("all", *_array(dialect, path, len(wanted), parts), *inside)
    return _scalar(dialect, path, wanted, parts)


def equality(dialect: str, path: tuple[Step, ...], wanted: Any, parts: Parts) -> Kind:
    """The condition that the value at `path` equals `wanted` (checked by `check_value`), whole."""
    if dialect == "postgresql":  # jsonb's equality: keys in any order, numbers by value, types apart
        return ("pg_equal", parts.add(_pg_path(path)), parts.add(dumps(wanted)))
    if isinstance(wanted, Mapping):
        inside = (equality(dialect, (*path, key), item, parts) for key, item in wanted.items())
        size = ("sqlite_keys", parts.add(_sqlite_path(path)), parts.add(len(wanted)))
        return ("all", _is(dialect, path, "object", parts), size, *inside)
    if isinstance(wanted, (list, tuple)):
        inside = (equality(dialect, (*path, i), item, parts) for i, item in enumerate(wanted))
        return ("all", *_array(dialect, path, len(wanted), parts), *inside)
    return _scalar(dialect, path, wanted, parts)


def _operator(dialect: str, path: tuple[Step, ...], name: str, operand: Any, parts: Parts) -> Kind:
    if name == "$eq":
        return equality(dialect, path, operand, parts)
    if name == "$ne":  # holds where the key is missing too
        return ("not", equality(dialect, path, operand, parts))
    number = not isinstance(operand, str)
    if dialect == "postgresql":
        at, kind = parts.add(_pg_path(path)), parts.add("number" if number else "string")
        return ("pg_order", _ORDER[name], at, kind, parts.add(dumps(operand)))
    types = ("integer", "real") if number else ("text",)
    at = parts.add(_sqlite_path(path))
    return ("sqlite_order", _ORDER[name], at, tuple(parts.add(t) for t in types), parts.add(operand))


def _is(dialect: str, path: tuple[Step, ...], json_type: str, parts: Parts) -> Kind:
    if dialect == "postgresql":
        return ("pg_type", parts.add(_pg_path(path)), parts.add(json_type))
    return ("sqlite_types", parts.add(_sqlite_path(path)), (parts.add(json_type),))


def _array(dialect: str, path: tuple[Step, ...], size: int, parts: Parts) -> tuple[Kind, Kind]:
    """The conditions that the value at `path` is a list of `size` items."""
    at = parts.add(_pg_path(path) if dialect == "postgresql" else _sqlite_path(path))
    length = (f"{'pg' if dialect == 'postgresql' else 'sqlite'}_length", at, parts.add(size))
    return _is(dialect, path, "array", parts), length


def _scalar(dialect: str, path: tuple[Step, ...], value: Any, parts: Parts) -> Kind:
    if dialect == "postgresql":
        return ("pg_equal", parts.add(_pg_path(path)), parts.add(dumps(value)))
    at = parts.add(_sqlite_path(path))
    if isinstance(value, str) and not value.startswith(("[", "{")):
        # `json_extract` gives a JSON string as text, a number or true/false as a number,
        # an object or list as its JSON text (which starts with "[" or "{"): only a JSON
        # string can equal this text, so the type need not be read (a second JSON parse).
        return ("sqlite_text", at, parts.add(value))
    if value is None or isinstance(value, bool):
        return ("sqlite_types", at, (parts.add("null" if value is None else str(value).lower()),))
    types = ("text",) if isinstance(value, str) else ("integer", "real")
    return ("sqlite_typed", at, tuple(parts.add(t) for t in types), parts.add(value))


def _sqlite_path(path: tuple[Step, ...]) -> str:
    return "$" + "".join(f"[{step}]" if isinstance(step, int) else f'."{step}"' for step in path)


def _pg_path(path: tuple[Step, ...]) -> list[str]:
    return [str(step) for step in path]


# -- SQL ----------------------------------------------------------------------------------------


def condition_sql(column: sa.Column[Any], kind: Kind, bind: Bind) -> ColumnElement[bool]:
    """The SQL of a condition of this `kind` on `column` (a JSON column), its values bound by `bind`."""
    name = kind[0]
    if name == "all":
        return sa.and_(sa.true(), *(condition_sql(column, inner, bind) for inner in kind[1:]))
    if name == "not":  # SQL's NULL (a missing key, a value of another type) is "not equal"
        return sa.not_(sa.func.coalesce(condition_sql(column, kind[1], bind), sa.false(), type_=sa.Boolean))
    if name.startswith("pg_"):
        return _postgres(column, kind, bind)
    return _sqlite(column, kind, bind)


def _postgres(column: sa.Column[Any], kind: Kind, bind: Bind) -> ColumnElement[bool]:
    name, *names = kind
    if name == "pg_order":
        operator, path, json_type, value = names
        found = _at(column, bind(path, postgresql.ARRAY(sa.Text)))
        typed = sa.func.jsonb_typeof(found) == bind(json_type)
        return sa.and_(typed, found.op(operator, is_comparison=True)(_jsonb(bind(value, sa.Text))))
    found = _at(column, bind(names[0], postgresql.ARRAY(sa.Text)))
    test: ColumnElement[bool]
    if name == "pg_equal":
        test = found == _jsonb(bind(names[1], sa.Text))
        return test
    if name == "pg_type":
        test = sa.func.jsonb_typeof(found) == bind(names[1])
        return test
    # pg_length: jsonb_array_length raises on anything but an array, so it is asked of arrays only
    size = sa.case((sa.func.jsonb_typeof(found) == "array", sa.func.jsonb_array_length(found)))
    test = size == bind(names[1], sa.Integer)
    return test


def _at(column: sa.Column[Any], path: Any) -> ColumnElement[Any]:
    at: ColumnElement[Any] = column.op("#>", return_type=postgresql.JSONB)(path)
    return at


def _jsonb(text: Any) -> ColumnElement[Any]:
    return sa.cast(text, postgresql.JSONB)


def _sqlite(column: sa.Column[Any], kind: Kind, bind: Bind) -> ColumnElement[bool]:
    name, *names = kind
    if name == "sqlite_order":
        operator, path, types, value = names
        typed = sa.func.json_type(column, bind(path)).in_([bind(t) for t in types])
        found = sa.func.json_extract(column, bind(path))
        return sa.and_(typed, found.op(operator, is_comparison=True)(bind(value)))
    path = bind(names[0])
    if name == "sqlite_text":
        text: ColumnElement[bool] = sa.func.json_extract(column, path) == bind(names[1])
        return text
    if name == "sqlite_types":
        return sa.func.json_type(column, path).in_([bind(t) for t in names[1]])
    if name == "sqlite_typed":
        typed = sa.func.json_type(column, path).in_([bind(t) for t in names[1]])
        return sa.and_(typed, sa.func.json_extract(column, bind(names[0])) == bind(names[2]))
    if name == "sqlite_length":  # 0 for what is no array, which the type's condition rules out
        length: ColumnElement[bool] = sa.func.json_array_length(column, path) == bind(names[1])
        return length
    # sqlite_keys: an object's members, counted
    members = sa.select(sa.func.count()).select_from(sa.func.json_each(column, path)).scalar_subquery()
    counted: ColumnElement[bool] = members == bind(names[1])
    return counted
