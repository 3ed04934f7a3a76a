"""Text -> the words full-text search matches: one normaliser for documents and queries.

Both engines index and query exactly the words this module finds, so they
match the same words whatever their tokenizers or the database's locale:

1. Unicode NFKC, full case folding (`str.casefold`), NFKC again: "ΟΔΟΣ",
   "οδος" and "οδοσ" are one word, as are NFC and NFD "café", "Straße" and
   "STRASSE", "ﬁ" and "fi".  Accents stay significant ("café" is not "cafe"),
   and "İ" folds to "i" with a combining dot, so "İstanbul" is not "istanbul".
2. A word is a maximal run of letters, digits and combining marks (Unicode
   categories L*, N*, M*); everything else separates words (`_` too).
3. A word longer than `MAX_WORD_CHARS` keeps its first
   `MAX_WORD_CHARS` characters, in documents and queries alike, so a
   very long word is still found (as is any word sharing those characters).
4. A text's distinct words are indexed up to `MAX_INDEX_BYTES` (the
   size of one Postgres `tsvector`), in the order they first appear.

The character classes come from Python's own Unicode database, so words are
the same on every engine for a given Python; a Python with a newer Unicode
version may see words in text using characters assigned since.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterable
from functools import cache
from typing import Any

__all__ = ["MAX_INDEX_BYTES", "MAX_WORD_CHARS", "index_words", "words"]

MAX_WORD_CHARS = 255  # 1,020 UTF-8 bytes at most: well under Postgres' 2,046-byte lexemes
MAX_INDEX_BYTES = (1 << 20) - 1  # a tsvector's lexemes share one 1 MiB string space
# No character normalises to more than 33 UTF-8 bytes (U+FDFA), so the words of
# text this short always fit in MAX_INDEX_BYTES, with a margin of two.
_ALWAYS_FITS = MAX_INDEX_BYTES // 66

# ASCII: lower case, and everything but letters and digits becomes a space.
_ASCII_FOLD = bytes(
    c + 32 if 65 <= c <= 90 else c if 48 <= c <= 57 or 97 <= c <= 122 else 32 for c in range(256)
)


def _runs(flags: list[bool], start: int) -> list[tuple[int, int]]:
    """The (first, last) code points of each run of True in `flags`."""
    found: list[tuple[int, int]] = []
    first = None
    for offset, flag in enumerate(flags):
        if flag and first is None:
            first = offset
        elif not flag and first is not None:
            found.append((start + first, start + offset - 1))
            first = None
    if first is not None:
        found.append((start + first, start + len(flags) - 1))
    return found


def _class(ranges: list[tuple[int, int]]) -> str:
    return "".join(re.escape(chr(a)) + ("" if a == b else "-" + re.escape(chr(b))) for a, b in ranges)


@cache
def _word_pattern() -> re.Pattern[str]:
    """Runs of L*, N* and M* characters (built on first use: ~50 ms of Unicode tables).

    Python's `re` has no Unicode categories beyond `\\w`, which leaves out
    combining marks.  The BMP's word characters form one class that `re`
    checks with a bitmap; astral ones (historic scripts, supplementary marks;
    emoji are not word characters) are in a class `re` searches range by
    range, so a guard keeps every BMP character away from it.
    """
    category = unicodedata.category
    bmp = [chr(c) if not 0xD800 <= c < 0xE000 else " " for c in range(0x10000)]
    words = _runs([category(c)[0] in "LNM" for c in bmp], 0)
    astral_marks = [
        run
        for start, stop in ((0x10000, 0x20000), (0xE0000, 0xE1000))  # the only astral planes with marks
        for run in _runs([category(chr(c))[0] == "M" for c in range(start, stop)], start)
    ]
    astral = f"(?=[\\U00010000-\\U0010ffff])(?:[^\\W_]|[{_class(astral_marks)}])"
    return re.compile(f"(?:[{_class(words)}]+|{astral})+")


def _fold(text: str) -> str:
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())


def words(text: str) -> list[str]:
    """The words of `text` in order, repeats included (see the module docstring).

    Example:
        ```pycon
        >>> words("ΟΔΟΣ, Straße & snake_case ﬁle")
        ['οδοσ', 'strasse', 'snake', 'case', 'file']
        ```
    """
    if text.isascii():
        found = text.encode("ascii").translate(_ASCII_FOLD).decode("ascii").split()
    else:
        found = _word_pattern().findall(_fold(text))
    if len(text) > MAX_WORD_CHARS and max(map(len, found), default=0) > MAX_WORD_CHARS:
        return [word[:MAX_WORD_CHARS] for word in found]
    return found


def index_words(text: str) -> list[bytes]:
    """The distinct words of `text`, UTF-8, in byte order: what the index stores.

    Byte order is the order of Postgres' `tsvector` lexemes (and of code
    points).  A `tsvector` holds at most `MAX_INDEX_BYTES` of
    lexemes, so from text whose distinct words take more (megabytes of
    different words) only the words seen first, up to that size, are kept,
    on both engines alike.
    """
    # Order of first appearance matters only where the size limit may cut.
    unique: Callable[[Iterable[Any]], Iterable[Any]] = dict.fromkeys if len(text) > _ALWAYS_FITS else set
    if text.isascii():
        # bytes.translate and split are C loops: ~4x faster than a regex on chat text.
        found = text.encode("ascii").translate(_ASCII_FOLD).split()
        if len(text) > MAX_WORD_CHARS and max(map(len, found), default=0) > MAX_WORD_CHARS:
            found = [word[:MAX_WORD_CHARS] for word in found]
        distinct = list(unique(found))
    else:
        distinct = [word.encode() for word in unique(words(text))]
    if len(text) > _ALWAYS_FITS:
        used = 0
        for count, word in enumerate(distinct):
            used += len(word)
            if used > MAX_INDEX_BYTES:
                distinct = distinct[:count]
                break
    distinct.sort()
    return distinct
