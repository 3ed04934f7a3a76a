"""The tables: Agent, Session, Message, ArchivalPassage, and the graph tables beside them.

One metadata object ([`metadata`][memorm.models.metadata], with a naming convention so constraint
names are stable across engines and migrations) serves SQLite and Postgres.
Every row carries `agent_id`, directly or through its session, so queries are
scoped to one agent and the schema can be sharded by agent.  The graph
tables (LangGraph's checkpoints and store) are in `memorm.graph_models`;
the base and the fast construction of rows in `memorm.rows`.

Timestamps are set by the application in UTC, never by a server default, and
ids are UUIDv7 so they sort by creation.  Relationships are deliberately not
mapped: cascades live in the foreign keys, and no attribute access does hidden IO.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa
from sqlmodel import Field

from memorm.graph_models import (
    CHECKPOINT_BLOBS,
    CHECKPOINT_TABLES,
    CHECKPOINT_WRITES,
    CHECKPOINTS,
    STORE_ITEMS,
    STORE_TABLES,
    STORE_VECTORS,
    GraphBlob,
    GraphCheckpoint,
    GraphStoreItem,
    GraphStoreVector,
    GraphWrite,
)
from memorm.rows import (
    MemormModel,
    Row,
    agent_key,
    empty_dict,
    hydrate,
    hydrate_all,
    keep_fast_init,
    metadata,
    tenant_field,
)
from memorm.types import JSONType, SearchWords, UTCDateTime, UUIDType, VectorType

__all__ = [
    "AGENTS",
    "AGENT_NAMES",
    "CHECKPOINTS",
    "CHECKPOINT_BLOBS",
    "CHECKPOINT_TABLES",
    "CHECKPOINT_WRITES",
    "DATA_TABLES",
    "EMBEDDING_MODELS",
    "MESSAGES",
    "PASSAGES",
    "ROLES",
    "SEARCH_WORDS",
    "SESSIONS",
    "STORE_ITEMS",
    "STORE_TABLES",
    "STORE_VECTORS",
    "TABLES",
    "Agent",
    "AgentName",
    "ArchivalPassage",
    "EmbeddingModel",
    "GraphBlob",
    "GraphCheckpoint",
    "GraphStoreItem",
    "GraphStoreVector",
    "GraphWrite",
    "MemormModel",
    "Message",
    "Role",
    "Session",
    "fields",
    "hydrate",
    "hydrate_all",
    "metadata",
]

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")


# An agent: its identity, system prompt and core memory (label -> text).
class Agent(Row, table=True):
    __tablename__ = "agents"

    # Unique per tenant: `agent_names` holds the names and enforces it.
    name: str = Field(sa_type=sa.Text, nullable=False)
    system: str = Field(default="", sa_type=sa.Text, nullable=False)
    core_memory: dict[str, str] = Field(default_factory=empty_dict, sa_type=JSONType, nullable=False)
    llm_config: dict[str, Any] = Field(default_factory=empty_dict, sa_type=JSONType, nullable=False)
    version: int = Field(default=1, nullable=False)
    # Bumped by every write to the agent's archival passages; vector caches key on it.
    archive_version: int = Field(default=0, nullable=False)
    # Seconds a new session of the agent lives (its default ``expires_at``); None: forever.
    retention: int | None = Field(default=None, sa_type=sa.BigInteger)


# The agents' names, unique per tenant: the one key of an agent that is not its id.
# Agents are sharded by id on a distributed database, where a unique index on the
# name could not hold; this small table can (a Citus reference table).
class AgentName(MemormModel, table=True):
    __tablename__ = "agent_names"
    __table_args__ = (sa.Index(None, "tenant", "agent_id"),)

    tenant: str = tenant_field()
    name: str = Field(primary_key=True, sa_type=sa.Text)
    agent_id: uuid.UUID = Field(sa_type=UUIDType, nullable=False)


# The rows below belong to one agent, and their keys say so: the primary key is
# (tenant, id, agent_id), so a distributed database can shard them by agent.


_EXPIRING = sa.text("expires_at IS NOT NULL")


# A conversation of one agent; ``next_seq`` hands out its messages' sequence numbers.
class Session(Row, table=True):
    __tablename__ = "sessions"
    __table_args__ = (
        agent_key("sessions"),
        sa.Index(None, "tenant", "agent_id", "created_at"),
        # An external key (a framework's session id), unique per agent when given.
        sa.Index(None, "tenant", "agent_id", "key", unique=True),
        # purge_expired scans by expiry; sessions that never expire (NULL) are left out.
        sa.Index(None, "expires_at", postgresql_where=_EXPIRING, sqlite_where=_EXPIRING),
    )

    agent_id: uuid.UUID = Field(sa_type=UUIDType, primary_key=True)
    title: str | None = Field(default=None, sa_type=sa.Text)
    key: str | None = Field(default=None, sa_type=sa.Text)
    next_seq: int = Field(default=1, nullable=False)
    # When the session may be purged (``sessions.purge_expired``); None: never.
    expires_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


# One chat message; ``seq`` orders a session's messages and is unique in it.
class Message(Row, table=True):
    __tablename__ = "messages"
    __table_args__ = (
        sa.ForeignKeyConstraint(
            ["tenant", "session_id", "agent_id"],
            ["sessions.tenant", "sessions.id", "sessions.agent_id"],
            name="fk_messages_session_id_sessions",
            ondelete="CASCADE",
        ),
        sa.UniqueConstraint("tenant", "agent_id", "session_id", "seq"),
        # An id names one message of the tenant, whichever agent holds it (a distributed
        # table cannot keep this index: memorm.repositories.id_claims checks ids there).
        sa.Index(None, "tenant", "id", unique=True),
        sa.Index(None, "tenant", "agent_id", "created_at"),
        sa.CheckConstraint("role IN ('system', 'user', 'assistant', 'tool')", name="role"),
        # OpenAI's assistant messages that only call tools have no content (None).
        sa.CheckConstraint("content IS NOT NULL OR role = 'assistant'", name="content"),
    )

    session_id: uuid.UUID = Field(default=None, sa_type=UUIDType, nullable=False)
    agent_id: uuid.UUID = Field(default=None, sa_type=UUIDType, primary_key=True)
    seq: int = Field(default=None, nullable=False)
    role: Role = Field(sa_type=sa.String(16), nullable=False)
    content: str | None = Field(default="", sa_type=sa.Text, nullable=True)
    name: str | None = Field(default=None, sa_type=sa.Text)
    tool_calls: list[dict[str, Any]] | None = Field(default=None, sa_type=JSONType)
    tool_call_id: str | None = Field(default=None, sa_type=sa.Text)
    token_count: int | None = Field(default=None)


# Long-term memory: a passage of text with its embedding, stored in one row.
class ArchivalPassage(Row, table=True):
    __tablename__ = "archival_passages"
    __table_args__ = (
        agent_key("archival_passages"),
        sa.Index(None, "tenant", "id", unique=True),  # one passage per id in the tenant, as messages
        sa.Index(None, "tenant", "agent_id", "embedding_model", "created_at"),
        # Exactly one of the two embedding columns holds the vector.
        sa.CheckConstraint("(embedding IS NULL) <> (embedding_half IS NULL)", name="one_embedding"),
    )

    agent_id: uuid.UUID = Field(sa_type=UUIDType, primary_key=True)
    text: str = Field(sa_type=sa.Text, nullable=False)
    # Full precision; None when the model stores half precision (``embedding_half``).
    embedding: list[float] | None = Field(default=None, sa_type=VectorType)
    embedding_half: list[float] | None = Field(default=None, sa_type=VectorType(half=True))
    embedding_model: str = Field(default="default", sa_type=sa.Text, nullable=False)
    embedding_dim: int = Field(nullable=False)

    @property
    def vector(self) -> list[float]:
        """The embedding, whichever precision stores it."""
        stored = self.embedding if self.embedding is not None else self.embedding_half
        return stored or []


# An agent's embedding model and its fixed shape: every passage of it has ``dim`` floats.
class EmbeddingModel(Row, table=True):
    __tablename__ = "embedding_models"
    __table_args__ = (
        agent_key("embedding_models"),
        sa.UniqueConstraint("tenant", "agent_id", "name"),
        sa.CheckConstraint("precision IN ('float32', 'float16')", name="precision"),
    )

    agent_id: uuid.UUID = Field(sa_type=UUIDType, primary_key=True)
    name: str = Field(sa_type=sa.Text, nullable=False)
    dim: int = Field(nullable=False)
    precision: str = Field(default="float32", sa_type=sa.String(8), nullable=False)


# The tables behind the models, typed for Core statements (``AGENTS.c.name``).
AGENTS: sa.Table = Agent.__table__  # type: ignore[attr-defined]
SESSIONS: sa.Table = Session.__table__  # type: ignore[attr-defined]
MESSAGES: sa.Table = Message.__table__  # type: ignore[attr-defined]
PASSAGES: sa.Table = ArchivalPassage.__table__  # type: ignore[attr-defined]
EMBEDDING_MODELS: sa.Table = EmbeddingModel.__table__  # type: ignore[attr-defined]
AGENT_NAMES: sa.Table = AgentName.__table__  # type: ignore[attr-defined]


# The tables of agents' data, parents before children (each foreign key finds its row
# written first; reversed, each delete finds no row still pointing at it).
DATA_TABLES: tuple[sa.Table, ...] = (
    AGENTS,
    EMBEDDING_MODELS,
    SESSIONS,
    MESSAGES,
    PASSAGES,
    *CHECKPOINT_TABLES,
    *STORE_TABLES,
)
# Every table of memorm's: the agents' names (kept by memorm beside the agents) and their
# data.  Each holds a tenant's rows (row-level security, scrubs) and one agent's (distribution).
TABLES: tuple[sa.Table, ...] = (AGENT_NAMES, *DATA_TABLES)

# Derived columns: the words full-text search indexes (``memorm.types.SearchWords``),
# computed from the text on every write.  Table columns, not model fields: callers
# never set or see them, reads never fetch them, and exports leave them out.
SEARCH_WORDS = "search_words"


def _search_words(source: str) -> sa.Column[str]:
    def default(context: Any) -> Any:  # inserts that do not give the words (ORM, hand-written Core)
        return context.get_current_parameters().get(source) or ""

    derived = {"derived_from": source}
    return sa.Column(SEARCH_WORDS, SearchWords(), nullable=False, default=default, info=derived)


MESSAGES.append_column(_search_words("content"))
PASSAGES.append_column(_search_words("text"))

_FIELDS = {
    table: tuple(column for column in table.c if "derived_from" not in column.info)
    for table in (AGENTS, SESSIONS, MESSAGES, PASSAGES, EMBEDDING_MODELS)
}


def fields(table: sa.Table) -> tuple[sa.Column[Any], ...]:
    """The columns of `table` its model holds: every column but derived ones, in order."""
    return _FIELDS.get(table) or tuple(table.c)


# The ORM wrapped each table's `__init__` in its own: `Row`'s, which makes its state on demand, again.
keep_fast_init(Row.__subclasses__())
