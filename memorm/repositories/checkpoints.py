"""`uow.checkpoints`: the graph state of an agent's sessions (checkpoints, pending writes, channel values).

The rows a graph framework saves after every step (`memorm.compat.langgraph`
for LangGraph): memorm stores them and finds them, and leaves their values
opaque, bytes with the name of their format.  Every call names the agent,
and every session-scoped call the session, so it stays on one shard of a
distributed database.
"""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import cache
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql import ColumnElement

from memorm.driver import Insert, fetch, insert_many, insert_rows
from memorm.errors import ValidationError
from memorm.models import CHECKPOINT_BLOBS, CHECKPOINT_TABLES, CHECKPOINT_WRITES, CHECKPOINTS, SESSIONS
from memorm.repositories.base import Repository
from memorm.search.filters import json_key_conditions
from memorm.translate import check_writable, guarded
from memorm.types import UUIDType, utcnow
from memorm.types.json import json_pairs
from memorm.validation import MAX_PAGE, as_uuid, check_int, check_json_object, check_name, check_text

__all__ = [
    "MAX_STATE_KEY_BYTES",
    "CheckpointKey",
    "CheckpointRepository",
    "FoundCheckpoint",
    "StoredCheckpoint",
    "StoredWrite",
    "check_state_key",
]

MAX_STATE_KEY_BYTES = 512
"""The longest text, in UTF-8 bytes, of a graph-state key: a namespace, checkpoint id, task id,
channel or version.  A row's key holds three of them beside its tenant (up to 512 bytes) and two
UUIDs: 2,100 bytes at most, within the 2,704 a Postgres btree entry may take (SQLite has no limit,
so without this one a database of longer keys could not move to Postgres)."""


def check_state_key(value: object, field: str) -> str:
    """A graph-state key: text without NUL (which Postgres cannot store), of `MAX_STATE_KEY_BYTES` at most.

    Raises:
        ValidationError: not a string, a NUL or lone surrogate in it, or too long.
    """
    text = check_text(value, field) or ""
    if len(text) * 4 > MAX_STATE_KEY_BYTES and len(text.encode()) > MAX_STATE_KEY_BYTES:
        raise ValidationError(
            f"{field}: {len(text.encode()):,} bytes, more than the {MAX_STATE_KEY_BYTES} a graph-state "
            "key may have"
        )
    return text


Value = tuple[str, bytes | None]
"""A stored value: the name of its format and its bytes (None for a channel with no value)."""


class CheckpointKey(NamedTuple):
    """Where a checkpoint is: its session, (sub)graph namespace and id."""

    session_id: uuid.UUID
    checkpoint_ns: str
    checkpoint_id: str


class StoredCheckpoint(NamedTuple):
    """A checkpoint as stored: its key, parent, serialized value and metadata, and its session's key.

    `versions`: the versions of the channels it holds (channel -> version),
    written with it so one statement finds their values (`find`).
    """

    key: CheckpointKey
    parent_checkpoint_id: str | None
    value: Value
    meta: dict[str, Any]
    session_key: str | None = None
    versions: dict[str, str] | None = None


class FoundCheckpoint(NamedTuple):
    """What `find` returns: a checkpoint, its pending writes, and its channels' stored values.

    `values` maps `(channel, version)` to the value; None for a checkpoint
    stored without its `versions` (before revision 0014): `blobs` reads them.
    """

    checkpoint: StoredCheckpoint
    writes: list[StoredWrite]
    values: dict[tuple[str, str], Value] | None


class StoredWrite(NamedTuple):
    """A pending write as stored."""

    task_id: str
    channel: str
    value: Value
    task_path: str
    idx: int


