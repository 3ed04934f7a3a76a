"""The exceptions memorm raises.

Every error that crosses memorm's public API is a [`MemormError`][memorm.errors.MemormError]; errors
from the database driver are translated into these in one place
(`memorm.translate`), with the original kept as `__cause__`.
"""

from __future__ import annotations

__all__ = [
    "ConflictError",
    "DatabaseError",
    "MemormError",
    "NotFoundError",
    "SchemaError",
    "ValidationError",
]


class MemormError(Exception):
    """Base class of every memorm error."""


class NotFoundError(MemormError, LookupError):
    """An id or name names no row (or a row of another agent)."""


class ConflictError(MemormError):
    """A write lost a race: a stale `expected_version` or a unique key taken."""


class ValidationError(MemormError, ValueError):
    """Bad input, rejected before anything was written."""


class SchemaError(MemormError):
    """The database schema is not at the revision this memorm expects.

    The message names the command that fixes it.
    """


class DatabaseError(MemormError):
    """The database failed in a way that is not the caller's input.

    Lost connections, timeouts, lock waits and server shutdowns land here; the
    unit of work that saw it has been rolled back.
    """
