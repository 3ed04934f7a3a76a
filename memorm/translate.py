"""Driver errors -> [`memorm.errors`][memorm.errors], in one place.

Repositories and the unit of work run every statement inside
`translating`; whatever the driver raises leaves as a `MemormError`
subclass with the original exception as `__cause__`.  The mapping keys on
SQLSTATE codes (Postgres) and on SQLite's stable message prefixes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Protocol

from sqlalchemy import exc as sa_exc

from memorm.conflicts import conflict_message, unique_key_of
from memorm.errors import (
    ConflictError,
    DatabaseError,
    MemormError,
    NotFoundError,
    PoolTimeoutError,
    SchemaError,
    ValidationError,
)
from memorm.unit_state import UnitState

__all__ = [
    "MANAGED",
    "READ_ONLY",
    "check_writable",
    "guarded",
    "lost",
    "transient",
    "translate",
    "translating",
]

UPGRADE_HINT = "run `memorm db upgrade` (or `await db.upgrade()`)"

# SQLSTATE class or code -> (error class, what to tell the caller)
_PG_CODES: dict[str, tuple[type[MemormError], str]] = {
    "23503": (NotFoundError, "a referenced row does not exist"),
    "23502": (ValidationError, "a required value is missing"),
    "23514": (ValidationError, "a value breaks a check constraint"),
    "22P05": (ValidationError, "text contains a character Postgres cannot store"),
    "22021": (ValidationError, "text is not valid in the database encoding"),
    "40001": (ConflictError, "a concurrent transaction conflicted; retry the unit of work"),
    "40P01": (ConflictError, "deadlock detected; retry the unit of work"),
    "42501": (DatabaseError, "the database role lacks a privilege (indexes and VACUUM need the owner)"),
    "57014": (DatabaseError, "the statement was cancelled (statement timeout)"),
    "55P03": (DatabaseError, "a lock could not be acquired in time (lock timeout)"),
    "42P01": (SchemaError, f"a table is missing: {UPGRADE_HINT}"),
    "42703": (SchemaError, f"a column is missing: {UPGRADE_HINT}"),
    "22": (ValidationError, "the database rejected a value"),
    "08": (DatabaseError, "the connection to the database failed"),
    "57": (DatabaseError, "the database server is shutting down or cancelled the statement"),
}

_SQLITE_MESSAGES: tuple[tuple[str, type[MemormError], str], ...] = (
    ("FOREIGN KEY constraint failed", NotFoundError, "a referenced row does not exist"),
    ("NOT NULL constraint failed", ValidationError, "a required value is missing"),
    ("CHECK constraint failed", ValidationError, "a value breaks a check constraint"),
    ("no such table", SchemaError, f"a table is missing: {UPGRADE_HINT}"),
    ("no such column", SchemaError, f"a column is missing: {UPGRADE_HINT}"),
    ("database is locked", DatabaseError, "the SQLite database stayed locked too long"),
)


# Citus relays some errors of its workers (on COPY into a distributed table) as
# XX000 with the worker's words: the real SQLSTATE, by those words.
_RELAYED: tuple[tuple[str, str], ...] = (
    ("duplicate key value violates unique constraint", "23505"),
    ("violates foreign key constraint", "23503"),
    ("violates check constraint", "23514"),
    ("violates not-null constraint", "23502"),
)


def _relayed(code: str | None, detail: str) -> str | None:
    """The SQLSTATE a relayed worker error really has (else `code`)."""
    if code == "XX000":
        for words, real in _RELAYED:
            if words in detail:
                return real
    return code


def _sqlstate(error: BaseException) -> str | None:
    for candidate in (error, error.__cause__):
        code = getattr(candidate, "sqlstate", None) or getattr(candidate, "pgcode", None)
        if isinstance(code, str):
            return code
    return None


def _is_driver_error(error: BaseException) -> bool:
    """Raised by sqlite3/aiosqlite or asyncpg themselves (the bulk path talks to them directly).

    Or by SQLAlchemy's adaptation of an async driver to the DBAPI (a check-out
    that opens a connection raises its errors unwrapped), whose cause is the driver's.
    """
    if isinstance(error, sqlite3.Error) or type(error).__module__.startswith("asyncpg"):
        return True
    cause = error.__cause__
    return type(error).__module__.startswith(_ADAPTERS) and cause is not None and _is_driver_error(cause)


_ADAPTERS = ("sqlalchemy.dialects", "sqlalchemy.connectors")  # where SQLAlchemy's adapted DBAPIs live


# asyncpg's words for a connection that is gone: closed before the call, or during it, or
# killed amid a statement's prepare (its protocol then refuses the bind that follows).
_LOST = (
    "connection is closed",
    "connection was closed in the middle of operation",
    "another operation (2) is in progress",
)


def lost(error: BaseException) -> bool:
    """Whether the driver error says the connection is gone (a restart, a killed backend, the network)."""
    for candidate in (error, error.__cause__):
        if candidate is None:
            continue
        if type(candidate).__name__ == "ConnectionDoesNotExistError":
            return True
        if type(candidate).__module__.startswith("asyncpg") and any(w in str(candidate) for w in _LOST):
            return True
    return False


def translate(error: BaseException) -> MemormError | None:
    """The memorm error for a driver/SQLAlchemy error, or None if it is not one."""
    if isinstance(error, MemormError):
        return error
    if isinstance(error, sa_exc.StatementError) and isinstance(error.orig, MemormError):
        return error.orig  # raised by one of our own bind processors
    if isinstance(error, sa_exc.TimeoutError):
        return PoolTimeoutError("no database connection became free within pool_timeout")
    if isinstance(error, sa_exc.DBAPIError):
        orig: BaseException | None = error.orig
        invalidated = error.connection_invalidated
        integrity = isinstance(error, sa_exc.IntegrityError)
    elif _is_driver_error(error):
        orig, invalidated = error, False
        integrity = isinstance(error, sqlite3.IntegrityError) or (_sqlstate(error) or "").startswith("23")
    elif isinstance(error, (ConnectionError, OSError)) and not isinstance(error, FileNotFoundError):
        return DatabaseError(f"cannot reach the database: {error}")
    else:
        return None
    detail = str(orig).strip().splitlines()[0] if orig is not None else ""
    if orig is not None and lost(orig):
        return DatabaseError(f"the connection to the database was lost: {detail}")
    code = _relayed(_sqlstate(orig), detail) if orig is not None else None
    if orig is not None and (code == "23505" or detail.startswith("UNIQUE constraint failed")):
        return ConflictError(conflict_message(unique_key_of(orig)))  # the same words on both engines
    if code is not None:
        found = _PG_CODES.get(code) or _PG_CODES.get(code[:2])
        if found is not None:
            cls, message = found
            translated = cls(f"{message}: {detail}")
            if code in _TRANSIENT:
                translated.__dict__[_TRANSIENT_MARK] = True
            return translated
    for prefix, cls, message in _SQLITE_MESSAGES:
        if prefix in detail:
            return cls(f"{message}: {detail}")
    if invalidated:
        return DatabaseError(f"the connection to the database was lost: {detail}")
    if integrity:
        return ValidationError(f"the database rejected the write: {detail}")
    return DatabaseError(f"database error: {detail}")


_TRANSIENT = frozenset({"40001", "40P01"})  # a serialization failure, a deadlock: run it again
_TRANSIENT_MARK = "_memorm_transient"


def transient(error: BaseException) -> bool:
    """Whether `error` is a conflict that running the same unit of work again may not meet.

    Postgres aborts one of two transactions that deadlock (or that a
    serializable snapshot cannot order): the other went through, and the
    aborted one, run again, usually does too.
    """
    return bool(error.__dict__.get(_TRANSIENT_MARK, False))


# Execution options of a connection: it reads only (no BEGIN; SQLite's readers run beside
# the writer), and a unit of work owns its clean-up.
READ_ONLY = "memorm_read_only"
MANAGED = "memorm_managed"


class Stateful(Protocol):
    """What holds a unit of work's state: its `Link`."""

    @property
    def state(self) -> UnitState: ...


