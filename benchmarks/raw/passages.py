"""memorm's archival passages done by hand: writes, pgvector searches, and numpy on SQLite.

Writes are what ``uow.passages.add_many`` does: the ``agents.archive_version``
bump, the embedding model's lookup (registered by the first batch), and every
column encoded the way memorm stores it (SQLite: ``executemany`` with 32-hex
uuids, ``YYYY-MM-DD HH:MM:SS.ffffff`` text, JSON text, little-endian float32
bytes; Postgres: ``COPY`` via ``copy_records_to_table`` with pgvector's binary
codec, native uuid and timestamptz, jsonb as text).  A Postgres search is the
single nearest-neighbour query a raw asyncpg caller sends; on SQLite the
baseline is plain numpy on a float32 matrix (:class:`NumpySearch`).
"""

from __future__ import annotations

import uuid
from array import array
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import numpy as np

from benchmarks.raw.encoding import TENANT, UTC, postgres_words, sqlite_time, sqlite_words
from benchmarks.stores import Store
from memorm.ids import uuid7
from memorm.types.json import loads

__all__ = ["COLUMNS", "MODEL", "RAW_SETUP", "WRITTEN", "K", "NumpySearch", "RawPostgres", "RawSQLite"]

MODEL = "default"  # the embedding model both sides write
K = 10  # neighbours a search returns unless told
# What a raw caller sets once per connection (memorm does the same: memorm.db).
RAW_SETUP = "SET hnsw.ef_search = 40; SET hnsw.iterative_scan = strict_order"
COLUMNS = (
    "tenant",
    "id",
    "created_at",
    "updated_at",
    "meta",
    "agent_id",
    "text",
    "embedding",
    "embedding_half",
    "embedding_model",
    "embedding_dim",
)
COLUMN_LIST = ", ".join(COLUMNS)
WRITTEN = (*COLUMNS, "search_words")  # and the full-text search words memorm derives from text
WRITTEN_LIST = ", ".join(WRITTEN)


class NumpySearch:
    """The fair baseline: a pre-normalised float32 matrix; normalise, matmul, argpartition, sort."""

    def __init__(self, vectors: np.ndarray) -> None:
        self.unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    def search(self, query: Sequence[float], k: int = K) -> np.ndarray:
        q = np.asarray(query, dtype=np.float32)
        scores = self.unit @ (q / np.linalg.norm(q))
        top = np.argpartition(scores, len(scores) - k)[-k:]
        return top[np.argsort(-scores[top])]  # type: ignore[no-any-return]


class RawSQLite:
    """memorm's passage writes and searches done by hand on aiosqlite."""

    BUMP = "UPDATE agents SET archive_version = archive_version + 1 WHERE id = ?"
    FIND_MODEL = "SELECT dim, precision FROM embedding_models WHERE agent_id = ? AND name = ?"
    REGISTER = (
        "INSERT INTO embedding_models (id, created_at, updated_at, meta, agent_id, name, dim, precision) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
    )
    INSERT = f"INSERT INTO archival_passages ({WRITTEN_LIST}) VALUES ({', '.join('?' * len(WRITTEN))})"
    VECTORS = "SELECT id, embedding FROM archival_passages WHERE agent_id = ? AND embedding_model = ?"

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    async def add_many(self, agent_id: uuid.UUID, items: Sequence[dict[str, Any]]) -> None:
        connection = self.connection
        key, now = agent_id.hex, sqlite_time(datetime.now(UTC))
        dim = len(items[0]["embedding"])
        await connection.execute("BEGIN IMMEDIATE")
        try:
            cursor = await connection.execute(self.BUMP, (key,))
            if cursor.rowcount != 1:
                raise LookupError(f"no agent {agent_id}")
            found = await connection.execute_fetchall(self.FIND_MODEL, (key, MODEL))
            if not found:
                await connection.execute(
                    self.REGISTER, (uuid7().hex, now, now, "{}", key, MODEL, dim, "float32")
                )
            elif tuple(found[0]) != (dim, "float32"):
                raise ValueError(f"model {MODEL!r} is {tuple(found[0])}")
            # array("f").tobytes() is little-endian float32 on this (little-endian) machine.
            records = [
                (
                    TENANT,
                    uuid7().hex,
                    now,
                    now,
                    "{}",
                    key,
                    item["text"],
                    array("f", item["embedding"]).tobytes(),
                    None,
                    MODEL,
                    dim,
                    sqlite_words(item["text"]),
                )
                for item in items
            ]
            await connection.executemany(self.INSERT, records)
            await connection.execute("COMMIT")
        except BaseException:
            await connection.execute("ROLLBACK")
            raise

    async def cold_search(self, agent_id: uuid.UUID, query: Sequence[float], k: int = K) -> list[str]:
        """Read the agent's vectors afresh, then the numpy search: hex ids of the ``k`` nearest."""
        rows = await self.connection.execute_fetchall(self.VECTORS, (agent_id.hex, MODEL))
        ids = [row[0] for row in rows]
        matrix = np.frombuffer(b"".join(row[1] for row in rows), dtype="<f4").reshape(len(ids), -1)
        return [ids[i] for i in NumpySearch(matrix).search(query, k)]

    async def shapes(self, agent_id: uuid.UUID) -> list[tuple[Any, ...]]:
        """SQLite type and length of every stored value of the agent's passages, in text order."""
        shape = ", ".join(f"typeof({column}) || length({column})" for column in WRITTEN)
        query = f"SELECT {shape} FROM archival_passages WHERE agent_id = ? ORDER BY text"
        return [tuple(row) for row in await self.connection.execute_fetchall(query, (agent_id.hex,))]

    async def close(self) -> None:
        await self.connection.close()


