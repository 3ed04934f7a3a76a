"""`Backend`: what every unit of work of one database shares.

The engines (one connection pool per event loop, `memorm.engines`), the
per-dialect connection setup (`memorm.connections`), what memorm learns of
the live database once (schema revision, role, distribution:
`memorm.schema_state`), SQLite's writer queue, and the caches (agents'
vectors, sessions' agents).  A [`Database`][memorm.db.Database] and each of
its tenant views hold one `Backend`; units of work, migrations and
distribution take it.

A `Backend` is safe from any event loop and any thread: each loop that uses
it gets an engine of its own, and SQLite writers of every loop queue on one
`CrossLoopLock`.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import configure_mappers

from memorm.concurrency import CrossLoopLock
from memorm.config import resolve_url
from memorm.connections import connect_postgres, connect_sqlite, set_up_engine
from memorm.engines import Engines, bridged
from memorm.errors import DatabaseError, MemormError, SchemaError
from memorm.routing import SessionAgents
from memorm.schema_state import current_revision, head_revision, is_distributed, role_bypasses_rls
from memorm.search.vector_index import connection_setup
from memorm.search.vector_scan import VectorCache
from memorm.telemetry import track
from memorm.tokens import TokenCounter, estimate_tokens
from memorm.translate import translate
from memorm.types.json import dumps, loads, loads_jsonb
from memorm.validation import check_flag

__all__ = ["Backend"]


class Backend:
    """One database's engines, connection setup, schema facts, SQLite writer queue and caches.

    Args:
        url: as [`Database`][memorm.db.Database] takes it (resolved by
            `memorm.config.resolve_url`).
        token_counter: estimates `token_count` for messages stored without one.
        transaction_pooling: a pooler in transaction mode sits in front of Postgres.
        **engine_options: passed to SQLAlchemy's `create_async_engine`.
    """

    def __init__(
        self,
        url: str | URL | None = None,
        *,
        token_counter: TokenCounter = estimate_tokens,
        transaction_pooling: bool = False,
        **engine_options: Any,
    ) -> None:
        self.url = resolve_url(url)
        self.transaction_pooling = check_flag(transaction_pooling, "transaction_pooling")
        self.token_counter = token_counter
        # Repositories build model instances without the ORM (models.hydrate);
        # the mappers must be configured first, or attribute access fails.
        configure_mappers()
        self.engine_options = dict(engine_options)
        self.dialect = self.url.get_backend_name()
        in_memory = self.dialect == "sqlite" and self.url.database in (None, "", ":memory:")
        # memorm opens the connections, unless the options bring a connection maker of their own.
        self._bridged = "async_creator" not in engine_options and "async_creator_fn" not in (
            engine_options.get("connect_args") or {}
        )
        # The SETs each new Postgres connection runs (again after a reset: memorm.link).
        server_settings = (engine_options.get("connect_args") or {}).get("server_settings") or {}
        self.session_setup = connection_setup(server_settings) if self.dialect == "postgresql" else None
        # One engine (pool) per event loop that uses this database (memorm.engines).
        self.engines = Engines(self._make_engine, single_loop=in_memory, bridged=self._bridged)
        track(self.engines, self.url.set(username=None, password=None).render_as_string())  # the pool gauges
        # SQLite has one write lock per file.  Writers of this process queue for it
        # here, first come first served, whatever loop or thread they run on; left
        # to SQLite's busy handler they poll with sleeps of up to 100 ms and starve
        # each other (p99 1.4 s with 50 writers).  BEGIN IMMEDIATE and the busy
        # timeout still order writers across processes.
        self.writer_lock: CrossLoopLock | None = (
            CrossLoopLock("SQLite's write lock") if self.dialect == "sqlite" else None
        )
        # SQLite's vector search reads agents' embeddings into numpy matrices once,
        # then reuses them until the agent's archive_version moves; both engines'
        # searches find agents' embedding models here (`vector_cache.models`).
        self.vector_cache = VectorCache()
        # Sessions' agents, for routing session-scoped calls on a distributed database.
        self.session_agents = SessionAgents()
        # What `check_schema` learns once (again after a migration: `schema_changed`).
        self._schema_lock = CrossLoopLock("the schema check")
        self.schema_ok = False
        self.role_known = False  # whether bypasses_rls was looked up (`bypasses_rls` raises until)
        self._bypasses_rls = False  # Postgres: whether the role is exempt from row-level security
        self.distributed = False  # Postgres: whether memorm's tables are sharded by agent (Citus)

    def _make_engine(self) -> AsyncEngine:
        """A new engine on this database's URL and options (one per event loop)."""
        postgres = self.dialect == "postgresql"
        options: dict[str, Any] = {
            "json_serializer": dumps,
            "json_deserializer": loads_jsonb if postgres else loads,
            # A unit of work always ends its transaction itself (and drops a
            # connection it cannot vouch for); the pool's extra ROLLBACK on
            # every check-in is a wasted round trip.
            "pool_reset_on_return": None,
        }
        options.update(self.engine_options)
        connect_args = dict(options.get("connect_args") or {})
        if postgres and self.transaction_pooling:
            # No statement outlives its transaction on a server connection: unnamed
            # statements only (asyncpg), and none kept by SQLAlchemy's adapter.
            connect_args.update(statement_cache_size=0, prepared_statement_cache_size=0)
        if self._bridged:
            if postgres:
                creator: Any = functools.partial(connect_postgres, settings=not self.transaction_pooling)
            else:
                creator = connect_sqlite
            connect_args["async_creator_fn"] = bridged(creator)
        if connect_args:
            options["connect_args"] = connect_args
        engine = create_async_engine(self.url, **options)
        set_up_engine(engine)
        return engine

    @property
    def engine(self) -> AsyncEngine:
        """The SQLAlchemy engine (and connection pool) of the running event loop.

        Each event loop gets its own, made on first use and disposed when the
        loop shuts down; outside any loop this is a spare engine that the
        first loop adopts.
        """
        return self.engines.current().engine

    async def dispose(self) -> None:
        """Close every pooled connection, of every event loop's engine."""
        await self.engines.dispose()

    async def check_schema(self) -> None:
        """Raise `SchemaError` unless the schema is at the head revision; learn the role once.

        Runs once per `Backend` (again after `schema_changed`); units of work
        call it before their first statement.
        """
        if self.schema_ok and self.role_known:
            return
        async with self._schema_lock:
            if not self.schema_ok:
                await self._check_revision()
                self.schema_ok = True
            await self._learn_role()

    async def learn_role(self) -> None:
        """Look up once whether the role bypasses row-level security, and whether the tables are
        distributed: what a unit of work needs as it opens, without the revision check."""
        if self.role_known:
            return
        async with self._schema_lock:
            await self._learn_role()

    async def _learn_role(self) -> None:
        if not self.role_known:
            if self.dialect == "postgresql":
                self._bypasses_rls = await role_bypasses_rls(self)
                self.distributed = await is_distributed(self)
            self.role_known = True

    def schema_changed(self) -> None:
        """A migration ran (or may have, cut short): check the revision before the next unit of work."""
        self.schema_ok = False

    async def _check_revision(self) -> None:
        try:
            current = await current_revision(self)
        except MemormError:
            raise
        except Exception as error:
            raise (translate(error) or DatabaseError(str(error))) from error
        head = head_revision()
        if current != head:
            where = "has no memorm schema" if current is None else f"is at {current}"
            raise SchemaError(
                f"the database {where}, but this memorm needs revision {head}: "
                "run `memorm db upgrade` (or `await db.upgrade()`)"
            )

    @property
    def bypasses_rls(self) -> bool:
        """Whether the role connecting is exempt from row-level security (see `Database.bypasses_rls`).

        Raises:
            MemormError: on Postgres, before the role was looked up.
        """
        if self.dialect == "postgresql" and not self.role_known:
            raise MemormError(
                "db.bypasses_rls: not known yet: memorm looks the role up before the first unit of "
                "work; run one, or `await db.check_schema()`, first"
            )
        return self._bypasses_rls
