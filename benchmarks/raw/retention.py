"""memorm's retention work done by hand: loading rows, purges, deletion by age, forgetting a person.

Rows of memorm's tables (dicts of Python values) are loaded with memorm's
encodings (SQLite: 32-hex uuids, ``YYYY-MM-DD HH:MM:SS.ffffff`` text, JSON
text, little-endian float32 bytes; Postgres: native types, jsonb as text,
pgvector's binary codec), into the tables or their ``stage_*`` copies;
:meth:`RawSQLite.restore` / :meth:`RawPostgres.restore` put the staged rows
back and settle the store as ``db.scrub()`` would.  The deletes are memorm's
statements, sent in one transaction per batch as memorm sends them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import numpy as np

from benchmarks.raw.encoding import TENANT, postgres_words, sqlite_time, sqlite_words
from benchmarks.stores import Store
from benchmarks.timing import Samples
from memorm.retention import Removed
from memorm.transfer.rows import TABLES as MEMORM_TABLES
from memorm.transfer.rows import column_names
from memorm.types.json import dumps

__all__ = ["COLUMNS", "FTS_TABLES", "TABLES", "RawPostgres", "RawSQLite", "key", "open_raw"]

# Every column of memorm's tables keyed by id (the scenarios' data; not the graph tables), in the
# order rows are copied; parents before children.
COLUMNS = {table.name: column_names(table) for table in MEMORM_TABLES if "id" in table.c}
# Tables whose full-text search words (derived from this column) a raw load writes too.
WORDS_FROM = {"messages": "content", "archival_passages": "text"}
TABLES = tuple(COLUMNS)  # parents before children
FTS_TABLES = ("messages_fts", "archival_passages_fts")  # SQLite
JSON_COLUMNS = frozenset({"meta", "core_memory", "llm_config", "tool_calls"})


def _sqlite_value(column: str, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, uuid.UUID):
        return value.hex
    if isinstance(value, datetime):
        return sqlite_time(value)
    if column in JSON_COLUMNS:
        return dumps(value)
    if isinstance(value, np.ndarray):
        return value.astype("<f4").tobytes()
    return value


def _pg_value(column: str, value: Any) -> Any:
    if value is not None and column in JSON_COLUMNS:
        return dumps(value)  # asyncpg's jsonb codec takes JSON text
    return value


def _marks(count: int) -> str:
    return ", ".join("?" * count)


def _loaded(table: str) -> tuple[str, ...]:
    """The columns a raw load writes: the row's, and the search words memorm derives from it."""
    return COLUMNS[table] + (("search_words",) if table in WORDS_FROM else ())


def _restore(table: str) -> str:
    """Put back the staged rows of `table` that are missing.

    The probe names the whole primary key, `(tenant, id)`: by `id` alone
    SQLite cannot use the key's index and scans the table once per staged row.
    """
    columns = _loaded(table)
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) "
        f"SELECT {', '.join('s.' + c for c in columns)} FROM stage_{table} AS s "
        f"WHERE NOT EXISTS (SELECT 1 FROM {table} AS t WHERE t.tenant = s.tenant AND t.id = s.id)"
    )


def _cell(row: Mapping[str, Any], column: str) -> Any:
    """The row's value of `column`; rows made here have no tenant: memorm's default one."""
    return row.get(column, TENANT) if column == "tenant" else row[column]


def _words(table: str, row: Mapping[str, Any], encode: Callable[[str], Any]) -> tuple[Any, ...]:
    return (encode(row[WORDS_FROM[table]]),) if table in WORDS_FROM else ()


