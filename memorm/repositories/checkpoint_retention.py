"""Which of a session's checkpoints a purge removes, and what the kept ones still need.

A graph saves a checkpoint after every step, so a live thread's state grows
without bound.  A purge keeps, in each (sub)graph namespace of a session:

- the newest checkpoint, always: it is the thread's state (and an interrupted
  subgraph's, waiting to be resumed), whatever its age;
- the newest `keep_last`, and every checkpoint made at or after `before`;
- what a kept checkpoint needs to be read: a channel of LangGraph's
  `DeltaChannel` stores a full value only now and then (a snapshot) and is
  rebuilt from the writes stored at the checkpoint's ancestors back to the
  latest snapshot, so that chain of parents stays, with its writes.

A checkpoint's metadata says which delta channels it holds no snapshot of
(`counters_since_delta_snapshot`, written by LangGraph); a checkpoint without
it needs no parent.  A kept checkpoint whose parent goes becomes a root (its
parent is cleared, as LangGraph's `prune` leaves the newest).  The channel
values no kept checkpoint holds go too, read from the versions each
checkpoint names (`channel_versions`); a namespace with a kept checkpoint
stored before those were recorded (revision 0014) keeps all its values.

`plan_purge` decides from the rows alone, so the rules are tested without a
database; `CheckpointRepository.purge` reads the rows, locks the session and
deletes what the plan names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from memorm.errors import ValidationError
from memorm.removal import MAX_KEEP_LAST
from memorm.validation import check_aware

__all__ = ["PurgePlan", "RetainedRow", "check_count", "check_retention", "plan_purge"]

_DELTA_COUNTERS = "counters_since_delta_snapshot"
_SNAPSHOT = ([0, 0], (0, 0))  # a channel's counters at the checkpoint that snapshots it


class RetainedRow(NamedTuple):
    """What a purge reads of one checkpoint: its key, parent, age, delta channels and values held."""

    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    created_at: datetime
    meta: Mapping[str, Any]
    channel_versions: Mapping[str, str] | None

    @property
    def unsnapshotted(self) -> frozenset[str]:
        """The delta channels this checkpoint holds no full value of (rebuilt from its ancestors)."""
        counters = self.meta.get(_DELTA_COUNTERS)
        if not isinstance(counters, Mapping):
            return frozenset()
        return frozenset(str(channel) for channel, counted in counters.items() if counted not in _SNAPSHOT)


@dataclass
class PurgePlan:
    """What a purge of one session removes (`removed`), and what it changes of what stays.

    Attributes:
        removed: the `(namespace, checkpoint id)` of each checkpoint that goes.
        orphaned: kept checkpoints whose parent goes: they become roots.
        values_kept: per namespace, the `(channel, version)`s kept checkpoints
            hold; None for a namespace whose values all stay.
    """

    removed: list[tuple[str, str]] = field(default_factory=list)
    orphaned: list[tuple[str, str]] = field(default_factory=list)
    values_kept: dict[str, set[tuple[str, str]] | None] = field(default_factory=dict)


def check_retention(keep_last: object, before: object) -> tuple[int, datetime | None]:
    """`keep_last` (1 when only `before` is given) and `before`, checked.

    Raises:
        ValidationError: neither given, `keep_last` not a whole number from 1
            to `MAX_KEEP_LAST`, or `before` not a timezone-aware datetime.
    """
    if keep_last is None and before is None:
        raise ValidationError("give keep_last, before, or both: what to keep of each thread")
    last = 1 if keep_last is None else check_count(keep_last, "keep_last")
    return last, None if before is None else check_aware(before, "before")


def check_count(value: object, field: str) -> int:
    """A count of checkpoints: a whole number from 1 to `MAX_KEEP_LAST`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_KEEP_LAST:
        raise ValidationError(f"{field}: expected a whole number from 1 to {MAX_KEEP_LAST:,}, got {value!r}")
    return value


def plan_purge(rows: Iterable[RetainedRow], *, keep_last: int, before: datetime | None) -> PurgePlan:
    """The plan for one session's checkpoints: the newest `keep_last` of each namespace and those
    made at or after `before` stay, with the parents their delta channels are rebuilt from."""
    by_key = {(row.checkpoint_ns, row.checkpoint_id): row for row in rows}
    namespaces: dict[str, list[RetainedRow]] = {}
    for row in by_key.values():
        namespaces.setdefault(row.checkpoint_ns, []).append(row)
    kept: set[tuple[str, str]] = set()
    for ns, found in namespaces.items():
        found.sort(key=lambda row: row.checkpoint_id, reverse=True)
        for place, row in enumerate(found):
            if place < keep_last or (before is not None and row.created_at >= before):
                kept.add((ns, row.checkpoint_id))
    # The chains delta channels are rebuilt from: walked once per (checkpoint, channel).
    walked: set[tuple[str, str, str]] = set()
    for key in list(kept):
        row = by_key[key]
        wanted = set(row.unsnapshotted)
        while wanted and row.parent_checkpoint_id is not None:
            parent = by_key.get((row.checkpoint_ns, row.parent_checkpoint_id))
            if parent is None:  # gone already: nothing more to keep
                break
            kept.add((parent.checkpoint_ns, parent.checkpoint_id))
            wanted = {
                channel
                for channel in wanted & parent.unsnapshotted  # the others' snapshot is the parent's
                if (parent.checkpoint_ns, parent.checkpoint_id, channel) not in walked
            }
            walked.update((parent.checkpoint_ns, parent.checkpoint_id, channel) for channel in wanted)
            row = parent
    plan = PurgePlan(removed=sorted(set(by_key) - kept))
    for key in sorted(kept):
        row = by_key[key]
        parent_key = (row.checkpoint_ns, row.parent_checkpoint_id or "")
        if row.parent_checkpoint_id is not None and parent_key in by_key and parent_key not in kept:
            plan.orphaned.append(key)
        held = plan.values_kept.setdefault(row.checkpoint_ns, set())
        if held is None or row.channel_versions is None:
            plan.values_kept[row.checkpoint_ns] = None
        else:
            held.update((channel, str(version)) for channel, version in row.channel_versions.items())
    return plan
