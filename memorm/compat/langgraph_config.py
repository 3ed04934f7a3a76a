"""What a LangGraph saver is asked for, checked: configs, thread ids, run ids and listings.

LangGraph passes plain dicts (`RunnableConfig`); `ThreadConfig` reads one
into the session key, namespace and checkpoint id memorm stores under, and
says which part is wrong (`ValidationError`) before any unit of work opens.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from memorm.compat._extras import missing_extra

try:
    from langchain_core.runnables import RunnableConfig
except ImportError as error:
    raise missing_extra(__name__, "langgraph", error) from error

from memorm.errors import ValidationError
from memorm.repositories.checkpoint_records import CheckpointKey, check_state_key
from memorm.search.filters import check_json_keys
from memorm.validation import check_int, check_name

__all__ = ["Listing", "ThreadConfig", "before_checkpoint", "checked_run_ids", "thread_key", "thread_keys"]


class ThreadConfig:
    """Where a config points: its thread (a session key), namespace and checkpoint id, checked."""

    __slots__ = ("checkpoint_id", "key", "ns", "thread_id")

    def __init__(self, config: object, *, field: str = "config") -> None:
        configurable = _configurable(config, field)
        thread = configurable.get("thread_id")
        if isinstance(thread, bool) or not isinstance(thread, (str, int, uuid.UUID)):
            raise ValidationError(f"{field}: configurable.thread_id must be a string (or an int or a UUID)")
        self.thread_id: Any = thread
        self.key = thread_key(thread, f"{field}.configurable.thread_id")
        ns = configurable.get("checkpoint_ns", "")
        if not isinstance(ns, str):
            raise ValidationError(f"{field}: configurable.checkpoint_ns must be a string")
        self.ns: str = check_state_key(ns, f"{field}: configurable.checkpoint_ns")
        self.checkpoint_id = _checkpoint_id(configurable, field)

    def config(self, checkpoint_id: str) -> RunnableConfig:
        """The config naming the checkpoint `checkpoint_id` of this thread and namespace."""
        return {
            "configurable": {
                "thread_id": self.thread_id,
                "checkpoint_ns": self.ns,
                "checkpoint_id": checkpoint_id,
            }
        }


def _configurable(config: object, field: str) -> Mapping[str, Any]:
    configurable = config.get("configurable") if isinstance(config, Mapping) else None
    if not isinstance(configurable, Mapping):
        raise ValidationError(f"{field}: expected a RunnableConfig with a 'configurable' dict")
    return configurable


def _checkpoint_id(configurable: Mapping[str, Any], field: str) -> str | None:
    checkpoint = configurable.get("checkpoint_id")
    if checkpoint is not None and not isinstance(checkpoint, str):
        raise ValidationError(f"{field}: configurable.checkpoint_id must be a string")
    if checkpoint:
        check_state_key(checkpoint, f"{field}: configurable.checkpoint_id")
    return checkpoint or None


def before_checkpoint(before: object) -> str | None:
    """The checkpoint id a listing's `before` names, read as LangGraph's own savers read it.

    Only its `checkpoint_id` counts: LangGraph replays a subgraph by listing the
    subgraph's checkpoints `before` a config that names the parent's checkpoint
    and no thread.  Without one, nothing is left out (as `InMemorySaver`).
    """
    return _checkpoint_id(_configurable(before, "before"), "before")


def thread_key(thread: object, field: str) -> str:
    """A thread id (a string, an int or a UUID) as the key of its memorm session."""
    if isinstance(thread, bool) or not isinstance(thread, (str, int, uuid.UUID)):
        raise ValidationError(f"{field}: a thread id is a string (or an int or a UUID)")
    return check_name(str(thread), field, blank=True)


def thread_keys(thread_ids: object, field: str) -> list[str]:
    """A list of thread ids as their sessions' keys (`thread_key`)."""
    if isinstance(thread_ids, (str, bytes)) or not isinstance(thread_ids, Sequence):
        raise ValidationError(f"{field}: expected a list of thread ids, not {type(thread_ids).__name__}")
    return [thread_key(thread, f"{field}[{index}]") for index, thread in enumerate(thread_ids)]


class Listing:
    """A listing's arguments, checked, and where its paging stands."""

    def __init__(
        self,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> None:
        self.where = None if config is None else ThreadConfig(config)
        # A config without a namespace lists every namespace of the thread.
        self.ns_any = config is not None and "checkpoint_ns" not in (config.get("configurable") or {})
        self.filter = None if filter is None else dict(check_json_keys(filter, "filter")) or None
        self.before = None if before is None else before_checkpoint(before)
        self.left = None if limit is None else check_int(limit, "limit", minimum=0, maximum=2**62)
        self.after: CheckpointKey | None = None
        self.done = self.left == 0


def checked_run_ids(run_ids: object) -> list[str]:
    """A list of run ids (strings or UUIDs), as strings."""
    if isinstance(run_ids, (str, bytes)) or not isinstance(run_ids, Sequence):
        raise ValidationError(f"run_ids: expected a list of run ids, not {type(run_ids).__name__}")
    found = []
    for index, run in enumerate(run_ids):
        if not isinstance(run, (str, uuid.UUID)):
            raise ValidationError(f"run_ids[{index}]: expected a string, got {type(run).__name__}")
        found.append(str(run))
    return found
