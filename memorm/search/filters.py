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
from collections.abc import Mapping
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
    "check_json_keys",
    "check_value_filter",
    "compile_filter",
    "filter_conditions",
    "json_key_conditions",
    "json_value_conditions",
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


def _equals(dialect: str, meta: sa.Column[Any], key: str, value: Any) -> ColumnElement[bool]:
    if dialect == "postgresql":
        return meta.op("@>")(sa.bindparam(None, {key: value}, type_=JSONType()))
    path = f'$."{key}"'
    kind = sa.func.json_type(meta, path).in_(_sqlite_json_type(value))
    if value is None or isinstance(value, bool):
        return kind
    return sa.and_(kind, sa.func.json_extract(meta, path) == value)


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
    conditions: list[ColumnElement[bool]] = []
    for key, value in check_json_keys(where, field).items():
        if not isinstance(value, (Mapping, list, tuple)) or dialect == "postgresql":
            conditions.append(_equals(dialect, column, key, value))
            continue
        path = f'$."{key}"'
        compact = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        kind = "object" if isinstance(value, Mapping) else "array"
        conditions.append(
            sa.and_(sa.func.json_type(column, path) == kind, sa.func.json_extract(column, path) == compact)
        )
    return conditions


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
    conditions: list[ColumnElement[bool]] = []
    for key, condition in check_value_filter(where, field).items():
        if not _has_operators(condition):
            conditions += json_key_conditions(link, column, {key: condition}, field)
            continue
        for name, operand in condition.items():
            equal = sa.and_(*json_key_conditions(link, column, {key: operand}, f"{field}.{key}.{name}"))
            if name == "$eq":
                conditions.append(equal)
            elif name == "$ne":
                conditions.append(sa.not_(sa.func.coalesce(equal, sa.false(), type_=sa.Boolean)))
            else:
                conditions.append(_ordered(dialect, column, key, _ORDER[name], operand))
    return conditions


def _ordered(
    dialect: str, column: sa.Column[Any], key: str, operator: str, operand: Any
) -> ColumnElement[bool]:
    """`column[key] <operator> operand` for a number or a string (checked), of the same JSON type only."""
    number = not isinstance(operand, str)
    if dialect == "postgresql":
        found = column.op("->")(sa.bindparam(None, key, type_=sa.Text))
        kind = sa.func.jsonb_typeof(found) == ("number" if number else "string")
        bound = sa.bindparam(None, operand, type_=JSONType())
        return sa.and_(kind, found.op(operator, is_comparison=True)(bound))
    path = f'$."{key}"'
    types = ("integer", "real") if number else ("text",)
    value = sa.func.json_extract(column, path)
    return sa.and_(
        sa.func.json_type(column, path).in_(types),
        value.op(operator, is_comparison=True)(sa.bindparam(None, operand)),
    )


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
