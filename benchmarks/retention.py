"""Retention: purging expired sessions, deleting by age, forgetting a person.

Each scenario works in its own store.  The data is written by the raw driver
with memorm's encodings (SQLite: 32-hex uuids, ``YYYY-MM-DD HH:MM:SS.ffffff``
text, JSON text, little-endian float32 bytes; Postgres: native types, jsonb as
text, pgvector's binary codec), then checked through memorm: its dry-run
counts must match what was built.  The rows a timed run deletes are also kept
in ``stage_*`` copies of the tables; before every sample, outside the timing,
they go back with one ``INSERT … SELECT`` per table (through the full-text
triggers and GIN indexes, like any insert), and the store is settled as
``db.scrub()`` would: SQLite merges both FTS5 indexes (``'optimize'``) and
checkpoints the WAL (``wal_checkpoint(TRUNCATE)``); Postgres runs
``VACUUM (ANALYZE, INDEX_CLEANUP ON)`` on memorm's tables, whose autovacuum is
off so that it never runs inside a timing.  memorm and the raw side alternate on the same
data, in an order rotated every round, and every run's result is checked (the
counts, and what is left).

1. ``memorm.retention.purge_expired(db, batch=100)`` (one unit of work per
   100 sessions) of 500 expired sessions x 100 messages among 500 live
   sessions of 100 messages, against the raw driver doing the same: per
   transaction (``BEGIN IMMEDIATE`` on SQLite), select up to 100 expired ids
   (``ORDER BY expires_at``, ``FOR UPDATE SKIP LOCKED`` on Postgres),
   ``DELETE FROM messages WHERE session_id IN …``, ``DELETE FROM sessions
   WHERE id IN …``, until a batch comes back short.  memorm also runs a
   dry-run count first (the totals it reports progress against).  Then
   ``db.scrub()`` after memorm's purge.
2. ``uow.messages.delete_before(agent_id, cutoff)`` of the older half of one
   agent's 20,000 messages (20 sessions interleaved in time, a tool call and
   its two answers every 25 messages, and in each session a call just before
   the cutoff whose two answers are newer, so they go too), against the raw
   driver in one transaction: a ``DELETE`` of the agent's newer ``tool``
   messages whose nearest earlier non-tool message is older than the cutoff
   (one index probe each), then the plain ``DELETE FROM messages WHERE
   agent_id = ? AND created_at < ?`` (timed on its own too).
3. ``uow.agents.forget({"user_id": …})`` of one person among 200, each with an
   agent (``meta.user_id``) holding 10 sessions x 200 messages and 500
   passages of 384-d, and, in one shared agent, two tagged sessions of 20
   messages, 20 tagged passages and 5 tagged messages in a group session
   (409,000 messages and 104,000 passages in all).  The raw side runs
   memorm's statements in one transaction (the ``archive_version`` bump, on
   Postgres the ``FOR UPDATE`` of the sessions, then the deletes of messages,
   passages, sessions and agents) without memorm's counts and id look-ups,
   matching ``json_extract(meta, '$.user_id') = ?`` / ``meta @> $1``; on
   SQLite it then runs FTS5 ``'optimize'`` of both indexes as memorm does,
   each timed on its own.  ``db.scrub()`` is timed after memorm's forget, and
   memorm's statements are timed through SQLAlchemy's cursor events to show
   where its time goes.
4. SQLite only: the raw purge of (1) with ``PRAGMA secure_delete = ON`` (as
   memorm sets on every connection, and as the raw side of (1) runs) against
   ``OFF``.

``--quick`` shrinks every scenario (20 people, 2,000 messages, 100 expired
sessions of 50) and takes two samples of each.  There are no targets: the rows
report times, ratios and rows/s.
"""

from __future__ import annotations

import random
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
from sqlalchemy import event

from benchmarks.common import (
    Row,
    Samples,
    Store,
    format_seconds,
    postgres_words,
    sqlite_words,
    store,
    timed,
)
from memorm import Database
from memorm.ids import uuid7
from memorm.retention import Removed, purge_expired
from memorm.transfer.rows import TABLES as MEMORM_TABLES
from memorm.transfer.rows import column_names
from memorm.types.json import dumps