_CHECKPOINT_COLUMNS = (
    "tenant",
    "agent_id",
    "session_id",
    "checkpoint_ns",
    "checkpoint_id",
    "parent_checkpoint_id",
    "value_type",
    "value",
    "meta",
    "created_at",
    "channel_versions",
)
_WRITE_COLUMNS = (
    "tenant",
    "agent_id",
    "session_id",
    "checkpoint_ns",
    "checkpoint_id",
    "task_id",
    "idx",
    "task_path",
    "channel",
    "value_type",
    "value",
)
_BLOB_COLUMNS = (
    "tenant",
    "agent_id",
    "session_id",
    "checkpoint_ns",
    "channel",
    "version",
    "value_type",
    "value",
)
_KEY = (CHECKPOINTS.c.session_id, CHECKPOINTS.c.checkpoint_ns, CHECKPOINTS.c.checkpoint_id)
_LISTED = (*_KEY, CHECKPOINTS.c.parent_checkpoint_id, CHECKPOINTS.c.value_type, CHECKPOINTS.c.value)
_NEWEST_FIRST = tuple(column.desc() for column in (CHECKPOINTS.c.checkpoint_id, *_KEY[:2]))


_IN_SESSION = sa.and_(
    SESSIONS.c.tenant == CHECKPOINTS.c.tenant,
    SESSIONS.c.id == CHECKPOINTS.c.session_id,
    SESSIONS.c.agent_id == CHECKPOINTS.c.agent_id,
)


def _bound(table: sa.Table, *names: str) -> list[ColumnElement[bool]]:
    """`column = :parameter` for these columns of `table` (parameters named as in `_PARAMETER`)."""
    return [table.c[name] == sa.bindparam(_PARAMETER.get(name, name)) for name in names]


_PARAMETER = {"agent_id": "agent", "checkpoint_ns": "ns"}
_SCOPE = ("tenant", "agent_id", "session_id", "checkpoint_ns")  # a session's namespace

# The hot reads (a graph's `aget_tuple`), built once and sent to the driver (`memorm.driver.fetch`).
# The session of a key, then its checkpoints by their primary key: the session is a scalar
# subquery, so no plan joins every checkpoint of the agent to the sessions to find its key.
_SESSION_OF_KEY = sa.select(SESSIONS.c.id).where(*_bound(SESSIONS, "tenant", "agent_id", "key"))
_THREAD = sa.select(*_LISTED, CHECKPOINTS.c.meta, sa.bindparam("key", type_=sa.Text).label("key")).where(
    *_bound(CHECKPOINTS, "tenant", "agent_id", "checkpoint_ns"),
    CHECKPOINTS.c.session_id == _SESSION_OF_KEY.scalar_subquery(),
)


def _with_state(found: sa.Select[Any], *, lateral: bool) -> sa.CompoundSelect[Any]:
    """`found` (one checkpoint at most) with its pending writes and its channels' values.

    Rows of two parts: `w`, the checkpoint with one of its writes (in order),
    or with none; `b`, one value of a channel at the version the checkpoint
    holds, found through its `channel_versions` (`json_pairs`).  `unknown`: the checkpoint
    has no `channel_versions` (stored before revision 0014).

    `lateral` (Postgres): the writes are a lateral subquery on the
    checkpoint's own key, so they are found by the primary key whatever the
    planner thinks of the tables' sizes (a join planned on a fresh table's
    statistics read every write of the agent).  SQLite's nested loops look
    them up by key anyway.
    """
    versions = CHECKPOINTS.c.channel_versions
    checkpoint = found.add_columns(versions, versions.is_(None).label("unknown")).cte("found")
    shown = [checkpoint.c[column.name] for column in found.selected_columns]
    writes, blobs = CHECKPOINT_WRITES, CHECKPOINT_BLOBS

    def scoped(table: sa.Table, *more: ColumnElement[bool]) -> ColumnElement[bool]:
        """`table`'s rows in the checkpoint's namespace, and `more`."""
        same = (table.c[name] == checkpoint.c[name] for name in ("session_id", "checkpoint_ns"))
        return sa.and_(*_bound(table, "tenant", "agent_id"), *same, *more)

    write_columns = (
        writes.c.task_id,
        writes.c.channel,
        writes.c.value_type.label("write_type"),
        writes.c.value.label("write_value"),
        writes.c.task_path,
        writes.c.idx,
    )
    its_writes = scoped(writes, writes.c.checkpoint_id == checkpoint.c.checkpoint_id)
    head = (*shown, checkpoint.c.unknown, sa.literal("w").label("part"))
    if lateral:
        # OFFSET 0: kept a subquery (not pulled up into a join the planner may scan the agent for).
        theirs = sa.select(*write_columns).where(its_writes).offset(0).lateral("w")
        with_writes = sa.select(*head, *theirs.c).select_from(checkpoint.outerjoin(theirs, sa.true()))
    else:
        with_writes = sa.select(*head, *write_columns).select_from(checkpoint.outerjoin(writes, its_writes))
    # Each (channel, version) the checkpoint holds, its value looked up by the full primary key
    # (scalar subqueries: no planner starts from the agent's blobs); NULL if none is stored.
    pairs = json_pairs(checkpoint.c.channel_versions).table_valued("key", "value")
    at_version = scoped(blobs, blobs.c.channel == pairs.c.key, blobs.c.version == pairs.c.value)
    kind, value = (
        sa.select(column).where(at_version).scalar_subquery()
        for column in (blobs.c.value_type, blobs.c.value)
    )
    blanks = (sa.null() for _ in range(len(head) - 1))
    with_values = sa.select(
        *blanks, sa.literal("b"), pairs.c.key, pairs.c.value, kind, value, sa.null(), sa.null()
    ).select_from(checkpoint.join(pairs, sa.true()))
    both: sa.CompoundSelect[Any] = sa.union_all(with_writes, with_values)
    order = both.selected_columns
    return both.order_by(order.part.desc(), order.task_path, order.task_id, order.idx)


