"""The graph tables: LangGraph's checkpoints of sessions' graph state, and agents' long-term store.

Beside memorm's own tables (`memorm.models`), on the same metadata, owned,
deleted and sharded with their agent (and, for graph state, their session).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlmodel import Field

from memorm.rows import MemormModel, agent_key, empty_dict, now, tenant_field
from memorm.types import JSONType, UTCDateTime, UUIDType, VectorType

__all__ = [
    "CHECKPOINTS",
    "CHECKPOINT_BLOBS",
    "CHECKPOINT_TABLES",
    "CHECKPOINT_WRITES",
    "STORE_ITEMS",
    "STORE_TABLES",
    "STORE_VECTORS",
    "GraphBlob",
    "GraphCheckpoint",
    "GraphStoreItem",
    "GraphStoreVector",
    "GraphWrite",
]


# -- graph state (LangGraph's checkpoints; `memorm.compat.langgraph`) -----------------
# A graph framework saves a graph's state after every step: a checkpoint (which
# channel holds which version, which node saw what), the writes tasks made since
# it, and each channel's value once per version (a blob), so a step that changes
# one channel stores one value.  A graph's thread is a session of an agent: the
# rows are the session's children (deleted, expired and owned with it).  Values
# are opaque bytes with the name of the format that wrote them (`value_type`).
# Writes have no key to their checkpoint: a framework may save them first.


def _session_key(table: str) -> sa.ForeignKeyConstraint:
    """`(tenant, session_id, agent_id)` -> the session; deleting the session deletes the row."""
    return sa.ForeignKeyConstraint(
        ["tenant", "session_id", "agent_id"],
        ["sessions.tenant", "sessions.id", "sessions.agent_id"],
        name=f"fk_{table}_session_id_sessions",
        ondelete="CASCADE",
    )


class _SessionState(MemormModel):
    """Columns every graph-state row starts with: its tenant, agent, session and (sub)graph namespace."""

    # As on every table: no client-side default, a raw INSERT gets the unit of work's tenant.
    tenant: str = tenant_field()
    agent_id: uuid.UUID = Field(sa_type=UUIDType, primary_key=True)
    session_id: uuid.UUID = Field(sa_type=UUIDType, primary_key=True)
    # The (sub)graph the row belongs to: "" for the root graph.
    checkpoint_ns: str = Field(default="", sa_type=sa.Text, primary_key=True)


# One checkpoint of a session's graph state; `checkpoint_id`s sort in the order they were made.
class GraphCheckpoint(_SessionState, table=True):
    __tablename__ = "graph_checkpoints"
    __table_args__ = (_session_key("graph_checkpoints"),)

    checkpoint_id: str = Field(sa_type=sa.Text, primary_key=True)
    parent_checkpoint_id: str | None = Field(default=None, sa_type=sa.Text)
    # The checkpoint without its channel values (those are blobs), as its serializer wrote it.
    value_type: str = Field(sa_type=sa.Text, nullable=False)
    value: bytes = Field(sa_type=sa.LargeBinary, nullable=False)
    # The checkpoint's metadata (JSON, filterable: source, step, run_id…).
    meta: dict[str, Any] = Field(default_factory=empty_dict, sa_type=JSONType, nullable=False)
    created_at: datetime = Field(default_factory=now, sa_type=UTCDateTime, nullable=False)
    # The versions of the channels it holds (channel -> version), so SQL finds their values
    # (blobs) with it; None for checkpoints stored before revision 0014.
    channel_versions: dict[str, str] | None = Field(default=None, sa_type=JSONType, nullable=True)


# A write a task made after a checkpoint, before the next one (pending writes).
class GraphWrite(_SessionState, table=True):
    __tablename__ = "graph_writes"
    __table_args__ = (_session_key("graph_writes"),)

    checkpoint_id: str = Field(sa_type=sa.Text, primary_key=True)
    task_id: str = Field(sa_type=sa.Text, primary_key=True)
    # The write's place in its task's writes (negative for special channels: errors, interrupts).
    idx: int = Field(primary_key=True, sa_type=sa.Integer, sa_column_kwargs={"autoincrement": False})
    task_path: str = Field(default="", sa_type=sa.Text, nullable=False)
    channel: str = Field(sa_type=sa.Text, nullable=False)
    value_type: str = Field(sa_type=sa.Text, nullable=False)
    value: bytes = Field(sa_type=sa.LargeBinary, nullable=False)


# A channel's value at one version; checkpoints name the versions they hold.
class GraphBlob(_SessionState, table=True):
    __tablename__ = "graph_blobs"
    __table_args__ = (_session_key("graph_blobs"),)

    channel: str = Field(sa_type=sa.Text, primary_key=True)
    version: str = Field(sa_type=sa.Text, primary_key=True)
    # "empty" (and no value) for a channel that had no value at that version.
    value_type: str = Field(sa_type=sa.Text, nullable=False)
    value: bytes | None = Field(default=None, sa_type=sa.LargeBinary)


# -- long-term store (LangGraph's BaseStore; `memorm.compat.langgraph.MemormStore`) ----------
# JSON documents an agent keeps across threads, under a namespace (LangGraph's
# tuple of labels, joined by "." here: labels never hold one) and a key, with
# optional expiry, and their embeddings for semantic search.  The rows are the
# agent's (deleted, owned and sharded with it), never archival passages: a
# memory a graph keeps is not a passage the agent lists, counts or retires.

# Namespaces compare byte by byte on both engines (SQLite's BINARY, Postgres' "C"), so a
# namespace prefix is a range of the primary key: p <= namespace < p + "/" ("/" follows ".").
_NAMESPACE = sa.Text().with_variant(postgresql.TEXT(collation="C"), "postgresql")


class _StoreRow(MemormModel):
    """Columns every store row starts with: its tenant, agent, namespace and key."""

    tenant: str = tenant_field()
    agent_id: uuid.UUID = Field(sa_type=UUIDType, primary_key=True)
    namespace: str = Field(sa_type=_NAMESPACE, primary_key=True)
    key: str = Field(sa_type=sa.Text, primary_key=True)


_STORE_EXPIRING = sa.text("expires_at IS NOT NULL")


# An item of an agent's long-term store: a JSON object under (namespace, key).
class GraphStoreItem(_StoreRow, table=True):
    __tablename__ = "graph_store_items"
    __table_args__ = (
        agent_key("graph_store_items"),
        # Sweeps find an agent's expired items; items that never expire (NULL) are left out.
        sa.Index(
            None,
            "tenant",
            "agent_id",
            "expires_at",
            postgresql_where=_STORE_EXPIRING,
            sqlite_where=_STORE_EXPIRING,
        ),
    )

    value: dict[str, Any] = Field(default_factory=empty_dict, sa_type=JSONType, nullable=False)
    created_at: datetime = Field(default_factory=now, sa_type=UTCDateTime, nullable=False)
    updated_at: datetime = Field(default_factory=now, sa_type=UTCDateTime, nullable=False)
    # When the item expires (a sweep deletes it after; reads may skip it); None: never.
    expires_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    # Minutes each read (with refresh) or write moves `expires_at` on by; None: no expiry.
    ttl_minutes: float | None = Field(default=None, sa_type=sa.Float)


# The embedding of one indexed field (its path, as the store's `fields` name it) of an item.
class GraphStoreVector(_StoreRow, table=True):
    __tablename__ = "graph_store_vectors"
    __table_args__ = (
        sa.ForeignKeyConstraint(
            ["tenant", "agent_id", "namespace", "key"],
            [
                "graph_store_items.tenant",
                "graph_store_items.agent_id",
                "graph_store_items.namespace",
                "graph_store_items.key",
            ],
            name="fk_graph_store_vectors_tenant_graph_store_items",
            ondelete="CASCADE",
        ),
    )

    field: str = Field(sa_type=sa.Text, primary_key=True)
    embedding: list[float] = Field(sa_type=VectorType, nullable=False)


# The tables behind the models, typed for Core statements.
CHECKPOINTS: sa.Table = GraphCheckpoint.__table__  # type: ignore[attr-defined]
CHECKPOINT_WRITES: sa.Table = GraphWrite.__table__  # type: ignore[attr-defined]
CHECKPOINT_BLOBS: sa.Table = GraphBlob.__table__  # type: ignore[attr-defined]
CHECKPOINT_TABLES: tuple[sa.Table, ...] = (CHECKPOINTS, CHECKPOINT_WRITES, CHECKPOINT_BLOBS)
STORE_ITEMS: sa.Table = GraphStoreItem.__table__  # type: ignore[attr-defined]
STORE_VECTORS: sa.Table = GraphStoreVector.__table__  # type: ignore[attr-defined]
STORE_TABLES: tuple[sa.Table, ...] = (STORE_ITEMS, STORE_VECTORS)  # parent first
