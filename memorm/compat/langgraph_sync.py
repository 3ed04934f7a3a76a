"""The sync methods of a LangGraph saver: the async ones, run on memorm's sync loop.

A sync graph (`graph.invoke`) calls them; each runs its async twin on the
loop `memorm.compat._sync` keeps for sync callers, so it works from any
thread that is not running an event loop (there it raises
`BlockingCallError`, unless the saver was made with `allow_blocking`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from memorm.compat._extras import missing_extra

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import ChannelVersions, Checkpoint, CheckpointMetadata, CheckpointTuple
except ImportError as error:
    raise missing_extra(__name__, "langgraph", error) from error

from memorm.compat._sync import run_off_loop
from memorm.compat.langgraph_config import Listing
from memorm.compat.langgraph_storage import CheckpointStorage

__all__ = ["SyncCheckpointMethods"]


class SyncCheckpointMethods(CheckpointStorage):
    """`MemormSaver`'s sync methods, each its async twin on memorm's sync loop (`memorm.compat._sync`)."""

    allow_blocking: bool  # run on a thread whose event loop is running (see `MemormSaver`)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """`aget_tuple` for sync code."""
        return run_off_loop(self, "get_tuple", lambda _: self.aget_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """`alist` for sync code: a page at a time, each read on memorm's sync loop."""
        query = Listing(config, filter, before, limit)
        while not query.done:
            yield from run_off_loop(self, "list", lambda db: self._page(db, query))

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """`aput` for sync code."""
        return run_off_loop(self, "put", lambda _: self.aput(config, checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """`aput_writes` for sync code."""
        run_off_loop(self, "put_writes", lambda _: self.aput_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        """`adelete_thread` for sync code."""
        run_off_loop(self, "delete_thread", lambda _: self.adelete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """`adelete_for_runs` for sync code."""
        run_off_loop(self, "delete_for_runs", lambda _: self.adelete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """`acopy_thread` for sync code."""
        run_off_loop(self, "copy_thread", lambda _: self.acopy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """`aprune` for sync code."""
        run_off_loop(self, "prune", lambda _: self.aprune(thread_ids, strategy=strategy))
