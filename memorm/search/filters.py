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

import re
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.sql import ColumnElement

from memorm.errors import ValidationError
from memorm.search.json_match import (
    COMPARISONS,
    MAX_NODES,
    Kind,
    Parts,
    check_condition,
    check_value,
    condition_sql,
    equality,
    matching,
)
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
"""A `where=` filter on archival passages: a dict whose conditions must all hold.

Each key is a `meta` key (1 to 64 letters, digits, `_` or `-`) or `"created_at"`:

- `{key: value}`, the value a string, number, bool or None: passages whose
  `meta[key]` is that value, of that JSON type (`1` is not `"1"`, `True` is
  not `1`; None is a JSON null, not a missing key);
- `{key: {"$in": [value, …]}}`, 1 to 1,000 such values: `meta[key]` is one of them;
- `{"created_at": {"$gte": start, "$lt": end}}`, any of `$gt`, `$gte`, `$lt`
  and `$lte` with timezone-aware datetimes: `created_at` is in that range.

An empty dict keeps every passage (`delete_where` refuses it).  Anything
else (another operator, a nested object or list as a value, a naive
datetime) raises `ValidationError` before any statement runs.  Used by
`search`, `hybrid_search` and `delete_where` of `uow.passages`.

Example:
    ```python
    where = {"topic": "pets", "lang": {"$in": ["en", "fr"]}, "created_at": {"$gte": since}}
    hits = await uow.passages.search(agent.id, vector, where=where)
    ```
"""

_KEY = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_RANGE = {"$gt": "__gt__", "$gte": "__ge__", "$lt": "__lt__", "$lte": "__le__"}
_MAX_IN = 1000


def _equals(dialect: str, meta: sa.Column[Any], key: str, value: Any) -> ColumnElement[bool]:
    """`meta[key]` is the scalar `value`: by containment on Postgres (which a GIN index serves)."""
    if dialect == "postgresql":  # for a scalar, containment is equality
        contains: ColumnElement[bool] = meta.op("@>")(sa.bindparam(None, {key: value}, type_=JSONType()))
        return contains
    parts = Parts("")
    return condition_sql(meta, equality(dialect, (key,), value, parts), _bound(parts.values))


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
        check_value(value, f"{field}.{key}")
    return where


def json_key_conditions(
    link: Link, column: sa.Column[Any], where: Filter, field: str
) -> list[ColumnElement[bool]]:
    """Conditions that `column` (a JSON object) holds each key of `where` with its value, whole.

    Any JSON value compares, equal as LangGraph's in-memory saver compares
    metadata: scalars by value and JSON type, as `where=` filters do; an
    object equals an object of the same keys (in any order) with equal
    values, a list a list of the same length with equal items
    (`memorm.search.json_match.equality`).  Keys are as meta keys are.
    """
    dialect = link.dialect.name
    conditions = []
    for index, (key, value) in enumerate(check_json_keys(where, field).items()):
        parts = Parts(f"{field}_{index}_")
        kind = equality(dialect, (key,), value, parts)
        conditions.append(condition_sql(column, kind, _bound(parts.values)))
    return conditions


def _bound(values: Mapping[str, Any]) -> Callable[..., Any]:
    """A `Bind` giving each part its value (a statement built for these values)."""
    return lambda name, type_=None: sa.bindparam(None, values[name], type_=type_)


def check_value_filter(where: object, field: str) -> Filter:
    """`where`, checked for `json_value_conditions` (without building SQL): a dict of keys to conditions."""
    if not isinstance(where, Mapping):
        raise ValidationError(f"{field}: expected a dict, got {type(where).__name__}")
    size = 0
    for key, condition in where.items():
        if not isinstance(key, str) or not _KEY.match(key):
            raise ValidationError(f"{field}: key {key!r} must be 1-64 letters, digits, '_' or '-'")
        size += check_condition(condition, f"{field}.{key}")
    if size > MAX_NODES:
        raise ValidationError(f"{field}: more than {MAX_NODES:,} values to compare")
    return where


def json_value_conditions(
    link: Link, column: sa.Column[Any], where: object, field: str
) -> list[ColumnElement[bool]]:
    """Conditions on the keys of `column` (a JSON object): values, or comparisons by operator.

    As LangGraph's in-memory store filters (`memorm.search.json_match`):
    `{"color": "red"}` and `{"color": {"$eq": "red"}}` hold where the key
    holds that JSON value; an object holds for an object whose keys it
    names match (others may be there), a list for a list of the same
    length whose items match in order, operators at any depth; `$eq`
    compares a whole value, `$ne` holds where it is not that value (a
    missing key included); `$gt`, `$gte`, `$lt` and `$lte` compare a
    number with numbers and a string with strings (byte order on SQLite,
    Postgres' collation there), and never hold for a value of another JSON
    type.  Several operators on a key must all hold, as must several keys.
    """
    dialect = link.dialect.name
    shape, values = value_filter(dialect, where, field)
    return shaped_conditions(column, shape, values)


ValueShape = tuple[Kind, ...]
"""What a `json_value_conditions` filter's SQL looks like, its values left out: a `Kind` per key."""


def value_filter(dialect: str, where: object, field: str) -> tuple[ValueShape, dict[str, Any]]:
    """`where` (checked) as its shape and its values, by parameter name (`filter_0_0`, …).

    Filters of one shape make the same SQL (`shaped_conditions`), whatever
    their keys and values: a statement built once per shape serves them all.
    """
    shape: list[Kind] = []
    values: dict[str, Any] = {}
    for index, (key, condition) in enumerate(check_value_filter(where, field).items()):
        parts = Parts(f"filter_{index}_")
        shape.append(matching(dialect, (key,), condition, parts))
        values.update(parts.values)
    return tuple(shape), values


def shaped_conditions(
    column: sa.Column[Any], shape: ValueShape, values: Mapping[str, Any] | None = None
) -> list[ColumnElement[bool]]:
    """The conditions of a `value_filter` shape on `column`.

    With `values`, they hold them; without, their parameters are named as
    `value_filter` names the values (for a statement built once per shape).
    """
    if values is None:
        bind: Callable[..., Any] = lambda name, type_=None: sa.bindparam(name, type_=type_)  # noqa: E731
    else:
        bind = _bound(values)
    return [condition_sql(column, kind, bind) for kind in shape]


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