class RawPostgres:
    """memorm's passage writes and searches done by hand on asyncpg, pgvector's codec registered."""

    BUMP = "UPDATE agents SET archive_version = archive_version + 1 WHERE id = $1"
    FIND_MODEL = "SELECT dim, precision FROM embedding_models WHERE agent_id = $1 AND name = $2"
    REGISTER = (
        "INSERT INTO embedding_models (id, created_at, updated_at, meta, agent_id, name, dim, precision) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
    )

    def __init__(self, connection: Any, dim: int, *, tenant: str | None = None) -> None:
        self.connection = connection
        # The literal model and dimension match the partial HNSW index's predicate.
        scope = "" if tenant is None else f"tenant = '{tenant}' AND "
        self.search_statement = (
            f"SELECT {COLUMN_LIST}, embedding::vector({dim}) <=> $1 AS distance FROM archival_passages "
            f"WHERE {scope}agent_id = $2 AND embedding_model = '{MODEL}' AND embedding_dim = {dim} "
            "ORDER BY distance LIMIT $3"
        )

    @classmethod
    async def open(cls, where: Store, dim: int) -> RawPostgres:
        connection = await where.raw_postgres(vectors=True)
        await connection.execute(RAW_SETUP)
        return cls(connection, dim)

    async def add_many(self, agent_id: uuid.UUID, items: Sequence[dict[str, Any]]) -> None:
        connection = self.connection
        now = datetime.now(UTC)
        dim = len(items[0]["embedding"])
        async with connection.transaction():
            if await connection.execute(self.BUMP, agent_id) != "UPDATE 1":
                raise LookupError(f"no agent {agent_id}")
            found = await connection.fetchrow(self.FIND_MODEL, agent_id, MODEL)
            if found is None:
                await connection.execute(
                    self.REGISTER, uuid7(), now, now, "{}", agent_id, MODEL, dim, "float32"
                )
            elif tuple(found) != (dim, "float32"):
                raise ValueError(f"model {MODEL!r} is {tuple(found)}")
            records = [
                (
                    TENANT,
                    uuid7(),
                    now,
                    now,
                    "{}",
                    agent_id,
                    item["text"],
                    item["embedding"],
                    None,
                    MODEL,
                    dim,
                    words,
                )
                for item in items
                for words in (postgres_words(item["text"]),)
            ]
            await connection.copy_records_to_table("archival_passages", records=records, columns=WRITTEN)

    async def search(
        self, agent_id: uuid.UUID, query: Sequence[float], k: int = K, *, ef_search: int | None = None
    ) -> list[dict[str, Any]]:
        """The ``k`` nearest passages, decoded to dicts (embedding as a list, meta parsed)."""
        connection = self.connection
        if ef_search is None:
            rows = await connection.fetch(self.search_statement, query, agent_id, k)
        else:
            async with connection.transaction():
                await connection.execute(f"SET LOCAL hnsw.ef_search = {int(ef_search)}")
                rows = await connection.fetch(self.search_statement, query, agent_id, k)
        decoded = []
        for row in rows:
            values = dict(row)
            values["meta"] = loads(values["meta"])
            values["embedding"] = values["embedding"].to_list()
            decoded.append(values)
        return decoded

    async def close(self) -> None:
        await self.connection.close()
