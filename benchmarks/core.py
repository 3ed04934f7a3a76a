"""Core: appending messages and reading a session's window, memorm against the raw driver.

For each engine, the same work is done by memorm and by hand on the raw driver
(aiosqlite / asyncpg), with values encoded exactly as memorm stores them:

1. bulk append of 10,000 messages to one session in one transaction
   (memorm from dicts, and from pre-built ``Message`` objects);
2. 1,000 single-message appends, each in its own transaction;
3. the newest 50 messages of a session holding 1,000 and 100,000 messages,
   decoded into Python objects (memorm: ``Message``; raw: dicts with parsed
   uuids, datetimes and JSON).

The raw baseline allocates sequence numbers with the same
``UPDATE sessions … RETURNING`` and inserts every column, using the driver's
fastest path: ``executemany`` on SQLite, ``COPY`` (``copy_records_to_table``)
on Postgres for batches, a prepared ``INSERT`` for single rows.  It stores the
same ``token_count`` memorm's default estimate gives.  Before timing anything,
:func:`check_equivalence` proves both sides write and read the same rows.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from typing import Any, NamedTuple

from benchmarks.common import Row, Samples, Store, postgres_words, sqlite_words, store, timed
from memorm import Database, Message
from memorm.ids import uuid7
from memorm.models import MESSAGES
from memorm.types.json import dumps, loads

NAME = "core"

TENANT = "default"  # memorm writes and filters the unit of work's tenant; so does raw
COLUMNS = (
    "tenant",
    "id",
    "created_at",
    "updated_at",
    "meta",
    "session_id",
    "agent_id",
    "seq",
    "role",
    "content",
    "name",
    "tool_calls",
    "tool_call_id",
    "token_count",
)
COLUMN_LIST = ", ".join(COLUMNS)
WRITTEN = (*COLUMNS, "search_words")  # and the full-text search words memorm derives from content
WRITTEN_LIST = ", ".join(WRITTEN)

BULK_TARGET = 1.3
SINGLE_TARGET = 1.5
WINDOW_TARGET = 2.0
FLAT_LIMIT = 1.5  # memorm window latency at 100k may be at most this times its latency at 1k

UTC = timezone.utc
_TEXT = (
    "The quick brown fox jumps over the lazy dog while the agent recalls what the user said "
    "about their travel plans, their preferred airline and the meeting moved to Thursday."
)


def make_messages(count: int, start: int = 0) -> list[dict[str, Any]]:
    """``count`` plausible chat messages as dicts, alternating user and assistant."""
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}: {_TEXT}"}
        for i in range(start, start + count)
    ]


def as_models(messages: Sequence[Mapping[str, Any]]) -> list[Message]:
    return [Message(**message) for message in messages]


def _optional_json(value: Any) -> str | None:
    return None if value is None else dumps(value)


def _tokens(message: Mapping[str, Any]) -> int:
    """The ``token_count`` to store: the given one, else memorm's default estimate, done by hand."""
    given = message.get("token_count")
    if given is not None:
        return int(given)
    chars = len(message.get("content") or "") + len(message.get("name") or "")
    tool_calls = message.get("tool_calls")
    if tool_calls:
        chars += len(json.dumps(tool_calls, separators=(",", ":")))
    return 4 + (chars + 3) // 4


# -- raw drivers ----------------------------------------------------------------------------------


