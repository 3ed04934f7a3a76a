"""memorm's chat work done by hand on the raw drivers: the baselines memorm is measured against.

What a careful developer would write on aiosqlite / asyncpg for the same
essential work, with values stored exactly as memorm stores them:

* appends allocate sequence numbers with the same ``UPDATE sessions …
  RETURNING``, make the ids (uuid7) and serialise ``meta`` / ``tool_calls``
  inside the call, derive the same full-text words and token counts, and
  insert every column with the driver's fastest path: ``executemany`` on
  SQLite, ``COPY`` (``copy_records_to_table``) on Postgres for batches, a
  prepared ``INSERT`` for one row;
* reads send one statement and decode every row into a dict of Python
  objects (uuids, aware datetimes, parsed JSON), as memorm builds ``Message``
  objects;
* ``context`` is one statement: the system message, and the newest messages
  whose running token sum fits the budget (a window function over the newest
  rows, doubling the scan only if every scanned row fitted).

Statements name the session's agent, as memorm's do once it knows the
session (the messages' keys start with tenant and agent); an unknown
session's agent is looked up once and remembered, as memorm does.
JSON goes through the standard library's encoder and decoder.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from benchmarks.raw.encoding import TENANT, UTC, postgres_words, sqlite_time, sqlite_words
from benchmarks.stores import Store
from memorm.ids import uuid7

__all__ = ["COLUMNS", "WRITTEN", "RawPostgres", "RawSQLite", "open_raw"]

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
FIRST_SCAN = 256  # context: the newest rows whose tokens are summed first

_dumps = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode
_loads = json.loads


def _optional_json(value: Any) -> str | None:
    return None if value is None else _dumps(value)


def _tokens(message: Mapping[str, Any]) -> int:
    """The ``token_count`` to store: the given one, else memorm's default estimate, done by hand."""
    given = message.get("token_count")
    if given is not None:
        return int(given)
    chars = len(message.get("content") or "") + len(message.get("name") or "")
    tool_calls = message.get("tool_calls")
    if tool_calls:
        chars += len(_dumps(tool_calls))
    return 4 + (chars + 3) // 4


def _records(
    messages: Sequence[Mapping[str, Any]],
    *,
    session: Any,
    agent: Any,
    seq: int,
    now: Any,
    new_id: Callable[[], Any],
    words: Callable[[str], Any],
) -> list[tuple[Any, ...]]:
    """The rows to insert (``WRITTEN`` order): ids made and JSON serialised here, as memorm does per call."""
    return [
        (
            TENANT,
            new_id(),
            now,
            now,
            _dumps(message.get("meta") or {}),
            session,
            agent,
            seq + index,
            message["role"],
            message.get("content", ""),
            message.get("name"),
            _optional_json(message.get("tool_calls")),
            message.get("tool_call_id"),
            _tokens(message),
            words(message.get("content", "")),
        )
        for index, message in enumerate(messages)
    ]


def _hex_id() -> str:
    return uuid7().hex


_SESSION = "tenant = {tenant} AND agent_id = {agent} AND session_id = {session}"
_WINDOW = f"SELECT {COLUMN_LIST} FROM messages WHERE {_SESSION} ORDER BY seq DESC LIMIT {{limit}}"
# The pinned system message (the session's first message, if a system one), then every
# message from the oldest of the newest that fit the budget left after it.
_CONTEXT = f"""
WITH head AS (
    SELECT seq, role, token_count FROM messages WHERE {_SESSION} ORDER BY seq LIMIT 1
), pinned AS (
    SELECT seq, coalesce(token_count, 0) AS tokens FROM head WHERE role = 'system'
), newest AS (
    SELECT seq, coalesce(token_count, (coalesce(length(content), 0) + 3) / 4 + 4) AS tokens
    FROM messages
    WHERE {_SESSION} AND seq > coalesce((SELECT seq FROM pinned), -2147483649)
    ORDER BY seq DESC LIMIT {{scan}}
), running AS (
    SELECT seq, sum(tokens) OVER (ORDER BY seq DESC) AS total FROM newest
)
SELECT {COLUMN_LIST} FROM messages WHERE {_SESSION} AND seq = (SELECT seq FROM pinned)
UNION ALL
SELECT {COLUMN_LIST} FROM messages WHERE {_SESSION} AND seq >= (
    SELECT min(seq) FROM running WHERE total <= {{budget}} - coalesce((SELECT tokens FROM pinned), 0)
)
ORDER BY seq
"""


