"""`where=` filters for archival passages: `meta` keys and `created_at` ranges, in SQL.

A filter is a dict:

```python
{"topic": "cats"}                            # meta["topic"] == "cats"
{"lang": {"$in": ["en", "fr"]}}              # meta["lang"] is one of these
{"created_at": {"$gte": start, "$lt": end}}  # a time range ($gt, $gte, $lt, $lte)
```

Several keys must all hold.  Values compare with their JSON types (`1` is
not `"1"`; `True` is not `1`).  Postgres uses jsonb containment
(`meta @> {...}`, which a GIN index on `meta` can serve); SQLite compares
`json_type` and `json_extract`.  Meta keys are letters, digits, `_` and
`-`, so none can reach a JSON path as syntax.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.sql import ColumnElement

from memorm.errors import ValidationError
from memorm.types import JSONType
from memorm.validation import check_aware, check_json

if TYPE_CHECKING:
    from memorm.link import Link

__all__ = [
    "COMPARISONS",
    "Filter",
    "ValueShape",
    "check_json_keys",
    "check_value_filter",
    "compile_filter",
    "filter_conditions",
    "json_key_conditions",
    "json_value_conditions",
    "shaped_conditions",
    "value_filter",
]

Filter = Mapping[str, Any]

_KEY = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_RANGE = {"$gt": "__gt__", "$gte": "__ge__", "$lt": "__lt__", "$lte": "__le__"}
_MAX_IN = 1000
COMPARISONS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")
"""The operators `json_value_conditions` takes (LangGraph's store filters)."""
_ORDER = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}


def _sqlite_json_type(value: Any) -> tuple[str, ...]:
    if value is None:
        return ("null",)
    if value is True:
        return ("true",)
    if value is False:
        return ("false",)
    if isinstance(value, (int, float)):
        return ("integer", "real")
    return ("text",)


Bind = Callable[..., Any]
"""`bind(part, type_=None)`: the bind parameter for one part of a condition's values."""