def check_writable(link: Stateful) -> None:
    """Refuse a write in a read-only unit of work (it would commit at once, unasked)."""
    if link.state.read_only:
        raise ValidationError("this unit of work is read-only: open db.unit_of_work() to write")


def guarded(link: Stateful, *, recoverable: bool = False) -> Guard:
    """`translating`, and the unit of work's record of what went wrong.

    A database error fails the unit of work, on both engines alike: Postgres
    aborts the transaction anyway, and on SQLite carrying on could commit half
    a write (a sequence number taken, its message not stored).  Later
    statements then raise, and the unit of work can only roll back.  Writes
    that may fail on purpose run in a SAVEPOINT and pass `recoverable=True`.

    A statement interrupted by cancellation (of any kind) fails the unit of
    work too, even if the caller swallows the cancellation: whether the
    statement took effect is unknown.  The unit of work then drops the
    connection instead of returning it to the pool.
    """
    return Guard(link.state, recoverable)


class Guard:
    """What `guarded` returns: a plain async context manager (no generator per statement)."""

    __slots__ = ("recoverable", "state")

    def __init__(self, state: UnitState, recoverable: bool) -> None:
        self.state = state
        self.recoverable = recoverable

    async def __aenter__(self) -> None:
        earlier = self.state.failed
        if earlier is not None:
            raise DatabaseError(f"this unit of work already failed ({earlier}); it can only roll back")

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if error is None:
            return
        if isinstance(error, Exception):
            translated = translate(error)
            if isinstance(translated, MemormError) and not self.recoverable and translated is not error:
                self.state.failed = translated  # from the database, not our checks
            if translated is not None and translated is not error:
                raise translated from error
            if isinstance(error, MemormError) and not self.recoverable and error.__cause__ is not None:
                self.state.failed = error
            return
        # Cancelled (or interrupted) amid a statement.
        self.state.interrupted = True
        if self.state.failed is None:
            self.state.failed = DatabaseError("a statement was interrupted by cancellation")


@contextmanager
def translating() -> Iterator[None]:
    """Re-raise driver errors raised inside the block as `memorm.errors`."""
    try:
        yield
    except Exception as error:
        translated = translate(error)
        if translated is None or translated is error:
            raise
        raise translated from error