def _reads(*, lateral: bool) -> tuple[sa.CompoundSelect[Any], ...]:
    """A thread's newest checkpoint, and the one of an id, each with its writes and values."""
    latest = _THREAD.order_by(CHECKPOINTS.c.checkpoint_id.desc()).limit(1)
    by_id = _THREAD.where(CHECKPOINTS.c.checkpoint_id == sa.bindparam("checkpoint_id"))
    return _with_state(latest, lateral=lateral), _with_state(by_id, lateral=lateral)


# Postgres's writes are a lateral subquery; SQLite has no LATERAL (its nested loops need none).
_READS = {True: _reads(lateral=False), False: _reads(lateral=True)}  # by whether the link is SQLite
_WRITES_OF = (  # one checkpoint's pending writes, in order
    sa.select(
        CHECKPOINT_WRITES.c.task_id,
        CHECKPOINT_WRITES.c.channel,
        CHECKPOINT_WRITES.c.value_type,
        CHECKPOINT_WRITES.c.value,
        CHECKPOINT_WRITES.c.task_path,
        CHECKPOINT_WRITES.c.idx,
    )
    .where(*_bound(CHECKPOINT_WRITES, *_SCOPE, "checkpoint_id"))
    .order_by(CHECKPOINT_WRITES.c.task_path, CHECKPOINT_WRITES.c.task_id, CHECKPOINT_WRITES.c.idx)
)


_PAIRS = 32  # (channel, version)s asked for per statement at most


@cache
def _blobs_of(size: int) -> sa.Select[Any]:
    """`size` values of one session's namespace by `(channel, version)`: built once per size.

    Sizes are powers of two up to `_PAIRS` (the last pair repeats to fill
    one), so a handful of statements serve every graph.
    """
    table = CHECKPOINT_BLOBS
    pairs = [
        sa.tuple_(sa.bindparam(f"channel_{i}", type_=sa.Text), sa.bindparam(f"version_{i}", type_=sa.Text))
        for i in range(size)
    ]
    return sa.select(table.c.channel, table.c.version, table.c.value_type, table.c.value).where(
        *_bound(table, *_SCOPE), sa.tuple_(table.c.channel, table.c.version).in_(pairs)
    )


