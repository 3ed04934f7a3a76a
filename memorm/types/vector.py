"""Embedding vectors: pgvector's `vector` on Postgres, packed float32 on SQLite."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from pgvector import HalfVector, Vector
from pgvector.sqlalchemy import HALFVEC, VECTOR
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeEngine

__all__ = ["VectorType", "pack_float16", "pack_float32", "unpack_float16", "unpack_float32"]

_SWAP = sys.byteorder != "little"  # stored bytes are little-endian everywhere


def pack_float32(values: Sequence[float]) -> bytes:
    """Little-endian float32 bytes of `values`."""
    packed = array("f", values)
    if _SWAP:
        packed.byteswap()
    return packed.tobytes()


def unpack_float32(data: bytes) -> list[float]:
    """The floats of `pack_float32`'s bytes."""
    unpacked = array("f")
    unpacked.frombytes(data)
    if _SWAP:
        unpacked.byteswap()
    return unpacked.tolist()


def pack_float16(values: Sequence[float]) -> bytes:
    """Little-endian float16 bytes of `values` (numpy rounds to nearest)."""
    import numpy as np

    return np.asarray(values, dtype="<f2").tobytes()


def unpack_float16(data: bytes) -> list[float]:
    """The floats of `pack_float16`'s bytes."""
    import numpy as np

    result: list[float] = np.frombuffer(data, dtype="<f2").astype(np.float64).tolist()
    return result


def _to_codec(value: Any) -> Any:
    """A value for pgvector's binary codec, which encodes lists, arrays and its own objects.

    The codec makes its `Vector` as it sends the value, as it does for a
    raw asyncpg caller: a bulk insert holds no second copy of every vector.
    """
    return list(value) if type(value) is tuple else value


def _to_vector(value: Any) -> Any:
    """pgvector's `Vector` of a value: one element of an array parameter (`VectorType(array_item=True)`)."""
    if value is None or isinstance(value, Vector):
        return value
    return Vector(list(value) if type(value) is tuple else value)


def _to_half_vector(value: Any) -> Any:
    if value is None or isinstance(value, HalfVector):
        return value
    return HalfVector(list(value) if type(value) is tuple else value)


class _BinaryHalfVector(HALFVEC):
    """pgvector's `halfvec`, through the binary asyncpg codec (see `_BinaryVector`)."""

    cache_ok = True

    def __init__(self, array_item: bool = False) -> None:
        super().__init__()
        self.array_item = array_item

    def bind_processor(self, dialect: Dialect) -> Callable[[Any], Any]:
        return _to_half_vector if self.array_item else _to_codec


class _BinaryVector(VECTOR):
    """pgvector's column type, sending values through the binary asyncpg codec.

    [`memorm.Database`][memorm.db.Database] registers pgvector's codec on every connection, so
    values travel in pgvector's binary form instead of being formatted as text.
    The comparator (`cosine_distance`, `l2_distance`, `max_inner_product`)
    is pgvector's own.
    """

    cache_ok = True

    def __init__(self, array_item: bool = False) -> None:
        super().__init__()
        self.array_item = array_item

    def bind_processor(self, dialect: Dialect) -> Callable[[Any], Any]:
        return _to_vector if self.array_item else _to_codec


class VectorType(sa.types.TypeDecorator[list[float]]):
    """A float vector of any dimension; each row records its own dimension.

    Postgres stores a dimensionless `vector` (`halfvec` with `half=True`)
    so embeddings of several models (384-d beside 1536-d) share one column;
    per-model HNSW indexes are partial expression indexes with a cast.  SQLite
    stores little-endian float32 (float16) bytes, which numpy reads without
    copying.

    Args:
        half: store 16-bit floats: half the space, about 3 significant digits.
        array_item: the type of a Postgres array parameter's elements
            (`postgresql.ARRAY(VectorType(array_item=True))`): each is sent as
            pgvector's object, since asyncpg reads a list inside a list as
            another dimension of the array.
    """

    impl = sa.LargeBinary
    cache_ok = True

    def __init__(self, half: bool = False, array_item: bool = False) -> None:
        super().__init__()
        self.half = half
        self.array_item = array_item

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            binary = _BinaryHalfVector if self.half else _BinaryVector
            return dialect.type_descriptor(binary(self.array_item))
        return dialect.type_descriptor(sa.LargeBinary())

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if value is None or dialect.name == "postgresql":
            return value
        return pack_float16(value) if self.half else pack_float32(value)

    def result_processor(self, dialect: Dialect, coltype: Any) -> Callable[[Any], Any] | None:
        if dialect.name == "postgresql":
            return _postgres_list  # one call per value, not pgvector's and then this type's
        return super().result_processor(dialect, coltype)

    def process_result_value(self, value: Any, dialect: Dialect) -> list[float] | None:
        if value is None:
            return None
        if isinstance(value, (bytes, memoryview)):
            data = bytes(value)
            return unpack_float16(data) if self.half else unpack_float32(data)
        if isinstance(value, (Vector, HalfVector)):
            return value.to_list()
        return list(value)


def _postgres_list(value: Any) -> list[float] | None:
    """A Postgres vector as a list: a `Vector`/`HalfVector` from the binary codec, or text."""
    if value is None:
        return None
    if isinstance(value, (Vector, HalfVector)):
        return value.to_list()
    return [float(item) for item in str(value)[1:-1].split(",") if item]  # '[1,2,3]'; '[]' is empty
