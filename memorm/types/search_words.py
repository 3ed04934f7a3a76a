"""The words full-text search indexes: `tsvector` on Postgres, text on SQLite.

A `SearchWords` column is derived data.  Bind it the *text* to index
(a message's content, a passage's text); the column stores that text's
distinct normalised words (`memorm.search.normalize.index_words`),
built by memorm in Python, so neither the database's locale nor its
text-search parser ever sees the text.  Reading the column gives the words,
sorted and joined by spaces, on both engines.

On Postgres the words travel as a binary `tsvector` (lexemes without
positions) through the asyncpg codec `register_tsvector` installs on
each connection, which is also what lets `COPY … (FORMAT binary)` write the
column.
"""

from __future__ import annotations

import struct
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeEngine

from memorm.search.normalize import index_words

__all__ = ["SearchWords", "decode_tsvector", "encode_tsvector", "register_tsvector"]

_COUNT = struct.Struct("!i")
_NO_POSITIONS = b"\x00\x00\x00"  # a lexeme's NUL terminator, then 0 positions (int16)


def encode_tsvector(lexemes: list[bytes]) -> bytes:
    """Postgres' binary `tsvector` of distinct UTF-8 `lexemes` in byte order, without positions."""
    if not lexemes:
        return _COUNT.pack(0)
    return _COUNT.pack(len(lexemes)) + _NO_POSITIONS.join(lexemes) + _NO_POSITIONS


def decode_tsvector(data: bytes) -> str:
    """A binary `tsvector`'s lexemes, joined by spaces (positions and weights are skipped)."""
    (count,) = _COUNT.unpack_from(data)
    at, found = _COUNT.size, []
    for _ in range(count):
        end = data.index(0, at)
        found.append(data[at:end].decode())
        (positions,) = struct.unpack_from("!H", data, end + 1)
        at = end + 3 + 2 * positions
    return " ".join(found)


def _encode(value: Any) -> bytes:
    if not isinstance(value, bytes):  # text would be indexed one way here and another on SQLite
        raise TypeError("bind tsvector values through memorm.types.SearchWords (the text to index)")
    return value


async def register_tsvector(connection: Any) -> None:
    """Install the binary `tsvector` codec on an asyncpg connection."""
    await connection.set_type_codec(
        "tsvector", schema="pg_catalog", encoder=_encode, decoder=decode_tsvector, format="binary"
    )


class SearchWords(sa.types.TypeDecorator[str]):
    """The normalised words of a text, for full-text search (see the module docstring).

    Bound values are the text to index; results are its words joined by spaces.
    """

    impl = sa.Text
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(postgresql.TSVECTOR())
        return dialect.type_descriptor(sa.Text())

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if value is None:
            return None
        found = index_words(value)
        if dialect.name == "postgresql":
            return encode_tsvector(found)
        return b" ".join(found).decode()

    def process_result_value(self, value: Any, dialect: Dialect) -> str | None:
        return value if value is None or isinstance(value, str) else str(value)