NAME = "retention"
UTC = timezone.utc
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)  # the purge's "now"; the data is laid out around it
DIM = 384
MODEL = "default"

# Every column of memorm's tables, in the order rows are copied; parents before children.
COLUMNS = {table.name: column_names(table) for table in MEMORM_TABLES}
# Tables whose full-text search words (derived from this column) a raw load writes too.
WORDS_FROM = {"messages": "content", "archival_passages": "text"}
TABLES = tuple(COLUMNS)  # parents before children
FTS_TABLES = ("messages_fts", "archival_passages_fts")  # SQLite
JSON_COLUMNS = frozenset({"meta", "core_memory", "llm_config", "tool_calls"})


@dataclass
class Size:
    expired: int  # (1) expired sessions
    live: int  # (1) live sessions
    per_session: int  # (1) messages per session
    batch: int  # (1) sessions per unit of work
    purge_reps: int
    age_sessions: int  # (2)
    age_per_session: int  # (2) messages per session
    age_reps: int
    people: int  # (3)
    person_sessions: int
    person_per_session: int  # messages per session of a person's agent
    person_passages: int
    forget_reps: int


FULL = Size(
    expired=500,
    live=500,
    per_session=100,
    batch=100,
    purge_reps=7,
    age_sessions=20,
    age_per_session=1000,
    age_reps=5,
    people=200,
    person_sessions=10,
    person_per_session=200,
    person_passages=500,
    forget_reps=5,
)
QUICK = Size(
    expired=100,
    live=100,
    per_session=50,
    batch=25,
    purge_reps=2,
    age_sessions=8,
    age_per_session=250,
    age_reps=2,
    people=20,
    person_sessions=4,
    person_per_session=100,
    person_passages=100,
    forget_reps=2,
)

SCRUB_NOTE = {
    "sqlite": "FTS5 optimize of both indexes + wal_checkpoint(TRUNCATE)",
    "postgres": "VACUUM (ANALYZE, INDEX_CLEANUP ON) of memorm's five tables",
}

# The shared agent's data about each person (scenario 3).
SHARED_SESSIONS = 2
SHARED_SESSION_MESSAGES = 20
SHARED_PASSAGES = 20
GROUP_MESSAGES = 5  # messages tagged with the person in an untagged group session


# -- data -----------------------------------------------------------------------------------------


