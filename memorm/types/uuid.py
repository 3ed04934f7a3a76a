"""UUIDs: native `uuid` on Postgres, 32 hex characters on SQLite (lists of them: `memorm.types.lists`)."""

from __future__ import annotations

import uuid
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

__all__ = ["UUIDType"]


class UUIDType(sa.types.TypeDecorator[uuid.UUID]):
    """A `uuid.UUID` column.

    Ids are checked and coerced at the API boundary
    (`memorm.validation.as_uuid`), so by the time a value is bound it is a
    `UUID`; strings are still accepted here for hand-written queries.
    """

    impl = sa.Uuid(as_uuid=True)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> uuid.UUID | None:
        if value is None or isinstance(value, uuid.UUID):
            return value
        return uuid.UUID(str(value))
