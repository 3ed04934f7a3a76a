"""The tables: Agent, Session, Message, ArchivalPassage, the graph state of sessions, the graph store.

One metadata object ([`metadata`][memorm.models.metadata], with a naming convention so constraint
names are stable across engines and migrations) serves SQLite and Postgres.
Every row carries `agent_id`, directly or through its session, so queries are
scoped to one agent and the schema can be sharded by agent.

Timestamps are set by the application in UTC, never by a server default, and
ids are UUIDv7 so they sort by creation.  Relationships are deliberately not
mapped: cascades live in the foreign keys, and no attribute access does hidden IO.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import instrumentation, registry
from sqlmodel import Field, SQLModel
from sqlmodel.main import SQLModelMetaclass

from memorm.ids import uuid7
from memorm.tenancy import DEFAULT_TENANT, TENANT_SETTING
from memorm.types import JSONType, SearchWords, UTCDateTime, UUIDType, VectorType, utcnow

_STATE = instrumentation.ClassManager.STATE_ATTR  # "_sa_instance_state"

__all__ = [
    "AGENTS",
    "AGENT_NAMES",
    "CHECKPOINTS",
    "CHECKPOINT_BLOBS",
    "CHECKPOINT_TABLES",
    "CHECKPOINT_WRITES",
    "EMBEDDING_MODELS",
    "MESSAGES",
    "PASSAGES",
    "ROLES",
    "SEARCH_WORDS",
    "SESSIONS",
    "STORE_ITEMS",
    "STORE_TABLES",
    "STORE_VECTORS",
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

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)
"""The SQLAlchemy `MetaData` of memorm's tables (alembic's `target_metadata`).

