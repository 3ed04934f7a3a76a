"""`MemormSaver(retention=...)`: a saver that purges each thread's old checkpoints as it writes.

LangGraph saves a checkpoint after every step and never removes one, so a
long-lived thread grows without bound.  With a `CheckpointRetention`, the
saver purges a thread after every `every` checkpoints it writes to it, in a
unit of work of its own after the write's (`uow.checkpoints.purge`: the
newest of each namespace stays, with the newest `keep_last`, those younger
than `max_age`, and the parents their `DeltaChannel`s are rebuilt from).
`memorm.retention.purge_checkpoints` and `memorm purge --checkpoints` purge
every thread at once, for a job or cron.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta

from memorm.db import Database
from memorm.repositories.checkpoint_retention import check_count, check_retention
from memorm.types import utcnow
from memorm.validation import check_duration

__all__ = ["CheckpointRetention", "ThreadPurges"]

_DEFAULT_EVERY = 100  # checkpoints between purges when only an age is given
_THREADS_KEPT = 4096  # threads whose count of writes a saver keeps (then it starts again)


@dataclass(frozen=True)
class CheckpointRetention:
    """What a saver keeps of each thread's checkpoints (`MemormSaver(retention=...)`).

    Attributes:
        keep_last: the newest checkpoints kept in each (sub)graph namespace
            of a thread.  None: by age alone (the newest always stays).
        max_age: checkpoints younger than this (a `timedelta` or seconds)
            stay.  None: by count alone.
        every: the saver purges a thread after writing this many checkpoints
            to it; None: `keep_last` (at most about twice `keep_last` stay
            between purges), or 100 by age alone.

    Raises:
        ValidationError: neither `keep_last` nor `max_age`, or a value out of
            range.
    """

    keep_last: int | None = None
    max_age: timedelta | float | None = None
    every: int | None = None

    def __post_init__(self) -> None:
        age = None if self.max_age is None else check_duration(self.max_age, "max_age")
        check_retention(self.keep_last, None if age is None else utcnow())
        object.__setattr__(self, "max_age", age)
        if self.every is not None:
            check_count(self.every, "every")

    @property
    def age(self) -> timedelta | None:
        """`max_age` as a `timedelta` (seconds given were converted when it was made)."""
        age = self.max_age
        assert not isinstance(age, (int, float))
        return age

    @property
    def interval(self) -> int:
        """Checkpoints written to a thread between two purges of it."""
        return self.every or self.keep_last or _DEFAULT_EVERY


class ThreadPurges:
    """Counts a saver's checkpoints per thread and purges a thread when its count comes round."""

    def __init__(self, policy: CheckpointRetention) -> None:
        self.policy = policy
        self._written: dict[str, int] = {}

    async def after_put(self, db: Database, agent: uuid.UUID, key: str, session: uuid.UUID | None) -> None:
        """Count a checkpoint written to thread `key` (its `session`); purge the thread every `interval`."""
        written = self._written.pop(key, 0) + 1
        if written < self.policy.interval:
            if len(self._written) >= _THREADS_KEPT:
                self._written.clear()
            self._written[key] = written
            return
        if session is None:
            return
        age = self.policy.age
        before = None if age is None else utcnow() - age
        async with db.unit_of_work() as uow:
            await uow.checkpoints.purge(agent, session, keep_last=self.policy.keep_last, before=before)
