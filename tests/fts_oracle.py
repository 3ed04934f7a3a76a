"""What a full-text search must find, worked out slowly and independently of memorm's normaliser.

The rules of docs/recall.md ("What a word is"), one character at a time with
``unicodedata``: NFKC, case folding, NFKC; words are runs of letters, digits
and combining marks; each keeps at most 255 characters.
"""

from __future__ import annotations

import unicodedata

MAX_WORD = 255
MAX_TERMS = 32


def oracle_words(text: str) -> list[str]:
    """The words of ``text`` in order, repeats included."""
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    found: list[str] = []
    current: list[str] = []
    for char in folded + " ":
        if unicodedata.category(char)[0] in "LNM":
            current.append(char)
        elif current:
            found.append("".join(current)[:MAX_WORD])
            current = []
    return found


def oracle_terms(query: str) -> list[str]:
    """The words a search for ``query`` requires: its first 32 distinct ones."""
    return list(dict.fromkeys(oracle_words(query)))[:MAX_TERMS]


def oracle_matches(text: str, query: str) -> bool:
    """Whether a search for ``query`` finds ``text``: it has every term (and there is one)."""
    terms = oracle_terms(query)
    return bool(terms) and set(terms) <= set(oracle_words(text))