def _padded(keys: Sequence[tuple[Any, ...]], names: tuple[str, ...]) -> Iterator[tuple[int, dict[str, Any]]]:
    """`keys` at most `_PAIRS` at a time, as `(size, values)` for `_blobs_of(size)` or `_writes_of(size)`.

    `size` is a power of two (the chunk's last key repeats to fill it), and
    `values` names each key's parts `{name}_{index}` in the order of `names`.
    """
    for start in range(0, len(keys), _PAIRS):
        chunk = keys[start : start + _PAIRS]
        size = 1 << (len(chunk) - 1).bit_length()
        values: dict[str, Any] = {}
        for index in range(size):
            for name, part in zip(names, chunk[min(index, len(chunk) - 1)], strict=True):
                values[f"{name}_{index}"] = part
        yield size, values


@cache
def _writes_of(size: int) -> sa.Select[Any]:
    """The pending writes of `size` checkpoints of an agent, by key: built once per size.

    Sizes are powers of two up to `_PAIRS` (the last key repeats to fill
    one), as `_blobs_of`'s.  Rows come with their checkpoint's key, each
    checkpoint's in order of `(task_path, task_id, idx)`.
    """
    table = CHECKPOINT_WRITES
    key = (table.c.session_id, table.c.checkpoint_ns, table.c.checkpoint_id)
    keys = [
        sa.tuple_(
            sa.bindparam(f"session_{i}", type_=table.c.session_id.type),
            sa.bindparam(f"ns_{i}", type_=sa.Text),
            sa.bindparam(f"checkpoint_{i}", type_=sa.Text),
        )
        for i in range(size)
    ]
    return (
        sa.select(*key, table.c.task_id, table.c.channel, table.c.value_type, table.c.value)
        .add_columns(table.c.task_path, table.c.idx)
        .where(*_bound(table, "tenant", "agent_id"), sa.tuple_(*key).in_(keys))
        .order_by(table.c.task_path, table.c.task_id, table.c.idx)
    )


_AFTER = (CHECKPOINTS.c.checkpoint_id, CHECKPOINTS.c.session_id, CHECKPOINTS.c.checkpoint_ns)


@cache
def _listing(
    session: bool, key: bool, ns: bool, checkpoint: bool, before: bool, after: bool
) -> sa.Select[Any]:
    """`CheckpointRepository.list` without a metadata filter: built once per set of conditions.

    Parameters: tenant, agent and `:limit`; `:session_id`, `:key` (the
    session's), `:ns`, `:checkpoint_id`, `:before` and the `after_*` cursor
    for the conditions asked for.
    """
    where: list[ColumnElement[bool]] = _bound(CHECKPOINTS, "tenant", "agent_id")
    if session:
        where += _bound(CHECKPOINTS, "session_id")
    if key:
        where += _bound(SESSIONS, "key")
    if ns:
        where += _bound(CHECKPOINTS, "checkpoint_ns")
    if checkpoint:
        where += _bound(CHECKPOINTS, "checkpoint_id")
    if before:
        where.append(CHECKPOINTS.c.checkpoint_id < sa.bindparam("before", type_=sa.Text))
    if after:
        cursor = [sa.bindparam(f"after_{column.name}", type_=column.type) for column in _AFTER]
        where.append(sa.tuple_(*_AFTER) < sa.tuple_(*cursor))
    return (
        sa.select(*_LISTED, CHECKPOINTS.c.meta, SESSIONS.c.key)
        .join(SESSIONS, _IN_SESSION)
        .where(*where)
        .order_by(*_NEWEST_FIRST)
        .limit(sa.bindparam("limit", type_=sa.Integer))
    )


