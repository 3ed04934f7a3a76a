"""User text -> full-text query terms that no engine can misread.

Search strings come from users and from LLMs, so they are never handed to an
FTS parser: quotes, ``AND``/``OR``/``NEAR``, ``*``, ``:``, parentheses and SQL
all become plain words (or vanish).  Each engine then gets the words in a form
it cannot parse as syntax: double-quoted FTS5 strings on SQLite, a bound
``plainto_tsquery`` argument on Postgres.  All words must match.
"""

from __future__ import annotations

import re

__all__ = ["MAX_TERMS", "query_terms"]

MAX_TERMS = 32
# Letters and digits, as FTS5's unicode61 and Postgres' [:alnum:] see words.
_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def query_terms(query: str) -> list[str]:
    """The distinct lower-cased words of ``query``, in order, at most :data:`MAX_TERMS`."""
    terms: list[str] = []
    for word in _WORD.findall(query.lower()):
        if word not in terms:
            terms.append(word)
            if len(terms) == MAX_TERMS:
                break
    return terms