def _equality(dialect: str, key: str, value: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The kind of SQL that tests "the JSON object holds `key` with `value`", and its values by part.

    Postgres: containment (`@>`).  SQLite: the value's `json_type` at the
    key's path, and (but for null, true and false) its `json_extract`;
    objects and lists compare as their compact JSON text.
    """
    if dialect == "postgresql":
        return ("contains",), {"value": {key: value}}
    path = f'$."{key}"'
    if isinstance(value, (Mapping, list, tuple)):
        kind = "object" if isinstance(value, Mapping) else "array"
        return ("container",), {"path": path, "type0": kind, "value": _compact(value)}
    if isinstance(value, str) and not value.startswith(("[", "{")):
        # `json_extract` gives a JSON string as text, a number or true/false as a number,
        # an object or list as its JSON text (which starts with "[" or "{"): only a JSON
        # string can equal this text, so the type need not be read (a second JSON parse).
        return ("text",), {"path": path, "value": value}
    types = _sqlite_json_type(value)
    parts: dict[str, Any] = {"path": path, **{f"type{i}": name for i, name in enumerate(types)}}
    if value is None or isinstance(value, bool):
        return ("type", len(types)), parts
    return ("typed", len(types)), {**parts, "value": value}


def _equal_sql(column: sa.Column[Any], kind: tuple[Any, ...], bind: Bind) -> ColumnElement[bool]:
    """The SQL of an `_equality` of this `kind` on `column`, its values bound by `bind`."""
    if kind[0] == "contains":
        return column.op("@>")(bind("value", JSONType()))
    if kind[0] == "text":
        text: ColumnElement[bool] = sa.func.json_extract(column, bind("path")) == bind("value")
        return text
    path = bind("path")
    if kind[0] == "container":
        found = sa.func.json_type(column, path) == bind("type0")
        return sa.and_(found, sa.func.json_extract(column, bind("path")) == bind("value"))
    found = sa.func.json_type(column, path).in_([bind(f"type{i}") for i in range(kind[1])])
    if kind[0] == "type":
        return found
    return sa.and_(found, sa.func.json_extract(column, bind("path")) == bind("value"))


def _ordering(dialect: str, key: str, operator: str, operand: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """`column[key] <operator> operand` for a number or a string (of that JSON type only): kind, values."""
    number = not isinstance(operand, str)
    if dialect == "postgresql":
        return ("order", operator), {"key": key, "type0": "number" if number else "string", "value": operand}
    types = ("integer", "real") if number else ("text",)
    parts = {f"type{i}": name for i, name in enumerate(types)}
    return ("order", operator, len(types)), {"path": f'$."{key}"', **parts, "value": operand}


def _ordered_sql(column: sa.Column[Any], kind: tuple[Any, ...], bind: Bind) -> ColumnElement[bool]:
    operator = kind[1]
    if len(kind) == 2:  # Postgres
        found = column.op("->")(bind("key", sa.Text))
        typed = sa.func.jsonb_typeof(found) == bind("type0")
        return sa.and_(typed, found.op(operator, is_comparison=True)(bind("value", JSONType())))
    typed = sa.func.json_type(column, bind("path")).in_([bind(f"type{i}") for i in range(kind[2])])
    value = sa.func.json_extract(column, bind("path"))
    return sa.and_(typed, value.op(operator, is_comparison=True)(bind("value")))


def _equals(dialect: str, meta: sa.Column[Any], key: str, value: Any) -> ColumnElement[bool]:
    kind, parts = _equality(dialect, key, value)
    return _equal_sql(meta, kind, lambda part, type_=None: sa.bindparam(None, parts[part], type_=type_))


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def compile_filter(dialect: str, table: sa.Table, where: Filter | None) -> list[ColumnElement[bool]]:
    """SQL conditions for `where` on `table` (which has `meta` and `created_at`)."""
    if where is None:
        return []
    if not isinstance(where, Mapping):
        raise ValidationError(f"where: expected a dict, got {type(where).__name__}")
    conditions: list[ColumnElement[bool]] = []
    for key, condition in where.items():
        if key == "created_at":
            conditions += _time_range(table.c.created_at, condition)
            continue
        if not isinstance(key, str) or not _KEY.match(key):
            raise ValidationError(f"where: meta key {key!r} must be 1-64 letters, digits, '_' or '-'")
        if isinstance(condition, Mapping):
            if set(condition) != {"$in"}:
                raise ValidationError(f"where.{key}: use a value, or {{'$in': [values]}}")
            options = condition["$in"]
            if not isinstance(options, (list, tuple)) or not 1 <= len(options) <= _MAX_IN:
                raise ValidationError(f"where.{key}.$in: expected a list of 1 to {_MAX_IN} values")
            for option in options:
                _check_scalar(option, key)
            conditions.append(sa.or_(*(_equals(dialect, table.c.meta, key, v) for v in options)))
        else:
            _check_scalar(condition, key)
            conditions.append(_equals(dialect, table.c.meta, key, condition))
    return conditions


async def filter_conditions(link: Link, table: sa.Table, where: Filter | None) -> list[ColumnElement[bool]]:
    """`compile_filter` for the database of the unit of work's connection (`link`)."""
    return compile_filter(link.dialect.name, table, where)


def check_json_keys(where: object, field: str) -> Filter:
    """`where`, checked for `json_key_conditions`: a dict of meta-like keys to JSON values."""
    if not isinstance(where, Mapping):
        raise ValidationError(f"{field}: expected a dict, got {type(where).__name__}")
    for key, value in where.items():
        if not isinstance(key, str) or not _KEY.match(key):
            raise ValidationError(f"{field}: key {key!r} must be 1-64 letters, digits, '_' or '-'")
        check_json(value, f"{field}.{key}")
    return where


def json_key_conditions(
    link: Link, column: sa.Column[Any], where: Filter, field: str
) -> list[ColumnElement[bool]]:
    """Conditions that `column` (a JSON object) holds each key of `where` with its value.

    Any JSON value compares: scalars by value and JSON type, as `where=`
    filters do; objects and lists by containment on Postgres (`@>`), by
    their compact JSON text on SQLite.  Keys are as meta keys are.
    """
    dialect = link.dialect.name
    return [_equals(dialect, column, key, value) for key, value in check_json_keys(where, field).items()]


def check_value_filter(where: object, field: str) -> Filter:
    """`where`, checked for `json_value_conditions` (without building SQL): a dict of keys to conditions."""
    if not isinstance(where, Mapping):
        raise ValidationError(f"{field}: expected a dict, got {type(where).__name__}")
    for key, condition in where.items():
        if not isinstance(key, str) or not _KEY.match(key):
            raise ValidationError(f"{field}: key {key!r} must be 1-64 letters, digits, '_' or '-'")
        if not _has_operators(condition):
            check_json(condition, f"{field}.{key}")
            continue
        for name, operand in condition.items():
            where_ = f"{field}.{key}.{name}"
            if name not in COMPARISONS:
                raise ValidationError(f"{field}.{key}: {name!r} is not one of {', '.join(COMPARISONS)}")
            if name in _ORDER and (isinstance(operand, bool) or not isinstance(operand, (int, float, str))):
                raise ValidationError(
                    f"{where_}: compare with a number or a string, got {type(operand).__name__}"
                )
            check_json(operand, where_)
    return where


def _has_operators(condition: object) -> bool:
    return isinstance(condition, Mapping) and any(
        isinstance(name, str) and name.startswith("$") for name in condition
    )


def json_value_conditions(
    link: Link, column: sa.Column[Any], where: object, field: str
) -> list[ColumnElement[bool]]:
    """Conditions on the keys of `column` (a JSON object): values, or comparisons by operator.

    `{"color": "red"}` and `{"color": {"$eq": "red"}}` hold where the key
    holds that JSON value (as `json_key_conditions`); `$ne` where it does
    not (a missing key included); `$gt`, `$gte`, `$lt` and `$lte` compare
    a number with numbers and a string with strings (byte order on SQLite,
    Postgres' collation there), and never hold for a value of another JSON
    type.  Several operators on a key must all hold, as must several keys.
    """
    dialect = link.dialect.name
    shape, values = value_filter(dialect, where, field)
    return shaped_conditions(column, shape, values)


ValueShape = tuple[tuple[str, tuple[Any, ...]], ...]
"""What a `json_value_conditions` filter's SQL looks like, its values left out."""


def value_filter(dialect: str, where: object, field: str) -> tuple[ValueShape, dict[str, Any]]:
    """`where` (checked) as its shape and its values, by parameter name (`filter_0_value`, …).

    Filters of one shape make the same SQL (`shaped_conditions`), whatever
    their keys and values: a statement built once per shape serves them all.
    """
    shape: list[tuple[str, tuple[Any, ...]]] = []
    values: dict[str, Any] = {}
    for key, condition in check_value_filter(where, field).items():
        tests = list(condition.items()) if _has_operators(condition) else [("$eq", condition)]
        for name, operand in tests:
            if name in _ORDER:
                kind, parts = _ordering(dialect, key, _ORDER[name], operand)
            else:
                kind, parts = _equality(dialect, key, operand)
            prefix = f"filter_{len(shape)}_"
            values.update({prefix + part: value for part, value in parts.items()})
            shape.append((name, kind))
    return tuple(shape), values


def shaped_conditions(
    column: sa.Column[Any], shape: ValueShape, values: Mapping[str, Any] | None = None
) -> list[ColumnElement[bool]]:
    """The conditions of a `value_filter` shape on `column`.

    With `values`, they hold them; without, their parameters are named as
    `value_filter` names the values (for a statement built once per shape).
    """
    conditions: list[ColumnElement[bool]] = []
    for index, (name, kind) in enumerate(shape):

        def bind(part: str, type_: Any = None, prefix: str = f"filter_{index}_") -> Any:
            if values is None:
                return sa.bindparam(prefix + part, type_=type_)
            return sa.bindparam(None, values[prefix + part], type_=type_)

        if name in _ORDER:
            conditions.append(_ordered_sql(column, kind, bind))
            continue
        equal = _equal_sql(column, kind, bind)
        if name == "$ne":
            equal = sa.not_(sa.func.coalesce(equal, sa.false(), type_=sa.Boolean))
        conditions.append(equal)
    return conditions


def _check_scalar(value: Any, key: str) -> None:
    if not (value is None or isinstance(value, (str, int, float, bool))):
        raise ValidationError(f"where.{key}: compare with a string, number, bool or None")
    check_json(value, f"where.{key}")


def _time_range(column: sa.Column[Any], condition: Any) -> list[ColumnElement[bool]]:
    if not isinstance(condition, Mapping) or not condition or not set(condition) <= set(_RANGE):
        raise ValidationError("where.created_at: expected {'$gte': datetime, '$lt': datetime, …}")
    bounds: list[ColumnElement[bool]] = []
    for operator, bound in condition.items():
        if not isinstance(bound, datetime):
            raise ValidationError(f"where.created_at.{operator}: expected an aware datetime")
        check_aware(bound, f"where.created_at.{operator}")
        bounds.append(getattr(column, _RANGE[operator])(bound))
    return bounds
