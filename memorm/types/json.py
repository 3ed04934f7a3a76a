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


def _int_or_float(text: str) -> int | float:
    """jsonb stores numbers as numerics and prints ``1e20`` as ``100000000000000000000``.

    memorm refuses integers outside 64 bits on the way in, so one that comes
    back out was a float: give it back as one.  (Integral floats from 1e16 to
    2**63 still read back as ints on Postgres: jsonb keeps no trace of them.)
    """
    value = int(text)
    return float(text) if not -(2**63) <= value < 2**63 else value


_DECODER = json.JSONDecoder(parse_int=_int_or_float)  # json.loads(parse_int=) builds one per call


def loads(text: str | bytes) -> Any:
    """Parse JSON as stored by memorm (see :func:`_int_or_float`)."""
    return _DECODER.decode(text.decode() if isinstance(text, bytes) else text)


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
