"""How memorm opens, sets up and closes driver connections, per dialect.

Per-dialect connection setup lives here and nowhere else:

* SQLite: WAL journal, `foreign_keys=ON`, a busy timeout, and transactions
  that really begin.  Writing units of work open with `BEGIN IMMEDIATE`, so
  concurrent writers queue for the write lock instead of failing with
  "database is locked" when a read lock cannot be upgraded.
* Postgres: asyncpg, pgvector's binary codec registered on each new
  connection, and the HNSW search settings set on it once
  (`memorm.search.vector_index.CONNECTION_SETTINGS`), so a search sends none of
  its own.

Every connection is opened and closed whole, whatever cancellation arrives
(`memorm.concurrency.protect`).  `memorm.backend` installs these on each
engine it makes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from typing import Any

import aiosqlite
import anyio
from sqlalchemy import event
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import await_only
from sqlalchemy.util.concurrency import in_greenlet

from memorm.concurrency import protect
from memorm.link import LINK
from memorm.search.vector_index import connection_setup
from memorm.translate import MANAGED, READ_ONLY
from memorm.types.search_words import register_tsvector

__all__ = ["SQLITE_BUSY_TIMEOUT_MS", "connect_postgres", "connect_sqlite", "set_up_engine"]

SQLITE_BUSY_TIMEOUT_MS = 30_000


def set_up_engine(engine: AsyncEngine) -> None:
    """Install memorm's connection events on a new engine (both dialects, then SQLite's own)."""
    _setup_common(engine)
    if engine.dialect.name == "sqlite":
        _setup_sqlite(engine)


def _setup_common(engine: AsyncEngine) -> None:
    @event.listens_for(engine.sync_engine, "handle_error")
    def _on_error(context: ExceptionContext) -> None:
        # SQLAlchemy drops a connection at once when a statement is interrupted
        # by cancellation, inside the cancelled task, where a second
        # cancellation can cut its graceful close short (and asyncpg then
        # abandons its CancelRequest mid-connect: "unexpected connection_lost()").
        # A unit of work's connection is dropped by the unit of work instead,
        # in its protected clean-up.
        connection = context.connection
        if (
            not isinstance(context.original_exception, Exception)
            and connection is not None
            and connection.get_execution_options().get(MANAGED, False)
        ):
            context.is_disconnect = False

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(connection: Any) -> None:
        # A unit of work's connection: its link begins the transaction (memorm.link),
        # for SQLAlchemy's statements as for its own.
        link = connection.info.get(LINK)
        if link is not None:
            if not link.begun:
                await_only(link.ready())
        elif engine.dialect.name == "sqlite" and not connection.get_execution_options().get(READ_ONLY, False):
            # Other connections (tools, migrations' helpers).  Readers run in
            # autocommit (no BEGIN): each statement sees the latest commit, and WAL
            # lets them run beside the writer.  Straight to aiosqlite: one thread
            # hop instead of SQLAlchemy's three.
            try:
                await_only(connection.connection.driver_connection.execute_fetchall("BEGIN IMMEDIATE"))
            except BaseException as error:
                # Cancelled, the BEGIN still runs in aiosqlite's thread, but SQLAlchemy
                # takes a failed begin event for no transaction, and would pool the
                # connection inside it, holding the write lock: dropped instead.
                if not isinstance(error, Exception):
                    connection.invalidate()
                raise


def _setup_sqlite(engine: AsyncEngine) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take BEGIN away from the driver so transactions begin when SQLAlchemy says.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")  # durable in WAL mode, and fast
        cursor.execute("PRAGMA foreign_keys = ON")
        # Deleted rows are overwritten with zeros, not left in free pages (docs/retention.md).
        cursor.execute("PRAGMA secure_delete = ON")
        cursor.close()

    @event.listens_for(engine.sync_engine, "handle_error")
    def _on_error(context: ExceptionContext) -> None:
        # A cancelled statement keeps running in aiosqlite's thread, and
        # SQLAlchemy's clean-up (closing its cursor) would queue behind it and
        # wait for its end, seconds later for a long one: stop it now.  Without
        # an await (this runs inside the cancelled scope) and without raising:
        # an error raised here would replace the cancellation.  A connection
        # SQLAlchemy drops instead is stopped as it closes (`_close_sqlite`).
        connection = context.connection
        if (
            not isinstance(context.original_exception, Exception)
            and not context.is_disconnect
            and connection is not None
            and not (connection.closed or connection.invalidated)
        ):
            _interrupt_sqlite(connection.connection.driver_connection)

    # Connections are closed whole, whatever cancellation arrives.  SQLAlchemy drops
    # one (invalidated, or cut short in its connect events) with a graceful close it
    # shields and, when that wait is cancelled (an anyio scope cancels every await
    # in it), aiosqlite's `stop()` beside it.  The two race: the loser forgets the
    # connection before it is closed (the file stays locked until the garbage
    # collector finds it) or waits for ever ("Task was destroyed but it is
    # pending!").  And a plain close cut short (`dispose()` in a cancelled scope)
    # is logged as an error and leaves the pool's other connections open.
    @event.listens_for(engine.sync_engine, "close")
    def _on_close(dbapi_connection: Any, _record: Any) -> None:
        # Ahead of SQLAlchemy's own close or terminate, which then find it closed.
        if in_greenlet():
            await_only(protect(_close_sqlite(dbapi_connection.driver_connection)))

    dialect = engine.sync_engine.dialect
    terminate = dialect.do_terminate

    def _terminate(dbapi_connection: Any) -> None:
        # The connect events' failure closes without a close event.  Outside the
        # greenlet bridge (the garbage collector's clean-up) nothing can be
        # awaited, and nothing else is closing the connection: aiosqlite's `stop()`.
        if in_greenlet():
            await_only(protect(_close_sqlite(dbapi_connection.driver_connection)))
        else:
            terminate(dbapi_connection)

    dialect.do_terminate = _terminate  # type: ignore[method-assign]


def _interrupt_sqlite(driver: Any) -> None:
    """Stop the statement an aiosqlite connection runs, from the event loop's thread, without awaiting."""
    connection = _sqlite3_of(driver)
    if connection is not None:
        # sqlite3_interrupt is safe from any thread; a closed connection refuses it.
        with contextlib.suppress(sqlite3.ProgrammingError):
            connection.interrupt()