class RawSQLite:
    """memorm's work done by hand on aiosqlite.

    UUIDs are 32 hex characters, datetimes ``YYYY-MM-DD HH:MM:SS.ffffff`` UTC
    text, JSON is text: the encodings of :mod:`memorm.types`.
    """

    ALLOCATE = (
        "UPDATE sessions SET next_seq = next_seq + ?, updated_at = ? WHERE tenant = ? AND id = ? "
        "RETURNING agent_id, next_seq"
    )
    INSERT = f"INSERT INTO messages ({WRITTEN_LIST}) VALUES ({', '.join('?' * len(WRITTEN))})"
    WINDOW = (
        f"SELECT {COLUMN_LIST} FROM messages WHERE tenant = ? AND session_id = ? ORDER BY seq DESC LIMIT ?"
    )

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    @staticmethod
    def _timestamp(value: datetime) -> str:
        return value.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")

    async def _write(self, session_id: uuid.UUID, messages: Sequence[Mapping[str, Any]]) -> None:
        connection = self.connection
        count = len(messages)
        now = self._timestamp(datetime.now(UTC))
        key = session_id.hex
        await connection.execute("BEGIN IMMEDIATE")
        try:
            ((agent_id, end),) = await connection.execute_fetchall(self.ALLOCATE, (count, now, TENANT, key))
            seq = end - count
            records = [
                (
                    TENANT,
                    uuid7().hex,
                    now,
                    now,
                    "{}",
                    key,
                    agent_id,
                    seq + index,
                    message["role"],
                    message.get("content", ""),
                    message.get("name"),
                    _optional_json(message.get("tool_calls")),
                    message.get("tool_call_id"),
                    _tokens(message),
                    sqlite_words(message.get("content", "")),
                )
                for index, message in enumerate(messages)
            ]
            if count == 1:
                await connection.execute(self.INSERT, records[0])
            else:
                await connection.executemany(self.INSERT, records)
            await connection.execute("COMMIT")
        except BaseException:
            await connection.execute("ROLLBACK")
            raise

    async def append_bulk(self, session_id: uuid.UUID, messages: Sequence[Mapping[str, Any]]) -> None:
        await self._write(session_id, messages)

    async def append_one(self, session_id: uuid.UUID, message: Mapping[str, Any]) -> None:
        await self._write(session_id, (message,))

    async def window(self, session_id: uuid.UUID, limit: int) -> list[dict[str, Any]]:
        rows = await self.connection.execute_fetchall(self.WINDOW, (TENANT, session_id.hex, limit))
        to_uuid, parse = uuid.UUID, datetime.fromisoformat
        decoded = [
            {
                "tenant": row[0],
                "id": to_uuid(row[1]),
                "created_at": parse(row[2]).replace(tzinfo=UTC),
                "updated_at": parse(row[3]).replace(tzinfo=UTC),
                "meta": loads(row[4]),
                "session_id": to_uuid(row[5]),
                "agent_id": to_uuid(row[6]),
                "seq": row[7],
                "role": row[8],
                "content": row[9],
                "name": row[10],
                "tool_calls": None if row[11] is None else loads(row[11]),
                "tool_call_id": row[12],
                "token_count": row[13],
            }
            for row in rows
        ]
        decoded.reverse()
        return decoded

    async def shapes(self, session_id: uuid.UUID) -> list[tuple[Any, ...]]:
        """SQLite type and length of every stored value of the session, by seq."""
        shape = ", ".join(f"typeof({column}) || length({column})" for column in WRITTEN)
        query = f"SELECT {shape} FROM messages WHERE session_id = ? ORDER BY seq"
        return [tuple(row) for row in await self.connection.execute_fetchall(query, (session_id.hex,))]

    async def close(self) -> None:
        await self.connection.close()


class RawPostgres:
    """memorm's work done by hand on asyncpg: native uuid, timestamptz and jsonb.

    jsonb goes through asyncpg's default text codec (JSON text in, text out,
    parsed by :func:`json.loads`), the same serializer memorm uses.
    """

    ALLOCATE = (
        "UPDATE sessions SET next_seq = next_seq + $1, updated_at = $2 WHERE tenant = $3 AND id = $4 "
        "RETURNING agent_id, next_seq"
    )
    PLACES = ", ".join(f"${n + 1}" for n in range(len(WRITTEN)))
    INSERT = f"INSERT INTO messages ({WRITTEN_LIST}) VALUES ({PLACES})"
    WINDOW = (
        f"SELECT {COLUMN_LIST} FROM messages WHERE tenant = $1 AND session_id = $2 ORDER BY seq DESC LIMIT $3"
    )

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    def _records(
        self,
        messages: Sequence[Mapping[str, Any]],
        session_id: uuid.UUID,
        agent_id: Any,
        seq: int,
        now: datetime,
    ) -> list[tuple[Any, ...]]:
        return [
            (
                TENANT,
                uuid7(),
                now,
                now,
                "{}",
                session_id,
                agent_id,
                seq + index,
                message["role"],
                message.get("content", ""),
                message.get("name"),
                _optional_json(message.get("tool_calls")),
                message.get("tool_call_id"),
                _tokens(message),
                postgres_words(message.get("content", "")),
            )
            for index, message in enumerate(messages)
        ]

    async def append_bulk(self, session_id: uuid.UUID, messages: Sequence[Mapping[str, Any]]) -> None:
        connection = self.connection
        count = len(messages)
        now = datetime.now(UTC)
        async with connection.transaction():
            agent_id, end = await connection.fetchrow(self.ALLOCATE, count, now, TENANT, session_id)
            records = self._records(messages, session_id, agent_id, end - count, now)
            await connection.copy_records_to_table("messages", records=records, columns=WRITTEN)

    async def append_one(self, session_id: uuid.UUID, message: Mapping[str, Any]) -> None:
        connection = self.connection
        now = datetime.now(UTC)
        async with connection.transaction():
            agent_id, end = await connection.fetchrow(self.ALLOCATE, 1, now, TENANT, session_id)
            (record,) = self._records((message,), session_id, agent_id, end - 1, now)
            await connection.execute(self.INSERT, *record)

    async def window(self, session_id: uuid.UUID, limit: int) -> list[dict[str, Any]]:
        rows = await self.connection.fetch(self.WINDOW, TENANT, session_id, limit)
        decoded = []
        for row in reversed(rows):
            values = dict(row)
            values["meta"] = loads(values["meta"])
            if values["tool_calls"] is not None:
                values["tool_calls"] = loads(values["tool_calls"])
            decoded.append(values)
        return decoded

    async def close(self) -> None:
        await self.connection.close()