Its naming convention keeps constraint and index names stable across engines
and migrations.
"""


class MemormModel(SQLModel, registry=registry(metadata=metadata)):
    """Base of memorm's tables; subclass it to add tables to memorm's metadata."""

    if not TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any:
            # The ORM asks every new object for its state (`hasattr`) before it
            # has one; pydantic's `__getattr__` would look through its private
            # attributes and format an error first: a third of `Message()`.
            if name == _STATE:
                raise AttributeError(name)
            return super().__getattr__(name)


class CurrentTenant(sa.sql.functions.FunctionElement[str]):
    """The `tenant` column's server default: on Postgres the unit of work's tenant.

    That is the transaction-local setting `memorm.tenant` which row-level
    security checks too, so a raw `INSERT` through `uow.session` lands in the
    unit of work's tenant, and one with no tenant set fails (NOT NULL).  On
    SQLite, where nothing sets it, the default tenant.
    """

    type = sa.Text()
    name = "memorm_current_tenant"
    inherit_cache = True


@compiles(CurrentTenant, "postgresql")
def _current_tenant_postgres(element: CurrentTenant, compiler: Any, **kw: Any) -> str:
    return f"current_setting('{TENANT_SETTING}', true)"


@compiles(CurrentTenant)
def _current_tenant(element: CurrentTenant, compiler: Any, **kw: Any) -> str:
    return f"'{DEFAULT_TENANT}'"


def _factory(make: Callable[[], Any]) -> Callable[[], Any]:
    """A default factory whose signature pydantic need not work out.

    pydantic asks every factory's signature (does it take the validated
    data?) each time it builds a row: three `inspect.signature` calls, about
    a third of building a `Message`.  A precomputed `__signature__` answers
    at once.
    """

    def factory() -> Any:
        return make()

    factory.__signature__ = inspect.Signature()  # type: ignore[attr-defined]
    factory.__qualname__ = factory.__name__ = getattr(make, "__name__", "factory")
    factory.__wrapped__ = make  # type: ignore[attr-defined]  # what `_Row`'s constructor calls
    return factory


_NEW_ID = _factory(uuid7)
_NOW = _factory(utcnow)
_EMPTY = _factory(dict)


class _RowType(SQLModelMetaclass):
    """The metaclass of memorm's rows: `Message(...)` builds the row in one call.

    Calling a class runs its `__new__` (SQLModel's: pydantic's private slots)
    and then its `__init__`, each a Python frame taking the keyword arguments
    anew: about 40% of building a `Message`.  This `__call__` does both in
    one, what `_Row.__init__` does, unless the ORM has `init` listeners
    besides its own: those get the ORM's order, through `__init__`.
    """

    if not TYPE_CHECKING:  # to type checkers, calling a table is calling its `__init__`

        def __call__(cls, /, **data: Any) -> Any:
            plan = _PLANS.get(cls) or _plan(cls)
            manager = plan.manager
            if manager is not None:
                manager.mapper._check_configure()  # what the ORM's own `init` listener does
                if len(manager.dispatch.init) > 1:
                    return super().__call__(**data)
            made = _new_object(cls)
            _set_slot(made, "__pydantic_extra__", None)
            _set_slot(made, "__pydantic_private__", None)
            _fill(made, plan, data)
            return made


class _Row(MemormModel, metaclass=_RowType):
    """Columns every table has: its tenant, a UUIDv7 id, UTC timestamps and a JSON `meta` dict.

    The primary key is `(tenant, id)`: an id another tenant holds never
    conflicts, so creating a row never tells whether it exists elsewhere.
    """

    # The owner of the row, set by memorm from the unit of work (docs/tenancy.md).
    tenant: str = Field(
        default=DEFAULT_TENANT,
        primary_key=True,
        sa_type=sa.Text,
        # No client-side default: a raw INSERT that names no tenant gets the server's.
        sa_column_kwargs={"server_default": CurrentTenant(), "default": None},
    )
    id: uuid.UUID = Field(default_factory=_NEW_ID, primary_key=True, sa_type=UUIDType)
    created_at: datetime = Field(default_factory=_NOW, sa_type=UTCDateTime, nullable=False)
    updated_at: datetime = Field(default_factory=_NOW, sa_type=UTCDateTime, nullable=False)
    meta: dict[str, Any] = Field(default_factory=_EMPTY, sa_type=JSONType, nullable=False)

    def __init__(self, **data: Any) -> None:
        """A new row: the given fields, the rest from their defaults (no validation, as SQLModel tables).

        What SQLModel's constructor does for a table, without its per-field
        trips through pydantic's and the ORM's `__setattr__` (about 20 us
        each): the values go straight into the instance's `__dict__`, where
        the ORM reads a new object's values on insert.  Names that are not
        fields are ignored, as SQLModel ignores them.

        The ORM's state is made when the ORM first asks for it (`_LazyState`);
        the ORM's `init` event still reaches whoever listens for it.
        """
        plan = _PLANS.get(type(self)) or _plan(type(self))
        manager = plan.manager
        if manager is None:  # a subclass the ORM does not map: a plain object
            _fill(self, plan, data)
            return
        manager.mapper._check_configure()  # what the ORM's own `init` listener does
        if len(manager.dispatch.init) > 1:  # others listen too: the ORM's way, state first
            _init_with_events(self, manager, plan, data)
        else:
            _fill(self, plan, data)

    def __copy__(self) -> Any:
        """A shallow copy (`copy.copy`, `model_copy`); both objects' id then counts as given.

        Two objects share one id now, so neither is taken for a new row
        whose memorm-made id needs no check when stored
        (`memorm.repositories.id_claims.chose_id`).
        """
        made = super().__copy__()
        _id_shared(self, made)
        return made

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> Any:
        """A deep copy (`copy.deepcopy`, `model_copy(deep=True)`); its id counts as given, as `__copy__`'s."""
        made = super().__deepcopy__(memo)
        _id_shared(self, made)
        return made


def _id_shared(*rows: _Row) -> None:
    for row in rows:
        row.__pydantic_fields_set__.add("id")