async def _close_sqlite(driver: Any) -> None:
    """Roll back and close an aiosqlite connection, interrupting a statement that keeps it busy.

    A statement still running holds up what is queued behind it: it is
    interrupted only if the ROLLBACK or the close is not through at once.
    Not before: an interrupt that finds nothing running stays pending while
    an unfinished statement (one whose fetch a cancellation cut short)
    lives, and stops the ROLLBACK.
    """
    raw = _sqlite3_of(driver)
    if raw is not None and _in_transaction(raw):
        # Ended before the close: SQLite keeps a connection closed under an
        # unfinished statement open, with its transaction and the write lock,
        # until the garbage collector finalizes that statement.
        with anyio.move_on_after(_SQLITE_STATEMENT_GRACE) as waiting, contextlib.suppress(sqlite3.Error):
            await driver.rollback()
        if waiting.cancelled_caught:  # the ROLLBACK still runs, once the statement stops
            _interrupt_sqlite(driver)
    closing = asyncio.ensure_future(driver.close())
    with anyio.move_on_after(_SQLITE_STATEMENT_GRACE):
        await asyncio.shield(closing)
    if not closing.done() and raw is not None:
        with contextlib.suppress(sqlite3.ProgrammingError):  # closed meanwhile
            raw.interrupt()
    with contextlib.suppress(ValueError):  # aiosqlite's word for "closed already"
        await closing


_SQLITE_STATEMENT_GRACE = 0.05  # seconds a closing connection's statement may take before it is interrupted


class SQLiteConnection(aiosqlite.Connection):
    """aiosqlite's connection, keeping the sqlite3 connection its thread opens (`sqlite`).

    The event loop's thread needs it while the connection's thread is busy: to
    interrupt a running statement (`sqlite3_interrupt` is safe from any
    thread) and to see whether a transaction is open.  aiosqlite keeps it to
    itself, so memorm opens it (as `aiosqlite.connect` does) and keeps it too.
    """

    def __init__(self, database: str | os.PathLike[str], *, iter_chunk_size: int = 64, **kwargs: Any) -> None:
        self.sqlite: sqlite3.Connection | None = None  # set in the connection's thread, once open

        def connector() -> sqlite3.Connection:
            self.sqlite = sqlite3.connect(os.fspath(database), **kwargs)
            return self.sqlite

        super().__init__(connector, iter_chunk_size)


