"""A msgpack reader that builds nothing but plain values: what `memorm.graph_values` checks with.

LangGraph stores graph state as msgpack whose extension types name Python
callables; its reader imports and calls them.  This one returns every
extension as `Ext(code, data)`, its payload unread, so the caller decides
what to look at, and nothing a value names is ever imported.  It needs no
package (LangGraph's `ormsgpack` is an optional dependency of memorm).

Maps come back as lists of `(key, value)` pairs: msgpack keys may be
arrays, which a dict cannot hold.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

__all__ = ["Ext", "MalformedError", "read"]

MAX_DEPTH = 512
"""Nesting deeper than this is refused (LangGraph's own writer never comes close)."""


class Ext(NamedTuple):
    """An extension value: its type code and its payload, unread (a view of the bytes read)."""

    code: int
    data: memoryview


class MalformedError(ValueError):
    """The bytes are not one complete msgpack value (or nest deeper than `MAX_DEPTH`)."""


_FIXED = {0xC0: None, 0xC2: False, 0xC3: True}
# Marker -> (struct format, size) of the numbers that follow it.
_NUMBERS = {
    0xCA: (">f", 4),
    0xCB: (">d", 8),
    0xCC: (">B", 1),
    0xCD: (">H", 2),
    0xCE: (">I", 4),
    0xCF: (">Q", 8),
    0xD0: (">b", 1),
    0xD1: (">h", 2),
    0xD2: (">i", 4),
    0xD3: (">q", 8),
}
# Marker -> (kind, size of the length that follows): bytes, text, arrays, maps and extensions.
_SIZED = {
    0xC4: ("bin", 1),
    0xC5: ("bin", 2),
    0xC6: ("bin", 4),
    0xC7: ("ext", 1),
    0xC8: ("ext", 2),
    0xC9: ("ext", 4),
    0xD9: ("str", 1),
    0xDA: ("str", 2),
    0xDB: ("str", 4),
    0xDC: ("array", 2),
    0xDD: ("array", 4),
    0xDE: ("map", 2),
    0xDF: ("map", 4),
}
_FIXEXT = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}


class _Reader:
    __slots__ = ("at", "data")

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        # A view: slicing copies nothing, so an extension's payload costs nothing until read.
        self.data = memoryview(data).cast("B")
        self.at = 0

    def take(self, size: int) -> memoryview:
        end = self.at + size
        if end > len(self.data):
            raise MalformedError("msgpack value cut short")
        chunk = self.data[self.at : end]
        self.at = end
        return chunk

    def length(self, size: int) -> int:
        return int.from_bytes(self.take(size), "big")

    def value(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise MalformedError(f"msgpack nested deeper than {MAX_DEPTH}")
        marker = self.take(1)[0]
        if marker <= 0x7F:
            return marker
        if marker >= 0xE0:
            return marker - 0x100
        if 0x80 <= marker <= 0x8F:
            return self.pairs(marker & 0x0F, depth)
        if 0x90 <= marker <= 0x9F:
            return self.items(marker & 0x0F, depth)
        if 0xA0 <= marker <= 0xBF:
            return self.text(marker & 0x1F)
        if marker in _FIXED:
            return _FIXED[marker]
        if marker in _NUMBERS:
            form, size = _NUMBERS[marker]
            return struct.unpack(form, self.take(size))[0]
        if marker in _FIXEXT:
            code = self.take(1)[0]
            return Ext(code, self.take(_FIXEXT[marker]))
        if marker not in _SIZED:  # 0xC1, never used
            raise MalformedError(f"0x{marker:02x} is no msgpack marker")
        kind, size = _SIZED[marker]
        count = self.length(size)
        if kind == "bin":
            return bytes(self.take(count))
        if kind == "str":
            return self.text(count)
        if kind == "array":
            return self.items(count, depth)
        if kind == "map":
            return self.pairs(count, depth)
        code = self.take(1)[0]
        return Ext(code, self.take(count))

    # Loops, not comprehensions: one Python frame per level of nesting (3.11 gives a comprehension its own).
    def items(self, count: int, depth: int) -> list[Any]:
        if count > len(self.data) - self.at:  # each item takes a byte at least
            raise MalformedError("msgpack value cut short")
        found = []
        for _ in range(count):
            found.append(self.value(depth + 1))
        return found

    def pairs(self, count: int, depth: int) -> list[tuple[Any, Any]]:
        if 2 * count > len(self.data) - self.at:
            raise MalformedError("msgpack value cut short")
        found = []
        for _ in range(count):
            key = self.value(depth + 1)
            found.append((key, self.value(depth + 1)))
        return found

    def text(self, size: int) -> str:
        try:
            return str(self.take(size), "utf-8")
        except UnicodeDecodeError:
            raise MalformedError("msgpack text that is not UTF-8") from None


def read(data: bytes | bytearray | memoryview, depth: int = 0) -> Any:
    """The one msgpack value `data` holds, with maps as pair lists and extensions as `Ext`.

    `depth`: how deep `data` already is (an extension's payload is read
    apart from the value that holds it, and counts its nesting).

    Raises:
        MalformedError: `data` is cut short, has bytes after its value, uses
            an unknown marker, or nests deeper than `MAX_DEPTH`.
    """
    reader = _Reader(data)
    try:
        found = reader.value(depth)
    except RecursionError:
        raise MalformedError("msgpack nested too deeply") from None
    if reader.at != len(data):
        raise MalformedError("bytes after the msgpack value")
    return found