def _fitted(rows: list[dict[str, Any]], scan: int) -> list[dict[str, Any]] | None:
    """The context from decoded rows: None when every scanned row fitted (scan further)."""
    pinned = 1 if rows and rows[0]["role"] == "system" else 0
    if len(rows) - pinned >= scan:
        return None
    body = rows[pinned:]
    while body and body[0]["role"] == "tool":  # an answer whose call did not fit
        body.pop(0)
    return rows[:pinned] + body


class _Raw:
    """What both drivers share: the sessions' agents."""

    AGENT_OF: str

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.agents: dict[uuid.UUID, uuid.UUID] = {}

    async def _fetch(self, sql: str, *params: Any) -> list[Any]:
        raise NotImplementedError

    async def agent_of(self, session_id: uuid.UUID) -> uuid.UUID:
        agent = self.agents.get(session_id)
        if agent is None:
            ((found,),) = await self._fetch(self.AGENT_OF, TENANT, session_id)
            agent = self.agents[session_id] = found if isinstance(found, uuid.UUID) else uuid.UUID(found)
        return agent

    async def close(self) -> None:
        await self.connection.close()


class RawSQLite(_Raw):
    """aiosqlite: UUIDs as 32 hex characters, ``YYYY-MM-DD HH:MM:SS.ffffff`` UTC text, JSON text."""

    ALLOCATE = (
        "UPDATE sessions SET next_seq = next_seq + ?, updated_at = ? WHERE tenant = ? AND id = ? "
        "RETURNING agent_id, next_seq"
    )
    AGENT_OF = "SELECT agent_id FROM sessions WHERE tenant = ? AND id = ?"
    INSERT = f"INSERT INTO messages ({WRITTEN_LIST}) VALUES ({', '.join('?' * len(WRITTEN))})"
    WINDOW = _WINDOW.format(tenant=":tenant", agent=":agent", session=":session", limit=":limit")
    CONTEXT = _CONTEXT.format(
        tenant=":tenant", agent=":agent", session=":session", scan=":scan", budget=":budget"
    )

    async def _fetch(self, sql: str, *params: Any) -> list[Any]:
        values = [value.hex if isinstance(value, uuid.UUID) else value for value in params]
        return list(await self.connection.execute_fetchall(sql, values))

    async def _write(self, session_id: uuid.UUID, messages: Sequence[Mapping[str, Any]]) -> None:
        connection = self.connection
        count = len(messages)
        now = sqlite_time(datetime.now(UTC))
        key = session_id.hex
        await connection.execute("BEGIN IMMEDIATE")
        try:
            ((agent_id, end),) = await connection.execute_fetchall(self.ALLOCATE, (count, now, TENANT, key))
            records = _records(
                messages,
                session=key,
                agent=agent_id,
                seq=end - count,
                now=now,
                new_id=_hex_id,
                words=sqlite_words,
            )
            if count == 1:
                await connection.execute(self.INSERT, records[0])
            else:
                await connection.executemany(self.INSERT, records)
            await connection.execute("COMMIT")
        except BaseException:
            await connection.execute("ROLLBACK")
            raise
        self.agents[session_id] = uuid.UUID(agent_id)

    async def append_bulk(self, session_id: uuid.UUID, messages: Sequence[Mapping[str, Any]]) -> None:
        await self._write(session_id, messages)

    async def append_one(self, session_id: uuid.UUID, message: Mapping[str, Any]) -> None:
        await self._write(session_id, (message,))

    @staticmethod
    def _decode(rows: Sequence[Any]) -> list[dict[str, Any]]:
        to_uuid, parse, loads = uuid.UUID, datetime.fromisoformat, _loads
        return [
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

    def _keys(self, session_id: uuid.UUID, agent: uuid.UUID) -> dict[str, Any]:
        return {"tenant": TENANT, "agent": agent.hex, "session": session_id.hex}

    async def window(self, session_id: uuid.UUID, limit: int) -> list[dict[str, Any]]:
        keys = self._keys(session_id, await self.agent_of(session_id))
        decoded = self._decode(await self.connection.execute_fetchall(self.WINDOW, {**keys, "limit": limit}))
        decoded.reverse()
        return decoded

    async def context(self, session_id: uuid.UUID, max_tokens: int) -> list[dict[str, Any]]:
        keys = self._keys(session_id, await self.agent_of(session_id))
        scan = FIRST_SCAN
        while True:
            rows = await self.connection.execute_fetchall(
                self.CONTEXT, {**keys, "scan": scan, "budget": max_tokens}
            )
            fitted = _fitted(self._decode(rows), scan)
            if fitted is not None:
                return fitted
            scan *= 2

    async def shapes(self, session_id: uuid.UUID) -> list[tuple[Any, ...]]:
        """SQLite type and length of every stored value of the session, by seq."""
        shape = ", ".join(f"typeof({column}) || length({column})" for column in WRITTEN)
        query = f"SELECT {shape} FROM messages WHERE session_id = ? ORDER BY seq"
        return [tuple(row) for row in await self.connection.execute_fetchall(query, (session_id.hex,))]


class RawPostgres(_Raw):
    """asyncpg: native uuid and timestamptz; jsonb through asyncpg's text codec (JSON text in and out)."""

    ALLOCATE = (
        "UPDATE sessions SET next_seq = next_seq + $1, updated_at = $2 WHERE tenant = $3 AND id = $4 "
        "RETURNING agent_id, next_seq"
    )
    AGENT_OF = "SELECT agent_id FROM sessions WHERE tenant = $1 AND id = $2"
    PLACES = ", ".join(f"${n + 1}" for n in range(len(WRITTEN)))
    INSERT = f"INSERT INTO messages ({WRITTEN_LIST}) VALUES ({PLACES})"
    WINDOW = _WINDOW.format(tenant="$1", agent="$2", session="$3", limit="$4")
    CONTEXT = _CONTEXT.format(tenant="$1", agent="$2", session="$3", scan="$4", budget="$5")

    async def _fetch(self, sql: str, *params: Any) -> list[Any]:
        return list(await self.connection.fetch(sql, *params))

    @staticmethod
    def _records(
        messages: Sequence[Mapping[str, Any]], session_id: uuid.UUID, agent_id: Any, seq: int, now: datetime
    ) -> list[tuple[Any, ...]]:
        return _records(
            messages, session=session_id, agent=agent_id, seq=seq, now=now, new_id=uuid7, words=postgres_words
        )

    async def append_bulk(self, session_id: uuid.UUID, messages: Sequence[Mapping[str, Any]]) -> None:
        connection = self.connection
        count = len(messages)
        now = datetime.now(UTC)
        async with connection.transaction():
            agent_id, end = await connection.fetchrow(self.ALLOCATE, count, now, TENANT, session_id)
            records = self._records(messages, session_id, agent_id, end - count, now)
            await connection.copy_records_to_table("messages", records=records, columns=WRITTEN)
        self.agents[session_id] = agent_id

    async def append_one(self, session_id: uuid.UUID, message: Mapping[str, Any]) -> None:
        connection = self.connection
        now = datetime.now(UTC)
        async with connection.transaction():
            agent_id, end = await connection.fetchrow(self.ALLOCATE, 1, now, TENANT, session_id)
            (record,) = self._records((message,), session_id, agent_id, end - 1, now)
            await connection.execute(self.INSERT, *record)
        self.agents[session_id] = agent_id

    @staticmethod
    def _decode(rows: Sequence[Any]) -> list[dict[str, Any]]:
        decoded = []
        for row in rows:
            values = dict(row)
            values["meta"] = _loads(values["meta"])
            if values["tool_calls"] is not None:
                values["tool_calls"] = _loads(values["tool_calls"])
            decoded.append(values)
        return decoded

    async def window(self, session_id: uuid.UUID, limit: int) -> list[dict[str, Any]]:
        agent = await self.agent_of(session_id)
        decoded = self._decode(await self.connection.fetch(self.WINDOW, TENANT, agent, session_id, limit))
        decoded.reverse()
        return decoded

    async def context(self, session_id: uuid.UUID, max_tokens: int) -> list[dict[str, Any]]:
        agent = await self.agent_of(session_id)
        scan = FIRST_SCAN
        while True:
            rows = await self.connection.fetch(self.CONTEXT, TENANT, agent, session_id, scan, max_tokens)
            fitted = _fitted(self._decode(rows), scan)
            if fitted is not None:
                return fitted
            scan *= 2


async def open_raw(where: Store) -> RawSQLite | RawPostgres:
    """A raw baseline on ``where``'s database."""
    if where.engine == "sqlite":
        return RawSQLite(await where.raw_sqlite())
    return RawPostgres(await where.raw_postgres())
