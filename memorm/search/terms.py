"""User text -> full-text query terms that no engine can misread.

Search strings come from users and from LLMs, so they are never handed to an
FTS parser as written: they go through the same normaliser as the indexed
text (`memorm.search.normalize.words`), which keeps only letters, digits
and combining marks, so quotes, `AND`/`OR`/`NEAR`, `*`, `:`, `&`,
`|`, `!`, parentheses and SQL all become plain words or vanish.  Each
engine then gets the words in a form it cannot parse as syntax: double-quoted
FTS5 strings on SQLite, quoted lexemes of `tsquery` input on Postgres
(never `to_tsquery`, whose parser depends on the database's locale).  All
words must match.
"""

from __future__ import annotations

from memorm.search.normalize import words

__all__ = ["MAX_TERMS", "fts5_query", "query_terms", "tsquery"]

MAX_TERMS = 32


def query_terms(query: str) -> list[str]:
    """The distinct words of `query`, in order, at most `MAX_TERMS`."""
    return list(dict.fromkeys(words(query)))[:MAX_TERMS]


def fts5_query(terms: list[str]) -> str:
    """An FTS5 MATCH expression requiring every term: each one a quoted string."""
    return " ".join('"' + term.replace('"', '""') + '"' for term in terms)


def tsquery(terms: list[str]) -> str:
    """`tsquery` input requiring every term: each one a quoted lexeme, taken verbatim."""
    return " & ".join("'" + term.replace("\\", "\\\\").replace("'", "''") + "'" for term in terms)