def _sqlite3_of(driver: Any) -> sqlite3.Connection | None:
    """The sqlite3 connection under `driver` (None if not opened, or not opened by memorm)."""
    return getattr(driver, "sqlite", None)


def _in_transaction(raw: sqlite3.Connection) -> bool:
    """Whether `raw` holds a transaction open (a closed connection holds none)."""
    try:
        return raw.in_transaction
    except sqlite3.ProgrammingError:
        return False


def connect_sqlite(*args: Any, **kwargs: Any) -> Any:
    """A new aiosqlite connection (to await), as SQLAlchemy's dialect makes one."""
    connection = SQLiteConnection(*args, **kwargs)
    # Its thread must not keep the interpreter alive at exit.  aiosqlite has no public
    # way to say so: SQLAlchemy's own dialect sets the same attribute.
    connection._thread.daemon = True
    return _open_sqlite(connection)


async def _open_sqlite(connection: SQLiteConnection) -> SQLiteConnection:
    """`connection` (an aiosqlite connection not yet awaited), opened whole whatever cancellation arrives.

    Cut short, aiosqlite drops the sqlite3 connection its thread is opening
    without closing it (the garbage collector does, and from Python 3.13
    warns "unclosed database").  Cancelled meanwhile, the caller gets the
    cancellation, and the connection made for nobody is closed.
    """
    try:
        return await protect(_awaited(connection))
    except BaseException:
        if connection.sqlite is not None:
            await protect(connection.close())
        elif connection._thread.is_alive():
            # The file could not be opened: aiosqlite told its thread to stop, and the thread
            # reports that to this loop.  Reported after the loop closed (a short-lived
            # `asyncio.run`), it would die on "Event loop is closed", with a traceback on stderr.
            await protect(anyio.to_thread.run_sync(connection._thread.join, _SQLITE_STATEMENT_GRACE))
        raise


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


async def connect_postgres(*args: Any, settings: bool = True, **kwargs: Any) -> Any:
    """A new asyncpg connection with memorm's codecs, made whole whatever cancellation arrives.

    `settings`: run memorm's `SET`s on it (not behind a transaction pooler,
    where they would stay on one server connection of the pooler's).

    Cut short, asyncpg abandons its handshake with a future nobody retrieves
    ("unexpected connection_lost()"), and a connection without its codecs
    would misread vectors.  Cancelled meanwhile, the caller gets the
    cancellation, and the connection made for nobody is closed (not left to
    the garbage collector: "unclosed connection").
    """
    made: list[Any] = []

    async def open_and_keep() -> Any:
        connection = await _open_postgres(*args, settings=settings, **kwargs)
        made.append(connection)
        return connection

    try:
        return await protect(open_and_keep())
    except BaseException:
        for connection in made:
            await protect(_close_postgres(connection))
        raise


async def _close_postgres(connection: Any) -> None:
    """Close an asyncpg connection politely, or at once if the server does not answer."""
    try:
        await connection.close(timeout=_CLOSE_TIMEOUT)
    except Exception:
        connection.terminate()


_CLOSE_TIMEOUT = 5.0  # seconds


async def _open_postgres(*args: Any, settings: bool, **kwargs: Any) -> Any:
    import asyncpg

    connection = await asyncpg.connect(*args, **kwargs)
    try:
        # The HNSW settings a search needs, once per connection (the caller's
        # server_settings win); in one message with nothing to parse back.
        setup = connection_setup(kwargs.get("server_settings") or {}) if settings else None
        if setup is not None:
            await connection.execute(setup)
        await _register_pgvector(connection)
        # Full-text search words travel as binary tsvectors (COPY needs a binary codec).
        await register_tsvector(connection)
    except BaseException:
        connection.terminate()
        raise
    return connection


async def _register_pgvector(connection: Any) -> None:
    """Register pgvector's binary codecs, if the extension is installed yet."""
    schema = await connection.fetchval(
        "SELECT n.nspname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace "
        "WHERE t.typname = 'vector' LIMIT 1"
    )
    if schema is not None:
        from pgvector.asyncpg import register_vector

        await register_vector(connection, schema=schema)