class _LazyState:
    """Where the ORM finds a row object's state: made on the ORM's first ask.

    The ORM keeps each mapped object's `InstanceState` in its `__dict__`
    under `_sa_instance_state`, and makes it when the object is built.  It
    is five objects the garbage collector tracks, the most of any part of a
    row object, and the rows memorm returns rarely meet the ORM: a bulk
    append's thousands of `Message` objects made the collector run eight
    times as often as the raw driver's rows did.  A non-data descriptor
    answers instead, until the first ask stores the state in `__dict__`,
    where later asks find it without coming here.
    """

    def __get__(self, instance: object, owner: type[Any] | None = None) -> Any:
        manager = None if instance is None else _manager(type(instance))
        if manager is None:
            raise AttributeError(_STATE)
        state = manager._state_constructor(instance, manager)
        return instance.__dict__.setdefault(_STATE, state)  # a racing first ask: one state wins


type.__setattr__(_Row, _STATE, _LazyState())  # past pydantic, which would take it for a private attribute


def _agent_key(table: str) -> sa.ForeignKeyConstraint:
    """`(tenant, agent_id)` -> the agent, in the same tenant; deleting the agent deletes the row."""
    return sa.ForeignKeyConstraint(
        ["tenant", "agent_id"],
        ["agents.tenant", "agents.id"],
        name=f"fk_{table}_agent_id_agents",
        ondelete="CASCADE",
    )


# An agent: its identity, system prompt and core memory (label -> text).
class Agent(_Row, table=True):
    __tablename__ = "agents"

    # Unique per tenant: `agent_names` holds the names and enforces it.
    name: str = Field(sa_type=sa.Text, nullable=False)
    system: str = Field(default="", sa_type=sa.Text, nullable=False)
    core_memory: dict[str, str] = Field(default_factory=_EMPTY, sa_type=JSONType, nullable=False)
    llm_config: dict[str, Any] = Field(default_factory=_EMPTY, sa_type=JSONType, nullable=False)
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

    tenant: str = Field(
        default=DEFAULT_TENANT,
        primary_key=True,
        sa_type=sa.Text,
        sa_column_kwargs={"server_default": CurrentTenant(), "default": None},
    )
    name: str = Field(primary_key=True, sa_type=sa.Text)
    agent_id: uuid.UUID = Field(sa_type=UUIDType, nullable=False)


# The rows below belong to one agent, and their keys say so: the primary key is
# (tenant, id, agent_id), so a distributed database can shard them by agent.


_EXPIRING = sa.text("expires_at IS NOT NULL")


