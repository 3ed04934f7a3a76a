"""What a ``Database`` holds open, seen from outside memorm.

For the tests about event loops and threads: a loop's pool must close with
the loop, and a failed unit of work must leave no transaction open.  On
Postgres the server's ``pg_stat_activity`` shows a tagged database's
backends; on SQLite each aiosqlite connection is a thread of its own, which
ends when the connection closes.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import anyio
import asyncpg
from conftest import CITUS, Store, asyncpg_dsn

from memorm import Database

SETTLE_SECONDS = 10.0  # how long a closed connection may take to leave the server or end its thread


def aiosqlite_threads() -> int:
    """The open aiosqlite connections of this process (each runs in a thread of its own)."""
    return sum("_connection_worker_thread" in thread.name for thread in threading.enumerate())


async def postgres_backends(application: str, *, busy: bool = False) -> int:
    """The server's backends tagged ``application``; ``busy``: only those in a transaction or a statement."""
    sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1"
    if busy:
        sql += " AND state <> 'idle'"
    connection = await asyncpg.connect(asyncpg_dsn())
    try:
        return int(await connection.fetchval(sql, application))
    finally:
        await connection.close()


async def tagged_database(store: Store) -> tuple[str, Database]:
    """A new ``Database`` on the store, with the schema; on Postgres its backends carry a unique name."""
    application = f"memorm-loops-{uuid.uuid4().hex[:8]}"
    options: dict[str, Any] = {}
    if store.engine == "postgres":
        settings = {**store.options["connect_args"]["server_settings"], "application_name": application}
        options = {"connect_args": {"server_settings": settings}}
    db = store.database(**options)
    await db.create_all()
    if CITUS and store.engine == "postgres":  # MEMORM_TEST_CITUS=1: distributed, as the db fixture's
        await db.distribute()
    return application, db


async def open_connections(store: Store, application: str, *, settled: int | None = None) -> int:
    """The connections open on ``store`` for a database from :func:`tagged_database`.

    On SQLite that counts every aiosqlite connection of the process: compare
    with a count taken before.  With ``settled``, wait (a few seconds at most)
    for the count to reach it: a closed backend leaves the server, and an
    aiosqlite thread ends, a moment after the client closed it.
    """
    with anyio.move_on_after(SETTLE_SECONDS):
        while True:
            postgres = store.engine == "postgres"
            count = await postgres_backends(application) if postgres else aiosqlite_threads()
            if settled is None or count == settled:
                return count
            await anyio.sleep(0.01)
    return count


def count_sqlite_hops(monkeypatch: Any) -> list[Any]:
    """The calls made in aiosqlite connections' threads from now on (each a hop there and back)."""
    import aiosqlite

    hops: list[Any] = []
    run = aiosqlite.Connection._execute

    async def counted(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(fn)
        return await run(self, fn, *args, **kwargs)

    monkeypatch.setattr(aiosqlite.Connection, "_execute", counted)
    return hops