class Sides(NamedTuple):
    """What `both_sides` opens."""

    where: Store
    db: Database
    raw: RawSQLite | RawPostgres
    agent_id: uuid.UUID


async def open_raw(where: Store) -> RawSQLite | RawPostgres:
    if where.engine == "sqlite":
        return RawSQLite(await where.raw_sqlite())
    return RawPostgres(await where.raw_postgres())


# -- memorm ---------------------------------------------------------------------------------------


async def memorm_append(db: Database, session_id: uuid.UUID, messages: Any) -> None:
    async with db.unit_of_work() as uow:
        await uow.messages.append(session_id, messages)


Operation = Callable[[Database], Awaitable[Any]]


async def reading(db: Database, work: Callable[[Any], Awaitable[Any]]) -> Any:
    """`work(uow)` in a read-only unit of work of `db`."""
    async with db.unit_of_work(read_only=True) as uow:
        return await work(uow)


def chat_operations(agent: uuid.UUID, chat: uuid.UUID, query: list[float]) -> dict[str, Operation]:
    """The chat path and searches of one agent, by name: what comparisons of two databases time."""

    async def append(db: Database) -> None:
        async with db.unit_of_work() as uow:
            await uow.messages.append(chat, {"role": "user", "content": "one more common message"})

    return {
        "append one message (uow)": append,
        "window 50 (read-only uow)": lambda db: reading(db, lambda u: u.messages.window(chat, limit=50)),
        "context 2,000 tokens": lambda db: reading(db, lambda u: u.messages.context(chat, max_tokens=2_000)),
        "text search, common word": lambda db: reading(db, lambda u: u.messages.search(agent, "common")),
        "vector search k=10 (exact)": lambda db: reading(db, lambda u: u.passages.search(agent, query, k=10)),
    }


async def memorm_window(db: Database, session_id: uuid.UUID, limit: int) -> list[Message]:
    async with db.unit_of_work(read_only=True) as uow:
        return await uow.messages.window(session_id, limit=limit)


async def new_session(db: Database, agent_id: uuid.UUID) -> uuid.UUID:
    async with db.unit_of_work() as uow:
        return (await uow.sessions.create(agent_id)).id


async def fill_session(db: Database, session_id: uuid.UUID, count: int, batch: int = 10_000) -> None:
    for start in range(0, count, batch):
        await memorm_append(db, session_id, make_messages(min(batch, count - start), start))


# -- checks ---------------------------------------------------------------------------------------


def _comparable(message: Message | Mapping[str, Any]) -> tuple[Any, ...]:
    values = message.__dict__ if isinstance(message, Message) else message
    return tuple(str(values[c]) if c in ("id", "session_id", "agent_id") else values[c] for c in COLUMNS)


_PER_WRITE = frozenset({"id", "created_at", "updated_at", "session_id"})  # differ between any two writes


