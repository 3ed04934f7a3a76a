"""The statements `uow.checkpoints` reads with, built once: a thread's checkpoint, writes, values, listings.

The hot reads (a graph's `aget_tuple`) are sent straight to the driver
(`memorm.driver.fetch`); where Postgres and SQLite need different SQL,
`thread_reads` picks the statement for the connection.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql import ColumnElement

from memorm.link import Link
from memorm.models import CHECKPOINT_BLOBS, CHECKPOINT_WRITES, CHECKPOINTS, SESSIONS
from memorm.types.json import json_pairs

__all__ = [
    "IN_SESSION",
    "KEY_COLUMNS",
    "LISTED",
    "SCOPE",
    "WRITES_OF",
    "blobs_of",
    "listing",
    "padded",
    "thread_reads",
    "writes_of",
]

KEY_COLUMNS = (CHECKPOINTS.c.session_id, CHECKPOINTS.c.checkpoint_ns, CHECKPOINTS.c.checkpoint_id)
LISTED = (*KEY_COLUMNS, CHECKPOINTS.c.parent_checkpoint_id, CHECKPOINTS.c.value_type, CHECKPOINTS.c.value)
_NEWEST_FIRST = tuple(column.desc() for column in (CHECKPOINTS.c.checkpoint_id, *KEY_COLUMNS[:2]))


IN_SESSION = sa.and_(
    SESSIONS.c.tenant == CHECKPOINTS.c.tenant,
    SESSIONS.c.id == CHECKPOINTS.c.session_id,
    SESSIONS.c.agent_id == CHECKPOINTS.c.agent_id,
)


def _bound(table: sa.Table, *names: str) -> list[ColumnElement[bool]]:
    """`column = :parameter` for these columns of `table` (parameters named as in `_PARAMETER`)."""
    return [table.c[name] == sa.bindparam(_PARAMETER.get(name, name)) for name in names]


_PARAMETER = {"agent_id": "agent", "checkpoint_ns": "ns"}
SCOPE = ("tenant", "agent_id", "session_id", "checkpoint_ns")  # a session's namespace

# The hot reads (a graph's `aget_tuple`), built once and sent to the driver (`memorm.driver.fetch`).
# The session of a key, then its checkpoints by their primary key: the session is a scalar
# subquery, so no plan joins every checkpoint of the agent to the sessions to find its key.
_SESSION_OF_KEY = sa.select(SESSIONS.c.id).where(*_bound(SESSIONS, "tenant", "agent_id", "key"))
_THREAD = sa.select(*LISTED, CHECKPOINTS.c.meta, sa.bindparam("key", type_=sa.Text).label("key")).where(
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
_POSTGRES_READS = _reads(lateral=True)
_SQLITE_READS = _reads(lateral=False)


def thread_reads(link: Link) -> tuple[sa.CompoundSelect[Any], ...]:
    """The statements `find` runs on `link`'s database: a thread's newest checkpoint, and the one of an id.

    Parameters: tenant, agent, the session's `:key` and `:ns` (and
    `:checkpoint_id` for the second).  Rows as `_with_state` describes.
    """
    return _SQLITE_READS if link.sqlite else _POSTGRES_READS


WRITES_OF = (  # one checkpoint's pending writes, in order
    sa.select(
        CHECKPOINT_WRITES.c.task_id,
        CHECKPOINT_WRITES.c.channel,
        CHECKPOINT_WRITES.c.value_type,
        CHECKPOINT_WRITES.c.value,
        CHECKPOINT_WRITES.c.task_path,
        CHECKPOINT_WRITES.c.idx,
    )
    .where(*_bound(CHECKPOINT_WRITES, *SCOPE, "checkpoint_id"))
    .order_by(CHECKPOINT_WRITES.c.task_path, CHECKPOINT_WRITES.c.task_id, CHECKPOINT_WRITES.c.idx)
)


_PAIRS = 32  # (channel, version)s asked for per statement at most


@cache
def blobs_of(size: int) -> sa.Select[Any]:
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
        *_bound(table, *SCOPE), sa.tuple_(table.c.channel, table.c.version).in_(pairs)
    )


def padded(keys: Sequence[tuple[Any, ...]], names: tuple[str, ...]) -> Iterator[tuple[int, dict[str, Any]]]:
    """`keys` at most `_PAIRS` at a time, as `(size, values)` for `blobs_of(size)` or `writes_of(size)`.

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
def writes_of(size: int) -> sa.Select[Any]:
    """The pending writes of `size` checkpoints of an agent, by key: built once per size.

    Sizes are powers of two up to `_PAIRS` (the last key repeats to fill
    one), as `blobs_of`'s.  Rows come with their checkpoint's key, each
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
def listing(
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
        sa.select(*LISTED, CHECKPOINTS.c.meta, SESSIONS.c.key)
        .join(SESSIONS, IN_SESSION)
        .where(*where)
        .order_by(*_NEWEST_FIRST)
        .limit(sa.bindparam("limit", type_=sa.Integer))
    )
