"""Timezone-aware UTC datetimes on both engines."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeEngine

from memorm.errors import ValidationError
from memorm.validation import MAX_TIME, MIN_TIME

__all__ = ["UTCDateTime", "utcnow"]


def utcnow() -> datetime:
    """The current time as an aware UTC datetime."""
    return datetime.now(timezone.utc)


class UTCDateTime(sa.types.TypeDecorator[datetime]):
    """An aware UTC datetime: `timestamptz` on Postgres, fixed-width text on SQLite.

    Naive datetimes are rejected (`ValidationError`) instead of being guessed
    at; aware ones in any zone are stored as UTC and read back as UTC.  On SQLite
    the text is `YYYY-MM-DD HH:MM:SS.ffffff` with microseconds always present,
    so string order is time order and range queries compare correctly.
    """

    impl = sa.DateTime
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(sa.String(26))
        return dialect.type_descriptor(sa.DateTime(timezone=True))

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if not isinstance(value, datetime):
            raise ValidationError(f"expected a datetime, got {type(value).__name__}")
        if value.tzinfo is not timezone.utc and (value.tzinfo is None or value.utcoffset() is None):
            raise ValidationError(f"naive datetime {value!r}: give it a timezone (UTC)")
        # The repositories check the range before any statement; this catches raw ORM
        # writes and imports too.  In range, the conversion to UTC cannot overflow, and
        # Postgres never gets datetime.min/max (which asyncpg sends as -infinity/infinity).
        if not MIN_TIME <= value <= MAX_TIME:
            raise ValidationError(f"{value.isoformat()} is outside the range memorm stores")
        if value.tzinfo is not timezone.utc:
            value = value.astimezone(timezone.utc)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")
        return value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):
            return datetime.fromisoformat(value).replace(tzinfo=timezone.utc)
        result: datetime = value
        return result.astimezone(timezone.utc)
