"""`copy_checkpoints`: another LangGraph saver's checkpoints, copied into a `MemormSaver`.

The way from `langgraph-checkpoint-sqlite` or `-postgres` to memorm
(`memorm import-langgraph` runs it).
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable
from typing import Any

from memorm.compat._extras import missing_extra

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import BaseCheckpointSaver
except ImportError as error:
    raise missing_extra(__name__, "langgraph", error) from error

from memorm.compat.langgraph_saver import MemormSaver
from memorm.compat.langgraph_serde import reading_strictly
from memorm.graph_values import AllowedType
from memorm.progress import Reporter, Silent

__all__ = ["copy_checkpoints"]


async def copy_checkpoints(
    source: BaseCheckpointSaver[Any],
    target: MemormSaver,
    config: RunnableConfig | None = None,
    *,
    reporter: Reporter | None = None,
    allowed_types: Iterable[AllowedType] | None = None,
) -> int:
    """Copy the checkpoints (with their writes) of another LangGraph saver into a `MemormSaver`.

    The way from `langgraph-checkpoint-sqlite` or `-postgres` to memorm:
    every checkpoint `source.alist(config)` gives (all threads when
    `config` is None) is stored by `target` under the same thread, namespace
    and id, with its parent, metadata, channel values and pending writes.
    Copying again stores nothing new.  Returns the checkpoints copied.

    `reporter` (a [`Reporter`][memorm.progress.Reporter]) is told of each
    checkpoint stored (`advance("checkpoints", 1)`) and of its pending
    writes (`advance("writes", n)`); the caller, who knows the totals,
    starts both tasks (`memorm import-langgraph` counts the source's rows).

    The source is read through memorm's `StrictSerializer` in place of
    LangGraph's serializer (a copy of `source`; yours, if it is not
    LangGraph's, as it is): a value naming a callable that is neither a type
    LangGraph's graphs store nor one of `allowed_types` raises
    `UnsafeValueError` and stops the copy there, uncalled.  (`memorm
    import-langgraph` checks every value before it copies any.)
    """
    report = reporter or Silent()
    copied = 0
    async for item in reading_strictly(source, allowed_types).alist(config):
        where = dict(item.config["configurable"])
        parent = (item.parent_config or {}).get("configurable", {}).get("checkpoint_id")
        put_config: RunnableConfig = {"configurable": {**where, "checkpoint_id": parent}}
        checkpoint = item.checkpoint
        stored = await target.aput(
            put_config, checkpoint, item.metadata, dict(checkpoint["channel_versions"])
        )
        by_task: dict[str, builtins.list[tuple[str, Any]]] = {}
        for task_id, channel, value in item.pending_writes or ():
            by_task.setdefault(task_id, []).append((channel, value))
        for task_id, writes in by_task.items():
            await target.aput_writes(stored, writes, task_id)
        copied += 1
        report.advance("checkpoints", 1)
        if item.pending_writes:
            report.advance("writes", len(item.pending_writes))
    return copied
