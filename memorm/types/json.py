"""JSON documents: ``jsonb`` on Postgres, JSON text on SQLite."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeEngine

__all__ = ["JSONType", "dumps", "loads"]


def dumps(value: Any) -> str:
    """Serialise strictly: NaN and infinities are not JSON, so they are refused."""
    return json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))


loads = json.loads


class JSONType(sa.types.TypeDecorator[Any]):
    """A JSON value (usually a dict or list).

    ``jsonb`` on Postgres (indexable, comparable with ``@>``), SQLAlchemy's
    ``JSON`` on SQLite.  Inputs are checked by :mod:`memorm.validation` before
    they get here; the engine's serializer (:func:`dumps`) refuses NaN as a
    last line of defence.
    """

    impl = sa.JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(postgresql.JSONB(none_as_null=True))
        return dialect.type_descriptor(sa.JSON(none_as_null=True))
