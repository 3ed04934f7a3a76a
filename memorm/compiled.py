"""Statements compiled once per dialect, for the driver paths (`memorm.driver`).

A hot statement is a module-level constant: its SQL, its parameters' names,
bind processors and defaults, and its result columns' decoders are worked out
once per dialect (`compiled`, cached), and each call only runs them
(`decode`: a window's repeated session and agent ids and timestamps are
decoded once).  Values go through each column type's own bind and result
processors, so rows are exactly what SQLAlchemy would have sent and returned.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

from memorm.types.datetime import UTCDateTime
from memorm.types.uuid import UUIDType

__all__ = ["Decoder", "Processor", "compiled", "decode"]

Processor = Callable[[Any], Any] | None
_UNSET = object()


@lru_cache(maxsize=256)
def compiled(
    dialect: Dialect, statement: Any
) -> tuple[str, tuple[str, ...], tuple[Processor, ...], dict[str, Any], tuple[Decoder | None, ...]]:
    compiled = statement.compile(dialect=dialect)
    names = tuple(compiled.positiontup or ())
    binds = tuple(compiled.binds[name].type._cached_bind_processor(dialect) for name in names)
    defaults = {name: compiled.binds[name].value for name in names}
    results = tuple(_decoder(column.type, dialect) for column in statement.exported_columns)
    return str(compiled), names, binds, defaults, results


class Decoder(NamedTuple):
    """How a result column's driver values become Python values."""

    process: Callable[[Any], Any]
    # The value is immutable (a UUID, a datetime): rows repeating the previous
    # row's driver value (a window's session and agent ids, the timestamps of a
    # batch) share its Python value instead of decoding it again.
    shared: bool


def _decoder(column_type: Any, dialect: Dialect) -> Decoder | None:
    if dialect.name == "postgresql" and isinstance(column_type, sa.Float):
        # SQLAlchemy picks asyncpg's float processor by the column's type OID, known
        # only per result; asyncpg gives a float8 or float4 (distances) as a float.
        return None
    process = column_type._cached_result_processor(dialect, None)
    if process is None:
        return None
    return Decoder(process, isinstance(column_type, (UUIDType, UTCDateTime)))


def decode(rows: Sequence[Sequence[Any]], decoders: Sequence[Decoder | None]) -> list[tuple[Any, ...]]:
    """Driver rows -> Python rows, by each column's decoder (built once per statement).

    Only the columns that have a decoder are visited; a shared (immutable)
    value repeating the previous row's is decoded once.
    """
    active = [(index, decoder.process, decoder.shared) for index, decoder in enumerate(decoders) if decoder]
    last_in: list[Any] = [_UNSET] * len(decoders)
    last_out: list[Any] = [None] * len(decoders)
    decoded = []
    for row in rows:
        values = list(row)
        for index, process, shared in active:
            value = values[index]
            if value is None:
                continue
            if not shared:
                values[index] = process(value)
            elif value == last_in[index]:
                values[index] = last_out[index]
            else:
                values[index] = last_out[index] = process(value)
                last_in[index] = value
        decoded.append(tuple(values))
    return decoded
