"""How memorm stores values, done by hand: what every raw baseline writes.

SQLite: uuids as 32 hex characters, ``YYYY-MM-DD HH:MM:SS.ffffff`` UTC text,
the full-text search words as text; Postgres: native types, the search words
as a binary ``tsvector``.  Rows go to memorm's default tenant, as memorm's do.
"""

from __future__ import annotations

from datetime import datetime, timezone

from memorm.search.normalize import index_words
from memorm.types.search_words import encode_tsvector

__all__ = ["TENANT", "UTC", "postgres_words", "sqlite_time", "sqlite_words"]

TENANT = "default"  # memorm writes and filters the unit of work's tenant; so does raw
UTC = timezone.utc


def sqlite_time(value: datetime) -> str:
    """A UTC ``datetime`` as memorm stores it on SQLite: ``YYYY-MM-DD HH:MM:SS.ffffff`` text."""
    return value.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


def sqlite_words(text: str) -> str:
    """The ``search_words`` memorm stores for ``text`` on SQLite: what a raw baseline writes too."""
    return b" ".join(index_words(text)).decode()


def postgres_words(text: str) -> bytes:
    """The ``search_words`` memorm stores for ``text`` on Postgres: a binary ``tsvector``."""
    return encode_tsvector(index_words(text))
