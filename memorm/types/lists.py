"""Lists bound as one parameter, and the condition that a column is one of them.

One parameter keeps one statement (compiled and prepared once) for lists of
every length, within no engine's limit on parameters: an array on Postgres
(`column = ANY(values)`), a JSON array on SQLite (`column IN (SELECT value
FROM json_each(values))`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.visitors import InternalTraversal, _TraverseInternalsType
from sqlalchemy.types import TypeEngine

__all__ = ["TextList", "UUIDList", "in_list"]


class UUIDList(sa.types.TypeDecorator[Sequence[uuid.UUID]]):
    """Any number of `uuid.UUID`s bound as one parameter, for `in_list`.

    A `uuid[]` on Postgres; on SQLite a JSON array of the 32 hex characters
    `UUIDType` stores.  One parameter keeps one statement (compiled and
    prepared once) for lists of every length, within no engine's limit on
    parameters.
    """

    impl = sa.Text
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(postgresql.ARRAY(sa.Uuid(as_uuid=True)))
        return dialect.type_descriptor(sa.Text())

    def process_bind_param(self, value: Sequence[uuid.UUID] | None, dialect: Dialect) -> Any:
        if value is None or dialect.name == "postgresql":
            return value
        return '["' + '","'.join(item.hex for item in value) + '"]' if value else "[]"


class TextList(sa.types.TypeDecorator[Sequence[str]]):
    """Any number of strings bound as one parameter, for `in_list`: a `text[]` on Postgres, a JSON
    array on SQLite (as `UUIDList`)."""

    impl = sa.Text
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(postgresql.ARRAY(sa.Text()))
        return dialect.type_descriptor(sa.Text())

    def process_bind_param(self, value: Sequence[str] | None, dialect: Dialect) -> Any:
        if value is None or dialect.name == "postgresql":
            return value
        return json.dumps(list(value))


class in_list(sa.sql.expression.ColumnElement[bool]):
    """`column` is one of `values` (a `UUIDList` or `TextList` parameter, of the column's type).

    `column = ANY(values)` on Postgres, `column IN (SELECT value FROM
    json_each(values))` on SQLite: both probe an index on `column` once per
    value.
    """

    __visit_name__ = "in_list"
    inherit_cache = True
    _is_implicitly_boolean = True  # a condition as it is: SQLite must not get `… = 1`, which no index serves
    # The parts SQLAlchemy's cache keys and copies go through.
    _traverse_internals: _TraverseInternalsType = [  # noqa: RUF012 (typed so by SQLAlchemy)
        ("column", InternalTraversal.dp_clauseelement),
        ("values", InternalTraversal.dp_clauseelement),
    ]
    type = sa.Boolean()

    def __init__(self, column: sa.ColumnElement[Any], values: sa.BindParameter[Any]) -> None:
        self.column = column
        self.values = values

    @property
    def _from_objects(self) -> list[Any]:
        return list(self.column._from_objects)


@compiles(in_list, "postgresql")
def _in_list_postgres(element: in_list, compiler: Any, **kw: Any) -> str:
    return f"{compiler.process(element.column, **kw)} = ANY({compiler.process(element.values, **kw)})"


@compiles(in_list, "sqlite")
def _in_list_sqlite(element: in_list, compiler: Any, **kw: Any) -> str:
    column, values = compiler.process(element.column, **kw), compiler.process(element.values, **kw)
    return f"{column} IN (SELECT value FROM json_each({values}))"  # noqa: S608 (compiled SQL, no values)
