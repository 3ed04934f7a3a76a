"""How `uow.checkpoints` writes a checkpoint: the columns of its rows, and the statements per engine.

A graph stores a checkpoint and the channel values new in it after every
step: `write_checkpoint` decides how, so the repository never asks which
database it is on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from memorm.driver import Insert, fetch, insert_many
from memorm.link import Link
from memorm.models import CHECKPOINT_BLOBS, CHECKPOINTS
from memorm.repositories.checkpoint_read_statements import SCOPE
from memorm.repositories.checkpoint_records import Value
from memorm.repositories.session_locks import writes_in_one_statement
from memorm.translate import check_writable, guarded

__all__ = ["CHECKPOINT_COLUMNS", "WRITE_COLUMNS", "write_checkpoint"]

CHECKPOINT_COLUMNS = (
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
WRITE_COLUMNS = (
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


def _put_in_one() -> Any:
    """A checkpoint and its new channel values in one statement (Postgres; see `write_checkpoint`).

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
            sa.select(*(scalar(CHECKPOINT_BLOBS, name) for name in SCOPE), *new.c),
        )
        .on_conflict_do_nothing()
        .cte("new_blobs")
    )
    checkpoint = postgresql.insert(CHECKPOINTS).values(
        {name: scalar(CHECKPOINTS, name) for name in CHECKPOINT_COLUMNS}
    )
    key = [column.name for column in CHECKPOINTS.primary_key.columns]
    replaced = {name: checkpoint.excluded[name] for name in CHECKPOINT_COLUMNS if name not in key}
    return checkpoint.on_conflict_do_update(index_elements=key, set_=replaced).add_cte(blobs)


_PUT_IN_ONE = _put_in_one()


async def write_checkpoint(
    link: Link,
    checkpoint: tuple[Any, ...],
    blobs: Mapping[tuple[str, str], Value],
) -> None:
    """Store a checkpoint row (values in `CHECKPOINT_COLUMNS` order) and its new channel values.

    The row replaces one stored under its key; `blobs` maps `(channel,
    version)` to its value, and a value already stored for that version of
    the channel is kept.
    """
    if writes_in_one_statement(link):
        # One statement, one round trip (a graph step's; alone, it needs no BEGIN/COMMIT).
        # On Citus the two inserts stay apart: each routes to the session's shard.
        params: dict[str, Any] = dict(zip(CHECKPOINT_COLUMNS, checkpoint, strict=True))
        columns = list(zip(*blobs, strict=True)) or [(), ()]
        values = list(zip(*blobs.values(), strict=True)) or [(), ()]
        params.update(channels=columns[0], versions=columns[1], value_types=values[0], values=values[1])
        check_writable(link)
        async with guarded(link):
            await fetch(link, _PUT_IN_ONE, params)
        return
    scope = checkpoint[: len(SCOPE)]  # the checkpoint's tenant, agent, session and namespace
    rows = [(*scope, channel, version, kind, value) for (channel, version), (kind, value) in blobs.items()]
    await insert_many(
        link,
        [
            Insert(CHECKPOINT_BLOBS, _BLOB_COLUMNS, rows, "ignore"),
            Insert(CHECKPOINTS, CHECKPOINT_COLUMNS, [checkpoint], "update"),
        ],
    )