def _put_in_one() -> Any:
    """A checkpoint and its new channel values in one statement (Postgres; see `CheckpointRepository.put`).

    The values come as arrays, one per column, unnested into an insert that
    keeps a value stored already; the checkpoint's own upsert follows it.
    """

    def scalar(table: sa.Table, name: str) -> Any:
        return sa.bindparam(name, type_=table.c[name].type)

    arrays = [
        sa.bindparam(f"{name}s", type_=postgresql.ARRAY(CHECKPOINT_BLOBS.c[name].type))
        for name in ("channel", "version", "value_type", "value")
    ]
    new = sa.func.unnest(*arrays).table_valued("channel", "version", "value_type", "value").render_derived()
    blobs = (
        postgresql.insert(CHECKPOINT_BLOBS)
        .from_select(
            list(_BLOB_COLUMNS),
            sa.select(*(scalar(CHECKPOINT_BLOBS, name) for name in _SCOPE), *new.c),
        )
        .on_conflict_do_nothing()
        .cte("new_blobs")
    )
    checkpoint = postgresql.insert(CHECKPOINTS).values(
        {name: scalar(CHECKPOINTS, name) for name in _CHECKPOINT_COLUMNS}
    )
    key = [column.name for column in CHECKPOINTS.primary_key.columns]
    replaced = {name: checkpoint.excluded[name] for name in _CHECKPOINT_COLUMNS if name not in key}
    return checkpoint.on_conflict_do_update(index_elements=key, set_=replaced).add_cte(blobs)


_PUT_IN_ONE = _put_in_one()


def _checked_key(key: CheckpointKey) -> CheckpointKey:
    check_state_key(key.checkpoint_ns, "checkpoint_ns")
    check_state_key(key.checkpoint_id, "checkpoint_id")
    return key


def _stored(row: Any) -> StoredCheckpoint:
    session, ns, checkpoint, parent, kind, value, meta, key = row
    return StoredCheckpoint(CheckpointKey(session, ns, checkpoint), parent, (kind, value), meta, key)


