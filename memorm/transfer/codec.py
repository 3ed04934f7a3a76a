"""Rows <-> JSON-safe dicts: uuids as strings, datetimes in ISO 8601, embeddings as lists, bytes in base64.

The same encoding serves the JSON Lines files and the checksums: a row's
canonical form (`canonical`) is its JSON-safe values with JSON keys
sorted, so two databases holding equal rows produce equal bytes whatever
their engines.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.schema import ScalarElementColumnDefault

from memorm.errors import ValidationError
from memorm.models import fields
from memorm.tenancy import DEFAULT_TENANT
from memorm.transfer.rows import Row, column_names
from memorm.types import UTCDateTime, UUIDType

__all__ = ["canonical", "from_json_row", "to_json_row"]

Convert = Callable[[Any], Any] | None


def _encode_datetime(value: datetime) -> str:
    return value.isoformat()


def _encode_bytes(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _decode_bytes(value: object) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f"expected base64 text, got {type(value).__name__}")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as error:
        raise ValueError(f"not base64: {error}") from None


def _decode_uuid(value: object) -> uuid.UUID:
    if not isinstance(value, str):  # uuid.UUID(5) raises AttributeError
        raise TypeError(f"expected a UUID string, got {type(value).__name__}")
    return uuid.UUID(value)


def _decode_datetime(value: str) -> datetime:
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError(f"datetime {value!r} has no timezone")
    return parsed


@cache
def _encoders(table: sa.Table) -> tuple[Convert, ...]:
    encoders: list[Convert] = []
    for column in fields(table):
        if isinstance(column.type, UUIDType):
            encoders.append(str)
        elif isinstance(column.type, UTCDateTime):
            encoders.append(_encode_datetime)
        elif isinstance(column.type, sa.LargeBinary):  # graph state's opaque values
            encoders.append(_encode_bytes)
        else:  # text, numbers, JSON documents and vectors (lists of floats) are JSON already
            encoders.append(None)
    return tuple(encoders)


@cache
def _decoders(table: sa.Table) -> tuple[Convert, ...]:
    decoders: list[Convert] = []
    for column in fields(table):
        if isinstance(column.type, UUIDType):
            decoders.append(_decode_uuid)
        elif isinstance(column.type, UTCDateTime):
            decoders.append(_decode_datetime)
        elif isinstance(column.type, sa.LargeBinary):
            decoders.append(_decode_bytes)
        else:
            decoders.append(None)
    return tuple(decoders)


def to_json_row(table: sa.Table, row: Row) -> dict[str, Any]:
    """`row` of `table` as a dict of JSON-safe values, keyed by column."""
    return {
        name: value if encode is None or value is None else encode(value)
        for name, encode, value in zip(column_names(table), _encoders(table), row, strict=True)
    }


def _added_later(column: sa.Column[Any]) -> tuple[bool, Any]:
    """Whether an export from an older revision may lack `column`, and the value it then takes."""
    if column.name == "tenant":
        # Added by 0008, whose rows before were all the default tenant's.  The
        # column has no client-side default on purpose (the server's is the unit
        # of work's tenant), so it is named here.
        return True, DEFAULT_TENANT
    default = column.default
    if isinstance(default, ScalarElementColumnDefault):
        return True, default.arg
    return column.nullable is True and default is None, None


def from_json_row(table: sa.Table, data: Mapping[str, Any], *, older: bool = False) -> Row:
    """The row of `table` that `to_json_row` encoded as `data`.

    `older`: the row comes from an earlier schema revision, so columns added
    since (nullable, or with a plain default) may be absent and take that value;
    a row without `tenant` (from before 0008) is the default tenant's.

    Raises:
        ValidationError: a column is missing or extra, or a value cannot be decoded.
    """
    names = column_names(table)
    if older and any(name not in data for name in names):
        filled = dict(data)
        for column in fields(table):
            absent, value = _added_later(column)
            if absent and column.name not in filled:
                filled[column.name] = value
        data = filled
    if len(data) != len(names) or any(name not in data for name in names):
        missing = sorted(set(names) - set(data))
        extra = sorted(set(data) - set(names))
        raise ValidationError(f"{table.name} row: missing columns {missing}, unknown columns {extra}")
    values = []
    for name, decode in zip(names, _decoders(table), strict=True):
        value = data[name]
        if decode is not None and value is not None:
            try:
                value = decode(value)
            except (TypeError, ValueError) as error:
                raise ValidationError(f"{table.name}.{name}: {error}") from None
        values.append(value)
    return tuple(values)


def canonical(table: sa.Table, row: Row) -> bytes:
    """The bytes a checksum takes for `row`: its JSON-safe values in column order, UTF-8.

    A list, not a dict: the column order is the schema's on both engines.  Keys
    inside JSON documents are sorted, since jsonb does not keep their order.
    """
    values = [
        value if encode is None or value is None else encode(value)
        for encode, value in zip(_encoders(table), row, strict=True)
    ]
    text = json.dumps(values, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.encode("utf-8")
