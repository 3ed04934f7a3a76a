"""JSON documents: ``jsonb`` on Postgres, JSON text on SQLite."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeEngine

__all__ = ["JSONType", "dumps", "loads"]


# A JSON string (skipped whole), or a number written with a positive exponent.
_STRING_OR_BIG_NUMBER = re.compile(r'"(?:[^"\\]|\\.)*"|(-?[0-9]+(?:\.[0-9]+)?e\+[0-9]+)')


def _with_point(match: re.Match[str]) -> str:
    number = match.group(1)
    return match.group(0) if number is None else format(Decimal(number), "f") + ".0"


def dumps(value: Any) -> str:
    """Serialise strictly: NaN and infinities are not JSON, so they are refused.

    Floats from 1e16 up, which Python writes as ``4.5e+16``, are written out
    with a decimal point (``45000000000000000.0``): jsonb keeps a numeric's
    scale but not its exponent, and would give ``4.5e+16`` back as the
    integer ``45000000000000000``.
    """
    text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    return _STRING_OR_BIG_NUMBER.sub(_with_point, text) if "e+" in text else text


def _int_or_float(text: str) -> int | float:
    """An integer as stored, or, past 64 bits, the float it was.

    memorm refuses integers outside 64 bits on the way in, so one that comes
    back out was a float written before :func:`dumps` kept the decimal point
    (or by another program): give it back as one.
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