async def check_equivalence(db: Database, raw: RawSQLite | RawPostgres, agent_id: uuid.UUID) -> None:
    """Guard the comparison: memorm and the raw baseline must write and read the same rows.

    The same messages are appended by each (a batch, then a single message); every
    column but ids and timestamps must match, on SQLite so must each stored
    value's type and length (the encodings), and every session must read back
    identically through memorm and through the raw decoder.  When memorm's
    schema or defaults change, this fails until the raw baseline follows.
    """
    columns = tuple(column.name for column in MESSAGES.columns)
    if columns != WRITTEN:
        raise AssertionError(f"messages now has columns {columns}: update the raw baseline in {__name__}")
    batch = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "ü hi", "name": "ana", "token_count": 3},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "function": {"name": "f"}}]},
    ]
    single = {"role": "tool", "content": "42", "tool_call_id": "c1"}
    by_memorm, by_raw = await new_session(db, agent_id), await new_session(db, agent_id)
    await memorm_append(db, by_memorm, batch)
    await memorm_append(db, by_memorm, single)
    await raw.append_bulk(by_raw, batch)
    await raw.append_one(by_raw, single)
    written: dict[str, list[tuple[Any, ...]]] = {}
    for writer, session_id in (("memorm", by_memorm), ("raw", by_raw)):
        through_memorm = [_comparable(m) for m in await memorm_window(db, session_id, 50)]
        through_raw = [_comparable(m) for m in await raw.window(session_id, 50)]
        if through_memorm != through_raw:
            raise AssertionError(
                f"memorm and raw read {writer}'s rows differently:\n{through_memorm}\n{through_raw}"
            )
        written[writer] = [
            tuple(value for column, value in zip(COLUMNS, row, strict=True) if column not in _PER_WRITE)
            for row in through_raw
        ]
    if written["memorm"] != written["raw"]:
        raise AssertionError(f"the raw baseline writes other values than memorm:\n{written}")
    if isinstance(raw, RawSQLite):
        shapes = [await raw.shapes(session_id) for session_id in (by_memorm, by_raw)]
        if shapes[0] != shapes[1]:
            raise AssertionError(f"the raw baseline encodes values unlike memorm:\n{shapes[0]}\n{shapes[1]}")


# -- the benchmark --------------------------------------------------------------------------------


async def bench_bulk(
    db: Database, raw: RawSQLite | RawPostgres, agent_id: uuid.UUID, engine: str, *, reps: int, size: int
) -> list[Row]:
    messages = make_messages(size)
    dicts, models, driver = Samples(), Samples(), Samples()
    # Warm-up: statement caches, prepared statements, the COPY introspection query.
    for _ in range(2):
        await memorm_append(db, await new_session(db, agent_id), messages[:200])
        await memorm_append(db, await new_session(db, agent_id), as_models(messages[:200]))
        await raw.append_bulk(await new_session(db, agent_id), messages[:200])
    for rep in range(reps):
        prebuilt = as_models(messages)
        sessions = [await new_session(db, agent_id) for _ in range(3)]
        jobs = [
            (dicts, lambda s=sessions[0]: memorm_append(db, s, messages)),
            (models, lambda s=sessions[1], m=prebuilt: memorm_append(db, s, m)),
            (driver, lambda s=sessions[2]: raw.append_bulk(s, messages)),
        ]
        for samples, job in jobs[rep % 3 :] + jobs[: rep % 3]:  # rotate the order between reps
            await timed(job, samples, collect=True)
    label = f"bulk append {size:,} (one uow)"
    return [
        Row(NAME, engine, f"{label}, dicts", dicts, driver, rows=size, target=BULK_TARGET),
        Row(
            NAME,
            engine,
            f"{label}, Message objs",
            models,
            driver,
            rows=size,
            target=BULK_TARGET,
            note="objects built before the timing, so their ids (uuid7) and defaults are not timed; "
            "the raw side makes its ids inside the timing",
        ),
    ]