class Builder:
    """Rows of memorm's tables as dicts of Python values; the text is seeded."""

    VOCABULARY = tuple(f"w{rank}" for rank in range(5000))

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        weights = [1 / (rank + 1) for rank in range(len(self.VOCABULARY))]  # Zipf
        self.texts = [
            " ".join(self.rng.choices(self.VOCABULARY, weights, k=self.rng.randint(10, 80)))
            for _ in range(4096)
        ]
        self.count = 0

    def text(self) -> str:
        """Chat-like text: Zipf-distributed words (about 45 of them) and one rare token."""
        self.count += 1
        return f"{self.texts[(self.count * 7919) % len(self.texts)]} ref{self.count}"

    @staticmethod
    def agent(name: str, at: datetime, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return {
            "id": uuid7(),
            "created_at": at,
            "updated_at": at,
            "meta": dict(meta or {}),
            "name": name,
            "system": "",
            "core_memory": {},
            "llm_config": {},
            "version": 1,
            "archive_version": 0,
            "retention": None,
        }

    @staticmethod
    def model(agent_id: uuid.UUID, at: datetime) -> dict[str, Any]:
        return {
            "id": uuid7(),
            "created_at": at,
            "updated_at": at,
            "meta": {},
            "agent_id": agent_id,
            "name": MODEL,
            "dim": DIM,
            "precision": "float32",
        }

    @staticmethod
    def session(
        agent_id: uuid.UUID,
        at: datetime,
        messages: int,
        *,
        expires_at: datetime | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        return {
            "id": uuid7(),
            "created_at": at,
            "updated_at": at,
            "meta": dict(meta or {}),
            "agent_id": agent_id,
            "title": None,
            "key": None,
            "next_seq": messages + 1,
            "expires_at": expires_at,
        }

    def message(
        self,
        chat: Mapping[str, Any],
        seq: int,
        at: datetime,
        *,
        role: str | None = None,
        meta: Mapping[str, Any] | None = None,
        call: str | None = None,
        answers: str | None = None,
    ) -> dict[str, Any]:
        """Message ``seq`` of ``chat``: a tool call (``call``), a tool answer (``answers``) or chat."""
        content = self.text()
        tool_calls = None
        if call is not None:
            role = "assistant"
            tool_calls = [{"id": call, "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]
        elif answers is not None:
            role = "tool"
        return {
            "id": uuid7(),
            "created_at": at,
            "updated_at": at,
            "meta": dict(meta or {}),
            "session_id": chat["id"],
            "agent_id": chat["agent_id"],
            "seq": seq,
            "role": role or ("user" if seq % 2 else "assistant"),
            "content": content,
            "name": "lookup" if answers is not None else None,
            "tool_calls": tool_calls,
            "tool_call_id": answers,
            "token_count": 4 + len(content) // 4,
        }

    def chat(self, chat: Mapping[str, Any], count: int, step: timedelta) -> list[dict[str, Any]]:
        """``count`` plain messages of ``chat``, ``step`` apart from its creation."""
        start = chat["created_at"]
        return [self.message(chat, seq, start + seq * step) for seq in range(1, count + 1)]

    def passage(
        self, agent_id: uuid.UUID, at: datetime, vector: np.ndarray, meta: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        return {
            "id": uuid7(),
            "created_at": at,
            "updated_at": at,
            "meta": dict(meta or {}),
            "agent_id": agent_id,
            "text": self.text(),
            "embedding": vector,
            "embedding_half": None,
            "embedding_model": MODEL,
            "embedding_dim": DIM,
        }


def unit_vectors(rng: np.random.Generator, count: int) -> np.ndarray:
    vectors = rng.standard_normal((count, DIM), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors


# -- raw drivers ----------------------------------------------------------------------------------


def _sqlite_time(value: datetime) -> str:
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


def _sqlite_value(column: str, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, uuid.UUID):
        return value.hex
    if isinstance(value, datetime):
        return _sqlite_time(value)
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
    return row.get(column, "default") if column == "tenant" else row[column]


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
        connection, cutoff = self.connection, _sqlite_time(now)
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
        parameters = {"agent": agent_id.hex, "cutoff": _sqlite_time(cutoff)}

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
        from pgvector.asyncpg import register_vector

        connection = await where.raw_postgres()
        await register_vector(connection)
        return cls(connection)

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


def _key(engine: str, value: uuid.UUID) -> Any:
    return value.hex if engine == "sqlite" else value


# -- helpers --------------------------------------------------------------------------------------


async def rounds(
    variants: Sequence[tuple[str, Callable[[], Awaitable[Any]]]],
    reps: int,
    restore: Callable[[], Awaitable[None]],
    check: Callable[[str, Any], Awaitable[None]],
) -> dict[str, Samples]:
    """``reps`` rounds of every variant, each on freshly restored data, in an order rotated per round."""
    samples = {name: Samples() for name, _ in variants}
    for rep in range(reps):
        shift = rep % len(variants)
        for name, work in [*variants[shift:], *variants[:shift]]:
            await restore()
            result = await timed(work, samples[name], collect=True)
            await check(name, result)
    return samples


class Profile:
    """memorm's statements in each run of an operation, with their times (SQLAlchemy cursor events).

    The events cost a few microseconds per statement; they are on in every
    memorm sample, so the samples stay comparable.
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        self.runs: list[list[tuple[str, float]]] = []

    def wrap(self, work: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
        async def profiled() -> Any:
            with self._statements() as statements:
                result = await work()
            self.runs.append(statements)
            return result

        return profiled

    @contextmanager
    def _statements(self) -> Iterator[list[tuple[str, float]]]:
        found: list[tuple[str, float]] = []

        def before(connection: Any, *_: Any) -> None:
            connection.info["bench_started"] = time.perf_counter()

        def after(connection: Any, cursor: Any, statement: str, *_: Any) -> None:
            found.append((statement, time.perf_counter() - connection.info.pop("bench_started")))

        engine = self.db.engine.sync_engine
        event.listen(engine, "before_cursor_execute", before)
        event.listen(engine, "after_cursor_execute", after)
        try:
            yield found
        finally:
            event.remove(engine, "before_cursor_execute", before)
            event.remove(engine, "after_cursor_execute", after)

    @staticmethod
    def _kind(statement: str) -> str:
        text = statement.lstrip().upper()
        if "'OPTIMIZE'" in text:
            return "FTS5 optimize"
        if text.startswith("SELECT COUNT"):
            return "counts"
        return text.split(None, 1)[0].lower()

    def note(self) -> str:
        """Median time per run by kind of statement, and the slowest statement (median of its total)."""
        if not self.runs:
            return ""

        def median(key: Callable[[str], str], value: str) -> float:
            return statistics.median(
                sum(seconds for statement, seconds in run if key(statement) == value) for run in self.runs
            )

        def head(statement: str) -> str:
            return " ".join(statement.split())[:60]

        kinds = {self._kind(statement) for run in self.runs for statement, _ in run}
        by_kind = sorted(((median(self._kind, kind), kind) for kind in kinds), reverse=True)
        heads = {head(statement) for run in self.runs for statement, _ in run}
        slowest, text = max((median(head, text), text) for text in heads)
        count = statistics.median(len(run) for run in self.runs)
        return (
            f"memorm's {count:g} statements per run by kind: "
            + ", ".join(f"{kind} {format_seconds(seconds)}" for seconds, kind in by_kind)
            + f"; slowest: `{text}…` {format_seconds(slowest)}"
        )


# -- 1 and 4: purge of expired sessions -----------------------------------------------------------


async def bench_purge(engine: str, size: Size) -> list[Row]:
    builder = Builder(seed=1)
    expected = Removed(sessions=size.expired, messages=size.expired * size.per_session)
    async with store(engine) as where:
        db = where.database()
        await db.create_all()
        raw = await open_raw(where)
        try:
            start = NOW - timedelta(days=30)
            agent = builder.agent("bench-purge", start)
            await raw.load("agents", [agent])
            live_ids = []
            for index in range(max(size.live, size.expired)):  # live and expired interleaved in time
                at = start + timedelta(minutes=index)
                if index < size.live:
                    lasting = NOW + timedelta(days=30) if index % 2 else None
                    chat = builder.session(agent["id"], at, size.per_session, expires_at=lasting)
                    await raw.load("sessions", [chat])
                    await raw.load("messages", builder.chat(chat, size.per_session, timedelta(seconds=1)))
                    live_ids.append(chat["id"])
                if index < size.expired:
                    gone = NOW - timedelta(minutes=size.expired - index)  # exactly-at-now would expire too
                    chat = builder.session(agent["id"], at, size.per_session, expires_at=gone)
                    await raw.load("sessions", [chat], stage=True)
                    await raw.load(
                        "messages", builder.chat(chat, size.per_session, timedelta(seconds=1)), stage=True
                    )
            await raw.restore()
            async with db.unit_of_work(read_only=True) as uow:
                counted = await uow.sessions.purge_expired(now=NOW, dry_run=True)
                window = await uow.messages.window(live_ids[0], limit=3)
            assert counted == expected, counted
            assert [m.seq for m in window] == [size.per_session - 2, size.per_session - 1, size.per_session]

            live_keys = sorted(_key(engine, key) for key in live_ids)

            scrub = Samples()
            profile = Profile(db)

            async def check(name: str, removed: Any) -> None:
                assert removed == expected, (name, removed)
                if name == "memorm":
                    await timed(db.scrub, scrub, collect=True)
                remaining = await raw.column("SELECT id FROM sessions ORDER BY id")
                assert remaining == live_keys, name
                messages = await raw.value("SELECT count(*) FROM messages")
                assert messages == size.live * size.per_session, (name, messages)

            variants: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
                ("memorm", profile.wrap(lambda: purge_expired(db, now=NOW, batch=size.batch))),
                ("raw", lambda: raw.purge(NOW, size.batch)),
            ]
            if isinstance(raw, RawSQLite):
                sqlite_raw = raw

                async def secure_off() -> Removed:
                    await sqlite_raw.secure_delete(False)
                    try:
                        return await sqlite_raw.purge(NOW, size.batch)
                    finally:
                        await sqlite_raw.secure_delete(True)

                await sqlite_raw.secure_delete(True)  # as memorm's connections
                variants.append(("raw secure_delete=OFF", secure_off))
            samples = await rounds(variants, size.purge_reps, raw.restore, check)
        finally:
            await raw.close()
            await db.dispose()
    messages = expected.messages
    batches = -(-size.expired // size.batch)
    memorm, plain = samples["memorm"], samples["raw"]
    rows = [
        Row(
            NAME,
            engine,
            f"purge_expired: {size.expired} expired x {size.per_session} msgs among "
            f"{size.live} live sessions (batch={size.batch})",
            memorm,
            plain,
            rows=messages,
            note=(
                f"{messages:,} messages in {batches} batches + 1 empty one, one transaction each; "
                f"memorm {messages / memorm.median:,.0f} msgs/s, raw {messages / plain.median:,.0f} msgs/s; "
                f"memorm adds a dry-run count; {profile.note()}"
            ),
        )
    ]
    rows.append(
        Row(
            NAME,
            engine,
            "db.scrub() after memorm's purge",
            scrub,
            note=SCRUB_NOTE[engine],
        )
    )
    if "raw secure_delete=OFF" in samples:
        off = samples["raw secure_delete=OFF"]
        rows.append(
            Row(
                NAME,
                engine,
                "raw purge above, secure_delete ON (memorm column) vs OFF (raw column)",
                plain,
                off,
                rows=messages,
                note=f"secure_delete costs {plain.median / off.median - 1:+.0%} on this delete",
            )
        )
    return rows


# -- 2: delete_before -----------------------------------------------------------------------------


async def bench_delete_before(engine: str, size: Size) -> list[Row]:
    builder = Builder(seed=2)
    sessions, per = size.age_sessions, size.age_per_session
    half = per // 2
    start = NOW - timedelta(days=60)
    cutoff = start + timedelta(seconds=half * sessions)  # messages 0 .. half-1 of each session are older
    expected = sessions * half + 2 * sessions  # plus the two orphaned tool answers per session
    assert half % 25 == 0, "the cutoff must fall between tool-call blocks"
    async with store(engine) as where:
        db = where.database()
        await db.create_all()
        raw = await open_raw(where)
        try:
            agent = builder.agent("bench-age", start - timedelta(days=1))
            await raw.load("agents", [agent])
            for index in range(sessions):
                chat = builder.session(agent["id"], start - timedelta(hours=1), per)
                await raw.load("sessions", [chat])
                messages = []
                for k in range(per):
                    at = start + timedelta(seconds=k * sessions + index)  # sessions interleaved in time
                    seq = k + 1
                    block = k - k % 25 + 7  # a tool call at 7 mod 25, its two answers at 8 and 9
                    if k == half - 1 or k == block:
                        messages.append(builder.message(chat, seq, at, call=f"call_{index}_{k}"))
                    elif k in (half, half + 1):  # answers to the call just before the cutoff
                        messages.append(builder.message(chat, seq, at, answers=f"call_{index}_{half - 1}"))
                    elif k in (block + 1, block + 2):
                        messages.append(builder.message(chat, seq, at, answers=f"call_{index}_{block}"))
                    else:
                        messages.append(builder.message(chat, seq, at))
                await raw.load("messages", messages, stage=True)
            await raw.restore()
            async with db.unit_of_work(read_only=True) as uow:
                counted = await uow.messages.delete_before(agent["id"], cutoff, dry_run=True)
            assert counted == expected, (counted, expected)

            survivors: dict[str, list[Any]] = {}
            parts = {"plain": Samples()}
            profile = Profile(db)

            async def check(name: str, deleted: Any) -> None:
                assert deleted == expected, (name, deleted, expected)
                if name not in survivors:  # the messages each side kept, compared after the rounds
                    survivors[name] = await raw.column("SELECT id FROM messages ORDER BY id")
                    assert len(survivors[name]) == sessions * per - expected, name

            async def memorm_delete() -> int:
                async with db.unit_of_work() as uow:
                    return await uow.messages.delete_before(agent["id"], cutoff)

            samples = await rounds(
                [
                    ("memorm", profile.wrap(memorm_delete)),
                    ("raw", lambda: raw.delete_before(agent["id"], cutoff, parts)),
                ],
                size.age_reps,
                raw.restore,
                check,
            )
            assert survivors["memorm"] == survivors["raw"], "memorm and raw kept different messages"
        finally:
            await raw.close()
            await db.dispose()
    memorm, plain = samples["memorm"], samples["raw"]
    return [
        Row(
            NAME,
            engine,
            f"delete_before: older half of one agent's {sessions * per:,} msgs ({sessions} sessions)",
            memorm,
            plain,
            rows=expected,
            note=(
                f"{expected:,} deleted ({2 * sessions} of them newer tool answers to deleted calls); "
                f"memorm {expected / memorm.median:,.0f} msgs/s, raw {expected / plain.median:,.0f} msgs/s; "
                f"the raw plain DELETE alone {format_seconds(parts['plain'].median)}; {profile.note()}"
            ),
        )
    ]


# -- 3: forget ------------------------------------------------------------------------------------


async def bench_forget(engine: str, size: Size) -> list[Row]:
    builder = Builder(seed=3)
    vectors = np.random.default_rng(3)
    target = size.people // 2
    user = f"u{target}"
    start = NOW - timedelta(days=90)
    person_messages = size.person_sessions * size.person_per_session
    expected = Removed(
        agents=1,
        sessions=size.person_sessions + SHARED_SESSIONS,
        messages=person_messages + SHARED_SESSIONS * SHARED_SESSION_MESSAGES + GROUP_MESSAGES,
        passages=size.person_passages + SHARED_PASSAGES,
    )
    async with store(engine) as where:
        db = where.database()
        await db.create_all()
        raw = await open_raw(where)
        try:
            shared = builder.agent("bench-shared", start)
            group = builder.session(shared["id"], start, size.people * GROUP_MESSAGES)
            await raw.load("agents", [shared])
            await raw.load("embedding_models", [builder.model(shared["id"], start)])
            await raw.load("sessions", [group])
            for person in range(size.people):
                stage = person == target
                tag = {"user_id": f"u{person}"}
                at = start + timedelta(minutes=person)
                agent = builder.agent(f"person-{person}", at, tag)
                await raw.load("agents", [agent], stage=stage)
                await raw.load("embedding_models", [builder.model(agent["id"], at)], stage=stage)
                chats = [
                    builder.session(agent["id"], at, size.person_per_session)
                    for _ in range(size.person_sessions)
                ]
                await raw.load("sessions", chats, stage=stage)
                messages = [
                    m
                    for chat in chats
                    for m in builder.chat(chat, size.person_per_session, timedelta(seconds=30))
                ]
                await raw.load("messages", messages, stage=stage)
                await raw.load(
                    "archival_passages",
                    [
                        builder.passage(agent["id"], at, vector)
                        for vector in unit_vectors(vectors, size.person_passages)
                    ],
                    stage=stage,
                )
                # What the shared agent holds about the person.
                tagged = [
                    builder.session(shared["id"], at, SHARED_SESSION_MESSAGES, meta=tag)
                    for _ in range(SHARED_SESSIONS)
                ]
                await raw.load("sessions", tagged, stage=stage)
                about = [
                    m
                    for chat in tagged
                    for m in builder.chat(chat, SHARED_SESSION_MESSAGES, timedelta(seconds=30))
                ]
                about += [
                    builder.message(
                        group, person * GROUP_MESSAGES + n + 1, at + timedelta(seconds=n), meta=tag
                    )
                    for n in range(GROUP_MESSAGES)
                ]
                await raw.load("messages", about, stage=stage)
                await raw.load(
                    "archival_passages",
                    [
                        builder.passage(shared["id"], at, vector, meta=tag)
                        for vector in unit_vectors(vectors, SHARED_PASSAGES)
                    ],
                    stage=stage,
                )
            await raw.restore()
            total_messages = await raw.value("SELECT count(*) FROM messages")
            total_passages = await raw.value("SELECT count(*) FROM archival_passages")
            async with db.unit_of_work(read_only=True) as uow:
                counted = await uow.agents.forget({"user_id": user}, dry_run=True)
            assert counted == expected, (counted, expected)

            parts = {name: Samples() for name in ("deletes", "messages_fts", "archival_passages_fts")}
            scrub = Samples()
            profile = Profile(db)

            async def memorm_forget() -> Removed:
                async with db.unit_of_work() as uow:
                    return await uow.agents.forget({"user_id": user})

            async def check(name: str, removed: Any) -> None:
                assert removed == expected, (name, removed, expected)
                if name == "memorm":
                    await timed(db.scrub, scrub)
                left = await raw.value("SELECT count(*) FROM messages")
                assert left == total_messages - expected.messages, (name, left)
                left = await raw.value("SELECT count(*) FROM archival_passages")
                assert left == total_passages - expected.passages, (name, left)

            samples = await rounds(
                [("memorm", profile.wrap(memorm_forget)), ("raw", lambda: raw.forget(user, parts))],
                size.forget_reps,
                raw.restore,
                check,
            )
            if isinstance(raw, RawSQLite):
                fts_size = await raw.value("SELECT sum(length(block)) FROM messages_fts_data")
            else:
                fts_size = None
        finally:
            await raw.close()
            await db.dispose()
    memorm, plain = samples["memorm"], samples["raw"]
    scope = f"of {size.people} ({total_messages:,} msgs, {total_passages:,} passages in all)"
    rows = [
        Row(
            NAME,
            engine,
            f"forget one person {scope}",
            memorm,
            plain,
            rows=expected.total,
            note=(
                f"removed {expected.as_dict()}; "
                f"raw statements alone {format_seconds(parts['deletes'].median)}"
                + ("; raw includes both FTS5 optimizes" if engine == "sqlite" else "")
                + f"; {profile.note()}"
            ),
        )
    ]
    if engine == "sqlite":
        rows += [
            Row(
                NAME,
                engine,
                f"  of which FTS5 optimize messages_fts ({total_messages:,} rows; raw SQL)",
                raw=parts["messages_fts"],
                note=f"messages_fts_data {fts_size / 2**20:.0f} MiB after the run" if fts_size else "",
            ),
            Row(
                NAME,
                engine,
                f"  of which FTS5 optimize archival_passages_fts ({total_passages:,} rows; raw SQL)",
                raw=parts["archival_passages_fts"],
            ),
        ]
    rows.append(
        Row(
            NAME,
            engine,
            "db.scrub() after memorm's forget",
            scrub,
            note=SCRUB_NOTE[engine],
        )
    )
    return rows


# -- entry point ----------------------------------------------------------------------------------


async def run(engines: Sequence[str], *, quick: bool = False) -> list[Row]:
    size = QUICK if quick else FULL
    rows: list[Row] = []
    for engine in engines:
        rows += await bench_purge(engine, size)
        rows += await bench_delete_before(engine, size)
        rows += await bench_forget(engine, size)
    return rows
