"""Where a benchmark's data lives: a fresh SQLite file or Postgres schema, and connections to it.

A benchmark module opens its own :func:`store` per engine (a fresh SQLite
file, or a fresh Postgres schema dropped afterwards); on it, memorm's
``Database`` (:meth:`Store.database`) and the raw driver's connections set up
as memorm sets up its own (:meth:`Store.raw_sqlite`, :meth:`Store.raw_postgres`).
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy.engine import make_url

from memorm import Database
from memorm.testing import capture_statements
from memorm.types.search_words import register_tsvector

__all__ = [
    "ENGINES",
    "POSTGRES_URL",
    "Store",
    "asyncpg_dsn",
    "like_memorm",
    "postgres_unavailable",
    "statements_sent",
    "store",
]

ENGINES = ("sqlite", "postgres")
POSTGRES_URL = os.environ.get("MEMORM_BENCH_POSTGRES_URL", "postgresql+asyncpg://root@127.0.0.1:5432/test")


def asyncpg_dsn(url: str = POSTGRES_URL) -> str:
    """The plain libpq-style DSN asyncpg takes for a SQLAlchemy URL."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def postgres_unavailable() -> str | None:
    """Why the benchmark Postgres cannot be used (None when it can).

    Installs pgvector in ``public`` once: every benchmark schema shares it, and
    dropping a schema must never drop the extension.
    """
    try:
        connection = await asyncpg.connect(asyncpg_dsn(), timeout=5)
    except Exception as error:
        return f"Postgres at {make_url(POSTGRES_URL)!r} unreachable: {error}"
    try:
        await connection.execute("CREATE EXTENSION IF NOT EXISTS vector SCHEMA public")
        await connection.execute("CREATE EXTENSION IF NOT EXISTS btree_gin SCHEMA public")
    except Exception as error:
        return f"Postgres at {make_url(POSTGRES_URL)!r} has no usable pgvector: {error}"
    finally:
        await connection.close()
    return None


@dataclass
class Store:
    """Where one benchmark's data lives: a SQLite file or a Postgres schema."""

    engine: str
    url: str
    options: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None  # SQLite file
    schema: str | None = None  # Postgres schema

    def database(self, **engine_options: Any) -> Database:
        """A memorm ``Database`` on this store."""
        return Database(self.url, **{**self.options, **engine_options})

    async def raw_sqlite(self) -> Any:
        """An aiosqlite connection set up the way memorm sets up its own.

        Same pragmas (WAL, ``synchronous=NORMAL``, foreign keys, busy timeout) and
        autocommit mode, so transactions begin only on an explicit ``BEGIN``.
        """
        import aiosqlite

        from memorm.connections import SQLITE_BUSY_TIMEOUT_MS

        assert self.path is not None
        connection = await aiosqlite.connect(self.path, isolation_level=None)
        await connection.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        await connection.execute("PRAGMA journal_mode = WAL")
        await connection.execute("PRAGMA synchronous = NORMAL")
        await connection.execute("PRAGMA foreign_keys = ON")
        return connection

    async def raw_postgres(self, *, vectors: bool = False) -> asyncpg.Connection:
        """A plain asyncpg connection with this store's schema on its search path.

        It has memorm's binary ``tsvector`` codec: raw baselines write the search
        words as memorm does (COPY has no text path for them); ``vectors=True``
        registers pgvector's binary codec too.
        """
        connection = await asyncpg.connect(asyncpg_dsn(), server_settings=self._raw_settings())
        await register_tsvector(connection)
        if vectors:
            from pgvector.asyncpg import register_vector

            await register_vector(connection)
        return connection

    async def raw_postgres_pool(self, size: int) -> asyncpg.Pool:
        """An asyncpg pool of ``size`` connections, each set up as :meth:`raw_postgres` sets up one.

        A released connection is not reset (asyncpg's default sends ``RESET ALL``
        and more on every release): memorm's pool skips that round trip too,
        its unit of work always ending its own transaction.
        """

        async def keep(connection: asyncpg.Connection) -> None:
            pass

        return await asyncpg.create_pool(
            asyncpg_dsn(),
            min_size=size,
            max_size=size,
            server_settings=self._raw_settings(),
            init=register_tsvector,
            reset=keep,
        )

    def _raw_settings(self) -> dict[str, str]:
        assert self.schema is not None
        # memorm.tenant: rows a raw INSERT writes without a tenant land in memorm's default
        # tenant (the column's server default reads the setting), as memorm's own do.
        return {"search_path": f"{self.schema},public", "memorm.tenant": "default"}


async def like_memorm(connection: Any) -> None:
    """Give another library's aiosqlite connection memorm's journal settings (WAL, `synchronous=NORMAL`).

    SQLite's defaults (a rollback journal, `synchronous=FULL`) sync the file
    on every commit; memorm's settings do not.  A baseline compared with
    memorm gets the same, or the comparison times fsync.
    """
    await connection.execute("PRAGMA journal_mode = WAL")
    await connection.execute("PRAGMA synchronous = NORMAL")


@asynccontextmanager
async def store(engine: str) -> AsyncIterator[Store]:
    """A fresh, empty store: a SQLite file in a temp dir, or a new Postgres schema."""
    if engine == "sqlite":
        with tempfile.TemporaryDirectory(prefix="memorm-bench-") as tmp:
            path = Path(tmp) / "bench.db"
            yield Store(engine, f"sqlite+aiosqlite:///{path}", path=path)
        return
    if engine != "postgres":
        raise ValueError(f"unknown engine {engine!r}")
    schema = f"bench_{uuid.uuid4().hex[:16]}"
    admin = await asyncpg.connect(asyncpg_dsn())
    try:
        await admin.execute("CREATE EXTENSION IF NOT EXISTS vector SCHEMA public")
        await admin.execute("CREATE EXTENSION IF NOT EXISTS btree_gin SCHEMA public")
        await admin.execute(f'CREATE SCHEMA "{schema}"')
        yield Store(
            engine,
            POSTGRES_URL,
            {"connect_args": {"server_settings": {"search_path": f"{schema},public"}}},
            schema=schema,
        )
    finally:
        await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await admin.close()


@contextmanager
def statements_sent(db: Database, containing: str) -> Iterator[list[tuple[str, Any]]]:
    """The statements (SQL, parameters) ``db`` sends inside the block whose SQL contains ``containing``.

    For EXPLAINing what memorm sent, or counting statements
    (`memorm.testing.capture_statements`: the driver's and SQLAlchemy's).  Example::

        with statements_sent(db, "<=>") as sent:
            await search(db, ...)
        (statement, parameters), = sent
    """
    with capture_statements(db, containing) as sent:
        yield sent