class RawSQLite:
    """memorm's retention work done by hand on aiosqlite (a connection set up as memorm's are)."""

    EXPIRED = "SELECT id FROM sessions WHERE expires_at <= ? ORDER BY expires_at LIMIT ?"
    OLD = "DELETE FROM messages WHERE agent_id = :agent AND created_at < :cutoff"
    # The answers of the old messages: newer tool messages whose nearest earlier non-tool message is old.
    ANSWERS = (
        "DELETE FROM messages WHERE agent_id = :agent AND created_at >= :cutoff AND role = 'tool' AND ("
        "SELECT head.created_at FROM messages AS head WHERE head.session_id = messages.session_id "
        "AND head.seq < messages.seq AND head.role != 'tool' ORDER BY head.seq DESC LIMIT 1) < :cutoff"
    )

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    async def secure_delete(self, on: bool) -> None:
        await self.connection.execute(f"PRAGMA secure_delete = {'ON' if on else 'OFF'}")

    async def _transaction(self, work: Callable[[], Awaitable[Any]]) -> Any:
        connection = self.connection
        await connection.execute("BEGIN IMMEDIATE")
        try:
            result = await work()
            await connection.execute("COMMIT")
        except BaseException:
            await connection.execute("ROLLBACK")
            raise
        return result

    async def load(self, table: str, rows: Sequence[Mapping[str, Any]], *, stage: bool = False) -> None:
        columns = _loaded(table)
        target = f"stage_{table}" if stage else table
        records = [
            tuple(_sqlite_value(c, _cell(row, c)) for c in COLUMNS[table]) + _words(table, row, sqlite_words)
            for row in rows
        ]
        insert = f"INSERT INTO {target} ({', '.join(columns)}) VALUES ({_marks(len(columns))})"
        await self._transaction(lambda: self.connection.executemany(insert, records))

    async def make_stage(self) -> None:
        for table in TABLES:
            await self.connection.execute(f"CREATE TABLE stage_{table} AS SELECT * FROM {table} WHERE 0")

    async def restore(self) -> None:
        """Put back every staged row that is missing, then settle."""

        async def work() -> None:
            for table in TABLES:
                await self.connection.execute(_restore(table))

        await self._transaction(work)
        await self.settle()

    async def settle(self) -> None:
        """What ``db.scrub()`` does: merge both FTS5 indexes, checkpoint and truncate the WAL.

        So every sample starts from the same state: each index one segment, an empty WAL.
        """
        for index in FTS_TABLES:
            await self.connection.execute(f"INSERT INTO {index}({index}) VALUES ('optimize')")
        await self.connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    async def value(self, sql: str, *parameters: Any) -> Any:
        rows = await self.connection.execute_fetchall(sql, parameters)
        return rows[0][0]

    async def column(self, sql: str, *parameters: Any) -> list[Any]:
        return [row[0] for row in await self.connection.execute_fetchall(sql, parameters)]

    async def purge(self, now: datetime, batch: int) -> Removed:
        connection, cutoff = self.connection, sqlite_time(now)
        total = Removed()
        while True:

            async def work() -> Removed:
                ids = [row[0] for row in await connection.execute_fetchall(self.EXPIRED, (cutoff, batch))]
                if not ids:
                    return Removed()
                marks = _marks(len(ids))
                messages = await connection.execute(
                    f"DELETE FROM messages WHERE session_id IN ({marks})", ids
                )
                sessions = await connection.execute(f"DELETE FROM sessions WHERE id IN ({marks})", ids)
                return Removed(sessions=sessions.rowcount, messages=messages.rowcount)

            removed = await self._transaction(work)
            total += removed
            if removed.sessions < batch:
                return total

    async def delete_before(self, agent_id: uuid.UUID, cutoff: datetime, parts: dict[str, Samples]) -> int:
        connection = self.connection
        parameters = {"agent": agent_id.hex, "cutoff": sqlite_time(cutoff)}

        async def work() -> int:
            answers = (await connection.execute(self.ANSWERS, parameters)).rowcount
            started = time.perf_counter()
            old = (await connection.execute(self.OLD, parameters)).rowcount
            parts["plain"].add(time.perf_counter() - started)
            return int(answers + old)

        result: int = await self._transaction(work)
        return result

    @staticmethod
    def _match(table: str) -> str:
        return f"json_extract({table}.meta, '$.user_id') = :user"

    async def forget(self, user: str, parts: dict[str, Samples]) -> Removed:
        """memorm's forget statements, then both FTS5 merges; each part timed into ``parts``."""
        connection, match = self.connection, self._match
        agents = f"SELECT id FROM agents WHERE {match('agents')}"
        sessions = f"SELECT id FROM sessions WHERE sessions.agent_id IN ({agents}) OR {match('sessions')}"
        passages = f"archival_passages.agent_id IN ({agents}) OR {match('archival_passages')}"
        statements = {
            "bump": (
                "UPDATE agents SET archive_version = archive_version + 1 WHERE id IN "
                f"(SELECT agent_id FROM archival_passages WHERE {passages}) OR {match('agents')}"
            ),
            "messages": f"DELETE FROM messages WHERE session_id IN ({sessions}) OR {match('messages')}",
            "passages": f"DELETE FROM archival_passages WHERE {passages}",
            "sessions": (
                f"DELETE FROM sessions WHERE sessions.agent_id IN ({agents}) OR {match('sessions')}"
            ),
            "agents": f"DELETE FROM agents WHERE {match('agents')}",
        }
        parameters = {"user": user}

        async def work() -> Removed:
            counts: dict[str, int] = {}
            started = time.perf_counter()
            for name, statement in statements.items():
                counts[name] = (await connection.execute(statement, parameters)).rowcount
            parts["deletes"].add(time.perf_counter() - started)
            for index in FTS_TABLES:
                started = time.perf_counter()
                await connection.execute(f"INSERT INTO {index}({index}) VALUES ('optimize')")
                parts[index].add(time.perf_counter() - started)
            return Removed(
                agents=counts["agents"],
                sessions=counts["sessions"],
                messages=counts["messages"],
                passages=counts["passages"],
            )

        result: Removed = await self._transaction(work)
        return result

    async def close(self) -> None:
        await self.connection.close()


