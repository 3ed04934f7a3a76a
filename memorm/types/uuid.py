"""UUIDs: native `uuid` on Postgres, 32 hex characters on SQLite; lists of them as one parameter."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.visitors import InternalTraversal, _TraverseInternalsType
from sqlalchemy.types import TypeEngine

__all__ = ["UUIDList", "UUIDType", "in_uuids"]


class UUIDType(sa.types.TypeDecorator[uuid.UUID]):
    """A `uuid.UUID` column.

    Ids are checked and coerced at the API boundary
    (`memorm.validation.as_uuid`), so by the time a value is bound it is a
    `UUID`; strings are still accepted here for hand-written queries.
    """

    impl = sa.Uuid(as_uuid=True)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> uuid.UUID | None:
        if value is None or isinstance(value, uuid.UUID):
            return value
        return uuid.UUID(str(value))


class UUIDList(sa.types.TypeDecorator[Sequence[uuid.UUID]]):
    """Any number of `uuid.UUID`s bound as one parameter, for `in_uuids`.

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


class in_uuids(sa.sql.expression.ColumnElement[bool]):
    """`column` (a `UUIDType`) is one of `values` (a `UUIDList` parameter).

    `column = ANY(values)` on Postgres, `column IN (SELECT value FROM
    json_each(values))` on SQLite: both probe an index on `column` once per
    value.
    """

    __visit_name__ = "in_uuids"
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


@compiles(in_uuids, "postgresql")
def _in_uuids_postgres(element: in_uuids, compiler: Any, **kw: Any) -> str:
    return f"{compiler.process(element.column, **kw)} = ANY({compiler.process(element.values, **kw)})"


@compiles(in_uuids, "sqlite")
def _in_uuids_sqlite(element: in_uuids, compiler: Any, **kw: Any) -> str:
    column, values = compiler.process(element.column, **kw), compiler.process(element.values, **kw)
    return f"{column} IN (SELECT value FROM json_each({values}))"  # noqa: S608 (compiled SQL, no values)