# A conversation of one agent; ``next_seq`` hands out its messages' sequence numbers.
class Session(_Row, table=True):
    __tablename__ = "sessions"
    __table_args__ = (
        _agent_key("sessions"),
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
class Message(_Row, table=True):
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
class ArchivalPassage(_Row, table=True):
    __tablename__ = "archival_passages"
    __table_args__ = (
        _agent_key("archival_passages"),
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
class EmbeddingModel(_Row, table=True):
    __tablename__ = "embedding_models"
    __table_args__ = (
        _agent_key("embedding_models"),
        sa.UniqueConstraint("tenant", "agent_id", "name"),
        sa.CheckConstraint("precision IN ('float32', 'float16')", name="precision"),
    )

    agent_id: uuid.UUID = Field(sa_type=UUIDType, primary_key=True)
    name: str = Field(sa_type=sa.Text, nullable=False)
    dim: int = Field(nullable=False)
    precision: str = Field(default="float32", sa_type=sa.String(8), nullable=False)


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
    tenant: str = Field(
        default=DEFAULT_TENANT,
        primary_key=True,
        sa_type=sa.Text,
        sa_column_kwargs={"server_default": CurrentTenant(), "default": None},
    )
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
    meta: dict[str, Any] = Field(default_factory=_EMPTY, sa_type=JSONType, nullable=False)
    created_at: datetime = Field(default_factory=_NOW, sa_type=UTCDateTime, nullable=False)
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

    tenant: str = Field(
        default=DEFAULT_TENANT,
        primary_key=True,
        sa_type=sa.Text,
        sa_column_kwargs={"server_default": CurrentTenant(), "default": None},
    )
    agent_id: uuid.UUID = Field(sa_type=UUIDType, primary_key=True)
    namespace: str = Field(sa_type=_NAMESPACE, primary_key=True)
    key: str = Field(sa_type=sa.Text, primary_key=True)


_STORE_EXPIRING = sa.text("expires_at IS NOT NULL")


# An item of an agent's long-term store: a JSON object under (namespace, key).
class GraphStoreItem(_StoreRow, table=True):
    __tablename__ = "graph_store_items"
    __table_args__ = (
        _agent_key("graph_store_items"),
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

    value: dict[str, Any] = Field(default_factory=_EMPTY, sa_type=JSONType, nullable=False)
    created_at: datetime = Field(default_factory=_NOW, sa_type=UTCDateTime, nullable=False)
    updated_at: datetime = Field(default_factory=_NOW, sa_type=UTCDateTime, nullable=False)
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


# The tables behind the models, typed for Core statements (``AGENTS.c.name``).
AGENTS: sa.Table = Agent.__table__  # type: ignore[attr-defined]
SESSIONS: sa.Table = Session.__table__  # type: ignore[attr-defined]
MESSAGES: sa.Table = Message.__table__  # type: ignore[attr-defined]
PASSAGES: sa.Table = ArchivalPassage.__table__  # type: ignore[attr-defined]
EMBEDDING_MODELS: sa.Table = EmbeddingModel.__table__  # type: ignore[attr-defined]
AGENT_NAMES: sa.Table = AgentName.__table__  # type: ignore[attr-defined]
CHECKPOINTS: sa.Table = GraphCheckpoint.__table__  # type: ignore[attr-defined]
CHECKPOINT_WRITES: sa.Table = GraphWrite.__table__  # type: ignore[attr-defined]
CHECKPOINT_BLOBS: sa.Table = GraphBlob.__table__  # type: ignore[attr-defined]
CHECKPOINT_TABLES: tuple[sa.Table, ...] = (CHECKPOINTS, CHECKPOINT_WRITES, CHECKPOINT_BLOBS)
STORE_ITEMS: sa.Table = GraphStoreItem.__table__  # type: ignore[attr-defined]
STORE_VECTORS: sa.Table = GraphStoreVector.__table__  # type: ignore[attr-defined]
STORE_TABLES: tuple[sa.Table, ...] = (STORE_ITEMS, STORE_VECTORS)  # parent first

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


M = TypeVar("M", bound=MemormModel)


def hydrate(model: type[M], values: dict[str, Any]) -> M:
    """A `model` instance holding `values`, built the way the ORM loads rows.

    About 30x cheaper than `model(**values)`, which runs every default
    factory and instrumented `setattr`; for rows memorm has already checked.
    What the ORM's `new_instance` and SQLModel's `__new__` would do, inlined:
    pydantic's three private slots and the values, written directly.

    `values` becomes the instance's `__dict__`: the caller hands it over and
    keeps no other use of it.  Memorm's rows (`_Row`) make their ORM state
    when the ORM asks (`_LazyState`); other tables get it here.
    """
    instance: M = _new_object(model)
    _set_slot(instance, "__dict__", values)
    _set_slot(instance, "__pydantic_fields_set__", set())
    _set_slot(instance, "__pydantic_extra__", None)
    _set_slot(instance, "__pydantic_private__", None)
    if not issubclass(model, _Row):
        manager = _manager(model)
        if manager is not None:
            values[_STATE] = manager._state_constructor(instance, manager)
    return instance


def hydrate_all(
    model: type[M], names: Sequence[str], rows: Iterable[Sequence[Any]], *, offset: int = 0
) -> list[M]:
    """`hydrate` of many rows: each row's values from `offset` on, in `names` order.

    One pass, without a call per row: a window's fifty messages are built
    in the time about thirty-five `hydrate` calls take.
    """
    if not issubclass(model, _Row):
        return [hydrate(model, dict(zip(names, row[offset:], strict=True))) for row in rows]
    new, put = _new_object, _set_slot
    made: list[M] = []
    for row in rows:
        instance = new(model)
        put(instance, "__dict__", dict(zip(names, row[offset:] if offset else row, strict=True)))
        put(instance, "__pydantic_fields_set__", set())
        put(instance, "__pydantic_extra__", None)
        put(instance, "__pydantic_private__", None)
        made.append(instance)
    return made


_MANAGERS: dict[type[Any], Any] = {}


def _manager(model: type[Any]) -> Any:
    """The ORM's `ClassManager` of `model` (None for a class it does not map), looked up once."""
    try:
        return _MANAGERS[model]
    except KeyError:
        found = _MANAGERS[model] = instrumentation.opt_manager_of_class(model)
        return found


@dataclass(frozen=True)
class _Plan:
    """How `_Row.__init__` fills a table's fields: defaults, names, and factories to call."""

    defaults: dict[str, Any]  # every field in order: its default (None where a factory makes it)
    names: frozenset[str]
    factories: tuple[tuple[str, Callable[[], Any]], ...]
    manager: Any  # the ORM's ClassManager; None for a subclass it does not map


_PLANS: dict[type[Any], _Plan] = {}


def _plan(model: type[MemormModel]) -> _Plan:
    """The `_Plan` of a table, made on its first construction."""
    if model.__pydantic_post_init__ or any(field.alias for field in model.model_fields.values()):
        raise TypeError(f"{model.__name__}: _Row's constructor supports no aliases or post-init hooks")
    defaults: dict[str, Any] = {}
    factories: list[tuple[str, Callable[[], Any]]] = []
    for name, field in model.model_fields.items():
        factory = cast("Callable[[], Any] | None", field.default_factory)  # memorm's take no data
        factory = getattr(factory, "__wrapped__", factory)  # `_factory`'s: the call itself
        default = None if factory is not None or field.is_required() else field.default
        if not isinstance(default, (str, int, float, bool, type(None))):
            raise TypeError(f"{model.__name__}.{name}: a mutable default needs a default_factory")
        defaults[name] = default
        if factory is not None:
            factories.append((name, factory))
    _PLANS[model] = found = _Plan(defaults, frozenset(defaults), tuple(factories), _manager(model))
    return found


def _fill(instance: _Row, plan: _Plan, data: dict[str, Any]) -> None:
    """Write a new row's fields: `data`'s, the rest from their defaults (see `_Row.__init__`)."""
    values = dict(plan.defaults)  # every field, in order: the defaults, None for factories
    if plan.names.issuperset(data):
        values.update(data)
        given = set(data)
    else:
        given = {name for name in data if name in plan.names}
        values.update((name, data[name]) for name in given)
    for name, factory in plan.factories:
        if name not in given:
            values[name] = factory()
    instance.__dict__.update(values)
    _set_slot(instance, "__pydantic_fields_set__", given)


def _init_with_events(instance: _Row, manager: Any, plan: _Plan, data: dict[str, Any]) -> None:
    """`_fill`, inside the ORM's `init` and `init_failure` events (what its own `__init__` does)."""
    state = manager._state_constructor(instance, manager)
    instance.__dict__[_STATE] = state
    manager.dispatch.init(state, (), data)  # a listener may change `data`, as the ORM allows
    try:
        _fill(instance, plan, data)
    except BaseException:
        with sa.util.safe_reraise():
            manager.dispatch.init_failure(state, (), data)


_new_object = object.__new__
_set_slot = object.__setattr__

# The ORM wrapped each table's `__init__` in its own, which makes the state
# first; `_Row.__init__` does the same work with the state made on demand.
for _model in _Row.__subclasses__():
    type.__setattr__(_model, "__init__", _Row.__init__)


# The full-text indexes' DDL joins the metadata's create_all (it needs the tables above).
from memorm import rls as _rls  # noqa: E402, F401  (row-level security, Postgres)
from memorm.search import fts_ddl as _fts_ddl  # noqa: E402, F401