async def bench_singles(
    db: Database, raw: RawSQLite | RawPostgres, agent_id: uuid.UUID, engine: str, *, count: int
) -> list[Row]:
    messages = make_messages(count)
    ours, theirs = await new_session(db, agent_id), await new_session(db, agent_id)
    for message in make_messages(20):  # warm-up
        await memorm_append(db, ours, message)
        await raw.append_one(theirs, message)
    memorm_samples, raw_samples = Samples(), Samples()
    block = max(1, count // 10)
    for start in range(0, count, block):  # alternate blocks, so drift hits both sides alike
        chunk = messages[start : start + block]
        memorm_first = (start // block) % 2 == 0
        for side in ("memorm", "raw") if memorm_first else ("raw", "memorm"):
            for message in chunk:
                if side == "memorm":
                    await timed(lambda m=message: memorm_append(db, ours, m), memorm_samples)
                else:
                    await timed(lambda m=message: raw.append_one(theirs, m), raw_samples)
    return [
        Row(
            NAME,
            engine,
            f"{count:,} single appends (uow each)",
            memorm_samples,
            raw_samples,
            rows=1,
            target=SINGLE_TARGET,
            note=f"per append; total memorm {sum(memorm_samples.seconds):.2f} s, "
            f"raw {sum(raw_samples.seconds):.2f} s",
        )
    ]


async def bench_window(
    db: Database,
    raw: RawSQLite | RawPostgres,
    agent_id: uuid.UUID,
    engine: str,
    *,
    sizes: Sequence[int],
    reads: int,
    limit: int = 50,
) -> list[Row]:
    sessions: dict[int, uuid.UUID] = {}
    for size in sizes:
        session_id = sessions[size] = await new_session(db, agent_id)
        await fill_session(db, session_id, size)
        got_memorm = await memorm_window(db, session_id, limit)
        got_raw = await raw.window(session_id, limit)
        if [_comparable(m) for m in got_memorm] != [_comparable(m) for m in got_raw]:
            raise AssertionError("memorm and raw windows differ")
        if [m.seq for m in got_memorm] != list(range(size - limit + 1, size + 1)):
            raise AssertionError("the window is not the newest messages")
        for _ in range(20):  # warm-up
            await memorm_window(db, session_id, limit)
            await raw.window(session_id, limit)
    samples = {(size, side): Samples() for size in sizes for side in ("memorm", "raw")}
    # Every size and side read in turn, alternating who goes first, so that load
    # drifting meanwhile hits all four series alike (the flatness check compares sizes).
    for index in range(reads):
        for size in sizes if index % 2 else reversed(sizes):
            session_id = sessions[size]
            for side in ("memorm", "raw") if index % 2 else ("raw", "memorm"):
                if side == "memorm":
                    await timed(lambda s=session_id: memorm_window(db, s, limit), samples[size, side])
                else:
                    await timed(lambda s=session_id: raw.window(s, limit), samples[size, side])
    rows = [
        Row(
            NAME,
            engine,
            f"window {limit} of {size:,} (read-only uow)",
            samples[size, "memorm"],
            samples[size, "raw"],
            rows=limit,
            target=WINDOW_TARGET,
            note=""
            if index
            else "raw: one autocommit SELECT, rows decoded to dicts; memorm: a read-only unit of work "
            "(autocommit: no BEGIN/COMMIT) loading Message objects",
        )
        for index, size in enumerate(sizes)
    ]
    if len(sizes) > 1:
        small, large = min(sizes), max(sizes)
        growth = samples[large, "memorm"].median / samples[small, "memorm"].median
        rows.append(
            Row(
                NAME,
                engine,
                f"window latency flat {small:,} -> {large:,}",
                status="PASS" if growth <= FLAT_LIMIT else "MISS",
                note=f"memorm median at {large:,} is {growth:.2f}x its median at {small:,} "
                f"(flat means <= {FLAT_LIMIT:g}x)",
            )
        )
    return rows


@asynccontextmanager
async def both_sides(engine: str) -> AsyncIterator[Sides]:
    """A fresh store with memorm's schema, a memorm `Database` and a raw connection on it, and an agent."""
    async with store(engine) as where:
        db = where.database()
        raw = await open_raw(where)
        try:
            await db.create_all()
            async with db.unit_of_work() as uow:
                agent_id = (await uow.agents.create("bench")).id
            yield Sides(where, db, raw, agent_id)
        finally:
            await raw.close()
            await db.dispose()


async def run_engine(engine: str, *, quick: bool = False) -> list[Row]:
    async with both_sides(engine) as (_, db, raw, agent_id):
        await check_equivalence(db, raw, agent_id)
        rows = await bench_bulk(db, raw, agent_id, engine, reps=2 if quick else 5, size=10_000)
        rows += await bench_singles(db, raw, agent_id, engine, count=100 if quick else 1_000)
        rows += await bench_window(
            db,
            raw,
            agent_id,
            engine,
            sizes=(1_000, 10_000 if quick else 100_000),
            reads=20 if quick else 200,
        )
        return rows


async def run(engines: Sequence[str], *, quick: bool = False) -> list[Row]:
    """Every core benchmark on each engine in ``engines``."""
    rows: list[Row] = []
    for engine in engines:
        rows += await run_engine(engine, quick=quick)
    return rows