class CheckpointRepository(Repository):
    """Checkpoints, pending writes and channel values of an agent's sessions (a graph's threads)."""

    def _agent(self, table: sa.Table, agent_id: uuid.UUID | str) -> list[ColumnElement[bool]]:
        return [*self._own(table), table.c.agent_id == as_uuid(agent_id, "agent_id")]

    def _session(
        self, table: sa.Table, agent_id: uuid.UUID | str, session_id: uuid.UUID | str
    ) -> list[ColumnElement[bool]]:
        return [*self._agent(table, agent_id), table.c.session_id == as_uuid(session_id, "session_id")]

    async def put(
        self,
        agent_id: uuid.UUID | str,
        checkpoint: StoredCheckpoint,
        blobs: Mapping[tuple[str, str], Value],
    ) -> None:
        """Store a checkpoint (replacing one under its key) and channel values new with it.

        `blobs` maps `(channel, version)` to its value; a value already stored
        for that version of the channel is kept.
        """
        owner, agent = self._owner, as_uuid(agent_id, "agent_id")
        session, ns, checkpoint_id = _checked_key(checkpoint.key)
        if checkpoint.parent_checkpoint_id is not None:
            check_state_key(checkpoint.parent_checkpoint_id, "parent_checkpoint_id")
        for channel, version in blobs:
            check_state_key(channel, "channel")
            check_state_key(version, f"channel {channel!r}: version")
        rows = [
            (owner, agent, session, ns, channel, version, kind, value)
            for (channel, version), (kind, value) in blobs.items()
        ]
        kind, value = checkpoint.value
        meta = check_json_object(checkpoint.meta, "metadata")
        row = (owner, agent, session, ns, checkpoint_id, checkpoint.parent_checkpoint_id, kind, value, meta)
        versions = checkpoint.versions
        if self._one_server_postgres:
            # One statement, one round trip (a graph step's; alone, it needs no BEGIN/COMMIT).
            # On Citus the two inserts stay apart: each routes to the session's shard.
            params: dict[str, Any] = dict(zip(_CHECKPOINT_COLUMNS, (*row, utcnow(), versions), strict=True))
            columns = list(zip(*blobs, strict=True)) or [(), ()]
            values = list(zip(*blobs.values(), strict=True)) or [(), ()]
            params.update(channels=columns[0], versions=columns[1], value_types=values[0], values=values[1])
            check_writable(self.link)
            async with guarded(self.link):
                await fetch(self.link, _PUT_IN_ONE, params)
            return
        await insert_many(
            self.link,
            [
                Insert(CHECKPOINT_BLOBS, _BLOB_COLUMNS, rows, "ignore"),
                Insert(CHECKPOINTS, _CHECKPOINT_COLUMNS, [(*row, utcnow(), versions)], "update"),
            ],
        )

    async def put_writes(
        self,
        agent_id: uuid.UUID | str,
        key: CheckpointKey,
        writes: Sequence[StoredWrite],
        *,
        replace: bool,
    ) -> None:
        """Store a task's writes after the checkpoint at `key`.

        A write whose `(task_id, idx)` is stored already replaces it when
        `replace`, else is dropped (a retried task writes the same again).
        """
        owner, agent = self._owner, as_uuid(agent_id, "agent_id")
        _checked_key(key)
        for write in writes:
            check_state_key(write.task_id, "task_id")
            check_text(write.task_path, "task_path")
            check_state_key(write.channel, "channel")
        rows = [
            (owner, agent, *key, w.task_id, w.idx, w.task_path, w.channel, w.value[0], w.value[1])
            for w in writes
        ]
        await insert_rows(
            self.link, CHECKPOINT_WRITES, _WRITE_COLUMNS, rows, on_conflict="update" if replace else "ignore"
        )

    async def list(
        self,
        agent_id: uuid.UUID | str,
        session_id: uuid.UUID | str | None = None,
        *,
        session_key: str | None = None,
        checkpoint_ns: str | None = None,
        checkpoint_id: str | None = None,
        meta: Mapping[str, Any] | None = None,
        before: str | None = None,
        after: CheckpointKey | None = None,
        limit: int = 100,
    ) -> builtins.list[StoredCheckpoint]:
        """The agent's checkpoints, newest first (by `checkpoint_id`), `limit` at most.

        Narrowed to a session (by id, or by its `session_key`: a LangGraph
        thread id), a namespace, one id, those whose metadata holds every
        key of `meta`, and those before the id `before`.  `after` is the
        last checkpoint of the previous page: the page starts after it.
        """
        size = check_int(limit, "limit", minimum=1, maximum=MAX_PAGE)
        agent = as_uuid(agent_id, "agent_id")
        params: dict[str, Any] = {"tenant": self._owner, "agent": agent, "limit": size}
        if session_id is not None:
            params["session_id"] = as_uuid(session_id, "session_id")
        if session_key is not None:
            params["key"] = check_name(session_key, "session_key", blank=True)
        if checkpoint_ns is not None:
            params["ns"] = checkpoint_ns
        if checkpoint_id is not None:
            params["checkpoint_id"] = checkpoint_id
        if before is not None:
            params["before"] = before
        if after is not None:
            params.update(
                after_checkpoint_id=after.checkpoint_id,
                after_session_id=after.session_id,
                after_checkpoint_ns=after.checkpoint_ns,
            )
        query = _listing(
            session_id is not None,
            session_key is not None,
            checkpoint_ns is not None,
            checkpoint_id is not None,
            before is not None,
            after is not None,
        )
        if meta:  # a filter's conditions vary with its keys and values: built for this call
            conditions = json_key_conditions(self.link, CHECKPOINTS.c.meta, meta, "filter")
            return [_stored(row) for row in await self._execute(query.where(*conditions), params)]
        async with guarded(self.link):
            return [_stored(row) for row in await fetch(self.link, query, params)]

    async def find(
        self, agent_id: uuid.UUID | str, session_key: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> FoundCheckpoint | None:
        """The checkpoint of the agent's session with this key (newest without an id), writes and values.

        None if there is none.  One statement: the session is found by its
        key in it, and the writes and the channels' values come along.
        """
        key = check_name(session_key, "session_key", blank=True)
        params = {
            "tenant": self._owner,
            "agent": as_uuid(agent_id, "agent_id"),
            "key": key,
            "ns": checkpoint_ns,
        }
        latest, by_id = _READS[self.link.sqlite]
        if checkpoint_id is None:
            rows = await fetch(self.link, latest, params)
        else:
            rows = await fetch(self.link, by_id, {**params, "checkpoint_id": checkpoint_id})
        if not rows:
            return None
        writes, values = [], {}
        for row in rows:
            part, first, second, kind, value, path, idx = row[9:]
            if part == "b":
                if kind is not None:  # (a version whose value is not stored has none)
                    values[first, second] = (kind, value)
            elif first is not None:
                writes.append(StoredWrite(first, second, (kind, value), path, idx))
        unknown = rows[0][8]
        return FoundCheckpoint(_stored(rows[0][:8]), writes, None if unknown else values)

    async def heads(
        self, agent_id: uuid.UUID | str, session_id: uuid.UUID | str
    ) -> builtins.list[StoredCheckpoint]:
        """The newest checkpoint of each namespace of a session."""
        where = self._session(CHECKPOINTS, agent_id, session_id)
        newest = (
            sa.select(CHECKPOINTS.c.checkpoint_ns, sa.func.max(CHECKPOINTS.c.checkpoint_id).label("newest"))
            .where(*where)
            .group_by(CHECKPOINTS.c.checkpoint_ns)
            .subquery()
        )
        query = (
            sa.select(*_LISTED, CHECKPOINTS.c.meta, SESSIONS.c.key)
            .join(SESSIONS, _IN_SESSION)
            .join(
                newest,
                sa.and_(
                    newest.c.checkpoint_ns == CHECKPOINTS.c.checkpoint_ns,
                    newest.c.newest == CHECKPOINTS.c.checkpoint_id,
                ),
            )
            .where(*where)
        )
        return [_stored(row) for row in await self._execute(query)]

    async def blobs(
        self,
        agent_id: uuid.UUID | str,
        session_id: uuid.UUID,
        checkpoint_ns: str,
        wanted: Iterable[tuple[str, str]],
    ) -> dict[tuple[str, str], Value]:
        """The stored values of these `(channel, version)`s of a session's namespace (if stored)."""
        pairs = sorted(set(wanted))
        params: dict[str, Any] = {"tenant": self._owner, "agent": as_uuid(agent_id, "agent_id")}
        params.update(session_id=session_id, ns=checkpoint_ns)
        found: dict[tuple[str, str], Value] = {}
        for size, named in _padded(pairs, ("channel", "version")):
            for channel, version, kind, value in await fetch(self.link, _blobs_of(size), {**params, **named}):
                found[channel, version] = (kind, value)
        return found

    async def writes(
        self, agent_id: uuid.UUID | str, keys: Iterable[CheckpointKey]
    ) -> dict[CheckpointKey, builtins.list[StoredWrite]]:
        """The pending writes of these checkpoints, each's in order of `(task_path, task_id, idx)`."""
        wanted = sorted(set(keys))
        found: dict[CheckpointKey, builtins.list[StoredWrite]] = {key: [] for key in wanted}
        if not wanted:
            return found
        if len(wanted) == 1:  # a graph's aget_tuple: the statement built once
            (session, ns, checkpoint), agent = wanted[0], as_uuid(agent_id, "agent_id")
            params = {"tenant": self._owner, "agent": agent, "session_id": session, "ns": ns}
            written = await fetch(self.link, _WRITES_OF, {**params, "checkpoint_id": checkpoint})
            found[wanted[0]] = [
                StoredWrite(task, channel, (kind, value), path, idx)
                for task, channel, kind, value, path, idx in written
            ]
            return found
        params = {"tenant": self._owner, "agent": as_uuid(agent_id, "agent_id")}
        for size, named in _padded(wanted, ("session", "ns", "checkpoint")):
            async with guarded(self.link):
                rows = await fetch(self.link, _writes_of(size), {**params, **named})
            for session, ns, checkpoint, task, channel, kind, value, path, idx in rows:
                found[CheckpointKey(session, ns, checkpoint)].append(
                    StoredWrite(task, channel, (kind, value), path, idx)
                )
        return found

    async def delete_session(self, agent_id: uuid.UUID | str, session_id: uuid.UUID | str) -> None:
        """Delete a session's graph state (the session and its messages stay)."""
        for table in CHECKPOINT_TABLES:
            await self._execute(sa.delete(table).where(*self._session(table, agent_id, session_id)))

    async def delete_runs(self, agent_id: uuid.UUID | str, run_ids: Sequence[str]) -> int:
        """Delete the agent's checkpoints whose metadata names one of `run_ids`, with their writes."""
        runs = sorted(set(run_ids))
        if not runs:
            return 0
        matching = sa.or_(
            *(
                sa.and_(*json_key_conditions(self.link, CHECKPOINTS.c.meta, {"run_id": r}, "run_ids"))
                for r in runs
            )
        )
        found: builtins.list[Any] = list(
            await self._execute(sa.select(*_KEY).where(*self._agent(CHECKPOINTS, agent_id), matching))
        )
        doomed = [CheckpointKey(row[0], row[1], row[2]) for row in found]
        await self._delete_checkpoints(agent_id, doomed)
        return len(doomed)

    async def _delete_checkpoints(self, agent_id: uuid.UUID | str, keys: Sequence[CheckpointKey]) -> None:
        for start in range(0, len(keys), MAX_PAGE):
            batch = keys[start : start + MAX_PAGE]
            for table in (CHECKPOINT_WRITES, CHECKPOINTS):
                key = (table.c.session_id, table.c.checkpoint_ns, table.c.checkpoint_id)
                await self._rowcount(
                    sa.delete(table).where(*self._agent(table, agent_id), sa.tuple_(*key).in_(batch))
                )

    async def copy_session(
        self, agent_id: uuid.UUID | str, source: uuid.UUID | str, target: uuid.UUID | str
    ) -> None:
        """Copy a session's graph state into another session of the agent (rows it has are kept)."""
        into = sa.literal(as_uuid(target, "target"), UUIDType())
        for table in CHECKPOINT_TABLES:
            there = table.alias("there")
            key = [column.name for column in table.primary_key.columns if column.name != "session_id"]
            taken = sa.exists().where(
                there.c.session_id == into, *(there.c[name] == table.c[name] for name in key)
            )
            names = [column.name for column in table.c]
            rows = sa.select(*(into if name == "session_id" else table.c[name] for name in names)).where(
                *self._session(table, agent_id, source), ~taken
            )
            await self._execute(sa.insert(table).from_select(names, rows))

    async def prune(
        self,
        agent_id: uuid.UUID | str,
        session_id: uuid.UUID | str,
        keep: Mapping[str, tuple[str, Iterable[tuple[str, str]]]],
    ) -> None:
        """Delete a session's checkpoints but those in `keep`, with their writes and unused values.

        `keep` maps each namespace to the checkpoint kept in it and the
        `(channel, version)`s that checkpoint holds; a namespace left out
        loses everything.  Kept checkpoints lose their parent.
        """
        in_session = self._session(CHECKPOINTS, agent_id, session_id)
        kept = sorted((ns, checkpoint) for ns, (checkpoint, _) in keep.items())
        for table in (CHECKPOINT_WRITES, CHECKPOINTS):
            pair = sa.tuple_(table.c.checkpoint_ns, table.c.checkpoint_id)
            where = self._session(table, agent_id, session_id)
            await self._rowcount(sa.delete(table).where(*where, *([pair.not_in(kept)] if kept else [])))
        if kept:
            await self._rowcount(sa.update(CHECKPOINTS).where(*in_session).values(parent_checkpoint_id=None))
        values = sorted((ns, channel, version) for ns, (_, held) in keep.items() for channel, version in held)
        blob = (CHECKPOINT_BLOBS.c.checkpoint_ns, CHECKPOINT_BLOBS.c.channel, CHECKPOINT_BLOBS.c.version)
        unused = [sa.tuple_(*blob).not_in(values)] if values else []
        await self._rowcount(
            sa.delete(CHECKPOINT_BLOBS).where(*self._session(CHECKPOINT_BLOBS, agent_id, session_id), *unused)
        )