def _pg_count(status: str) -> int:
    return int(status.rsplit(" ", 1)[-1])


class RawPostgres:
    """memorm's retention work done by hand on asyncpg."""

    EXPIRED = (
        "SELECT id FROM sessions WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED"
    )
    OLD = "DELETE FROM messages WHERE agent_id = $1 AND created_at < $2"
    ANSWERS = (
        "DELETE FROM messages WHERE agent_id = $1 AND created_at >= $2 AND role = 'tool' AND ("
        "SELECT head.created_at FROM messages AS head WHERE head.session_id = messages.session_id "
        "AND head.seq < messages.seq AND head.role != 'tool' ORDER BY head.seq DESC LIMIT 1) < $2"
    )
    TABLE_LIST = ", ".join(TABLES)

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    @classmethod
    async def open(cls, where: Store) -> RawPostgres:
        return cls(await where.raw_postgres(vectors=True))

    async def load(self, table: str, rows: Sequence[Mapping[str, Any]], *, stage: bool = False) -> None:
        columns = _loaded(table)
        records = [
            tuple(_pg_value(c, _cell(row, c)) for c in COLUMNS[table]) + _words(table, row, postgres_words)
            for row in rows
        ]
        await self.connection.copy_records_to_table(
            f"stage_{table}" if stage else table, records=records, columns=columns
        )

    async def make_stage(self) -> None:
        for table in TABLES:
            await self.connection.execute(f"CREATE TABLE stage_{table} (LIKE {table})")
            await self.connection.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")

    async def restore(self) -> None:
        async with self.connection.transaction():
            for table in TABLES:
                await self.connection.execute(_restore(table))
        await self.settle()

    async def settle(self) -> None:
        """As ``db.scrub()`` does: dead rows and their index entries go; fresh statistics."""
        await self.connection.execute(f"VACUUM (ANALYZE, INDEX_CLEANUP ON) {self.TABLE_LIST}")

    async def value(self, sql: str, *parameters: Any) -> Any:
        return await self.connection.fetchval(_numbered(sql), *parameters)

    async def column(self, sql: str, *parameters: Any) -> list[Any]:
        return [row[0] for row in await self.connection.fetch(_numbered(sql), *parameters)]

    async def purge(self, now: datetime, batch: int) -> Removed:
        connection = self.connection
        total = Removed()
        while True:
            async with connection.transaction():
                ids = [row[0] for row in await connection.fetch(self.EXPIRED, now, batch)]
                removed = Removed()
                if ids:
                    messages = await connection.execute(
                        "DELETE FROM messages WHERE session_id = ANY($1::uuid[])", ids
                    )
                    sessions = await connection.execute(
                        "DELETE FROM sessions WHERE id = ANY($1::uuid[])", ids
                    )
                    removed = Removed(sessions=_pg_count(sessions), messages=_pg_count(messages))
            total += removed
            if removed.sessions < batch:
                return total

    async def delete_before(self, agent_id: uuid.UUID, cutoff: datetime, parts: dict[str, Samples]) -> int:
        connection = self.connection
        async with connection.transaction():
            answers = _pg_count(await connection.execute(self.ANSWERS, agent_id, cutoff))
            started = time.perf_counter()
            old = _pg_count(await connection.execute(self.OLD, agent_id, cutoff))
            parts["plain"].add(time.perf_counter() - started)
        return answers + old

    async def forget(self, user: str, parts: dict[str, Samples]) -> Removed:
        connection = self.connection
        agents = "SELECT id FROM agents WHERE agents.meta @> $1::jsonb"
        sessions = (
            f"SELECT id FROM sessions WHERE sessions.agent_id IN ({agents}) OR sessions.meta @> $1::jsonb"
        )
        passages = f"archival_passages.agent_id IN ({agents}) OR archival_passages.meta @> $1::jsonb"
        statements = {
            "bump": (
                "UPDATE agents SET archive_version = archive_version + 1 WHERE id IN "
                f"(SELECT agent_id FROM archival_passages WHERE {passages}) OR agents.meta @> $1::jsonb"
            ),
            # Lock the sessions before deleting their rows, as memorm does (against deadlocks).
            "lock": f"SELECT id FROM sessions WHERE id IN ({sessions}) ORDER BY id FOR UPDATE",
            "messages": (
                f"DELETE FROM messages WHERE session_id IN ({sessions}) OR messages.meta @> $1::jsonb"
            ),
            "passages": f"DELETE FROM archival_passages WHERE {passages}",
            "sessions": (
                f"DELETE FROM sessions WHERE sessions.agent_id IN ({agents}) OR sessions.meta @> $1::jsonb"
            ),
            "agents": "DELETE FROM agents WHERE agents.meta @> $1::jsonb",
        }
        where = dumps({"user_id": user})
        counts: dict[str, int] = {}
        async with connection.transaction():
            started = time.perf_counter()
            for name, statement in statements.items():
                counts[name] = _pg_count(await connection.execute(statement, where))
            parts["deletes"].add(time.perf_counter() - started)
        return Removed(
            agents=counts["agents"],
            sessions=counts["sessions"],
            messages=counts["messages"],
            passages=counts["passages"],
        )

    async def close(self) -> None:
        await self.connection.close()


def _numbered(sql: str) -> str:
    """``?`` placeholders as ``$1, $2, …`` (for the few checks written once for both engines)."""
    parts = sql.split("?")
    return "".join(
        part + (f"${index + 1}" if index < len(parts) - 1 else "") for index, part in enumerate(parts)
    )


async def open_raw(where: Store) -> RawSQLite | RawPostgres:
    raw = RawSQLite(await where.raw_sqlite()) if where.engine == "sqlite" else await RawPostgres.open(where)
    await raw.make_stage()
    return raw


def key(engine: str, value: uuid.UUID) -> Any:
    """``value`` as the raw driver reads it back from a key column on ``engine``."""
    return value.hex if engine == "sqlite" else value
