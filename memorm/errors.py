"""The exceptions memorm raises.

Every error that crosses memorm's public API is a [`MemormError`][memorm.errors.MemormError]; errors
from the database driver are translated into these in one place
(`memorm.translate`), with the original kept as `__cause__`.
"""

from __future__ import annotations

__all__ = [
    "BlockedLoopError",
    "ConflictError",
    "DatabaseError",
    "MemormError",
    "NotFoundError",
    "PoolTimeoutError",
    "SchemaError",
    "UnsafeValueError",
    "ValidationError",
]


class MemormError(Exception):
    """Base class of every memorm error."""


class NotFoundError(MemormError, LookupError):
    """An id or name names no row (or a row of another agent)."""


class ConflictError(MemormError):
    """A write lost a race: a stale `expected_version` or a unique key taken."""


class BlockedLoopError(MemormError):
    """A sync call would wait for the event loop it was called on, which it blocks: it would hang.

    A sync method (LangChain's `add_messages`, LangGraph's with
    `allow_blocking=True`) called on the thread of a running event loop
    blocks that loop until it returns.  When a task of that loop holds what
    the call needs (a writing unit of work open on the same database, whose
    rows, or SQLite's write lock, the call would wait for), that task can
    never let go: the call raises this at once, before it writes anything.
    The message names the async method to await instead.
    """


class ValidationError(MemormError, ValueError):
    """Bad input, rejected before anything was written."""


class UnsafeValueError(ValidationError):
    """Stored graph state names a callable memorm will not run.

    LangGraph's serializer keeps an object as the name of its type (any
    importable callable) and the arguments to call it with.  memorm builds
    only the types LangGraph's own graphs store and those you allow
    (`MemormSaver(..., allowed_types=[...])`, `--allow-type` on the
    import commands); a value naming anything else is refused, the name
    neither imported nor called, when a saver loads it (nothing of that
    checkpoint is returned) and when an import reads it (nothing is written).
    The message says where the value is and what it names.
    """


class SchemaError(MemormError):
    """The database schema is not at the revision this memorm expects.

    The message names the command that fixes it.
    """


class DatabaseError(MemormError):
    """The database failed in a way that is not the caller's input.

    Lost connections, timeouts, lock waits and server shutdowns land here; the
    unit of work that saw it has been rolled back.
    """


class PoolTimeoutError(DatabaseError):
    """No connection became free within the pool's `pool_timeout` (seconds).

    Units of work wait for a connection in arrival order; one that waited
    this long gives up, so an overloaded server can shed load (answer 503)
    instead of queueing requests without end.  Nothing was sent.
    """
