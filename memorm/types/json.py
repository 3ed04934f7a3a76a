"""JSON documents: `jsonb` on Postgres, JSON text on SQLite."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.types import TypeEngine

__all__ = ["JSONType", "dumps", "json_pairs", "loads", "loads_jsonb"]


# A JSON string (skipped whole), or a number written with a positive exponent.
_STRING_OR_BIG_NUMBER = re.compile(r'"(?:[^"\\]|\\.)*"|(-?[0-9]+(?:\.[0-9]+)?e\+[0-9]+)')


def _with_point(match: re.Match[str]) -> str:
    number = match.group(1)
    return match.group(0) if number is None else format(Decimal(number), "f") + ".0"


# A JSON string (skipped whole), or a negative zero as Python writes it ("-0.0", not the start of "-0.05").
_STRING_OR_NEGATIVE_ZERO = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|(-0\.0)(?![0-9])')
# Any spelling of a negative zero ("-0.00", "-0e5"…), or something in a string that looks like one.
_NEGATIVE_ZERO = re.compile(r"-0(?:\.0+)?[eE]|-0\.0+(?![0-9])")


def _unsigned(match: re.Match[str]) -> str:
    return match.group(0) if match.group(1) is None else "0.0"


# json.dumps builds an encoder per call when given options; one built once is ~2x faster on small documents.
_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))


def dumps(value: Any) -> str:
    """Serialise strictly: NaN and infinities are not JSON, so they are refused.

    Floats from 1e16 up, which Python writes as `4.5e+16`, are written out
    with a decimal point (`45000000000000000.0`): jsonb keeps a numeric's
    scale but not its exponent, and would give `4.5e+16` back as the
    integer `45000000000000000`.

    `-0.0` is written as `0.0`: jsonb's numerics have no negative zero,
    so memorm stores on both engines what both can hold.
    """
    text = _ENCODER.encode(value)
    # One-character tests first: they run at memchr speed, a two-character
    # substring search can take 9 µs on a 6 kB document.
    if "+" in text and "e+" in text:
        text = _STRING_OR_BIG_NUMBER.sub(_with_point, text)
    if "-" in text and _NEGATIVE_ZERO.search(text):
        text = _STRING_OR_NEGATIVE_ZERO.sub(_unsigned, text)
    return text


def _int_or_float(text: str) -> int | float:
    """An integer as stored, or, past 64 bits, the float it was.

    memorm refuses integers outside 64 bits on the way in, so one that comes
    back out was a float written before `dumps` kept the decimal point
    (or by another program): give it back as one.
    """
    value = int(text)
    return float(text) if not -(2**63) <= value < 2**63 else value


def _float(text: str) -> float:
    return float(text) or 0.0  # -0.0 is falsy: it becomes 0.0


_DECODER = json.JSONDecoder(parse_int=_int_or_float)
_FAST_DECODER = json.JSONDecoder()
_scan = _FAST_DECODER.scan_once  # type: ignore[attr-defined]  # the C scanner json.loads runs
_LONG_DIGITS = re.compile(
    r"[0-9]{19}"
)  # 2**63 has 19 digits: shorter integers fit in 64 bits  # json.loads(parse_int=) builds one per call
_UNSIGNED_DECODER = json.JSONDecoder(parse_int=_int_or_float, parse_float=_float)


def loads(text: str | bytes) -> Any:
    """Parse JSON as stored by memorm (see `_int_or_float`).

    A negative zero (SQLite text written before `dumps` dropped the
    sign, or by another program) reads as `0.0`, as it does from jsonb.
    """
    document = text.decode() if isinstance(text, bytes) else text
    # Cheapest test first (see dumps); the unsigned decoder costs a Python call per float.
    if "-" in document and _NEGATIVE_ZERO.search(document):
        return _UNSIGNED_DECODER.decode(document)
    return _without_negative_zero(document)


def loads_jsonb(text: str | bytes) -> Any:
    """`loads` for Postgres' `jsonb`, which has no negative zero (`-0.0` is stored as `0.0`).

    One scan of the text fewer than `loads`: Postgres' JSON has spaces after
    its colons and commas, and often a `-` in a string (ids, dates), where
    `loads` would search for a negative zero.
    """
    return _without_negative_zero(text.decode() if isinstance(text, bytes) else text)


def _without_negative_zero(document: str) -> Any:
    """Parse a JSON document known to hold no negative zero."""
    if document == "{}":  # most rows' meta
        return {}
    if _LONG_DIGITS.search(document) is None:
        # No integer can be past 64 bits: the C scanner parses every number itself,
        # where `_int_or_float` would cost a Python call per integer.  Called
        # directly: memorm stores JSON without surrounding whitespace.
        try:
            value, end = _scan(document, 0)
        except StopIteration:
            end = -1
        if end == len(document):
            return value
        return _FAST_DECODER.decode(document)  # whitespace, or an error to report
    return _DECODER.decode(document)


class JSONType(sa.types.TypeDecorator[Any]):
    """A JSON value (usually a dict or list).

    `jsonb` on Postgres (indexable, comparable with `@>`), SQLAlchemy's
    `JSON` on SQLite.  Inputs are checked by `memorm.validation` before
    they get here; the engine's serializer (`dumps`) refuses NaN as a
    last line of defence.
    """

    impl = sa.JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(postgresql.JSONB(none_as_null=True))
        return dialect.type_descriptor(sa.JSON(none_as_null=True))


class json_pairs(sa.sql.functions.GenericFunction[Any]):
    """A JSON object column's members as rows of `(key, value)`, values as text.

    `jsonb_each_text` on Postgres, `json_each` on SQLite; use it table-valued:
    `json_pairs(column).table_valued("key", "value")`.
    """

    inherit_cache = True


@compiles(json_pairs, "postgresql")
def _json_pairs_postgres(element: json_pairs, compiler: Any, **kw: Any) -> str:
    return f"jsonb_each_text({compiler.process(element.clauses, **kw)})"


@compiles(json_pairs, "sqlite")
def _json_pairs_sqlite(element: json_pairs, compiler: Any, **kw: Any) -> str:
    return f"json_each({compiler.process(element.clauses, **kw)})"
