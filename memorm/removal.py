"""What deleting rows removed: the counts of a purge, `forget` or batched delete, and what a scrub cleared.

Results the repositories, the retention services and `scrub` all return,
kept below them so each can name them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from memorm.errors import ValidationError

__all__ = ["DEFAULT_BATCH", "MAX_BATCH", "MAX_KEEP_LAST", "Removed", "Scrubbed", "check_batch"]

DEFAULT_BATCH = 1000
MAX_BATCH = 100_000
MAX_KEEP_LAST = 1_000_000
"""The most checkpoints per namespace of a thread a checkpoint purge may be asked to keep."""


@dataclass(frozen=True)
class Scrubbed:
    """What [`Database.scrub`][memorm.db.Database.scrub] cleared, and what it had to leave.

    Attributes:
        vacuumed: Postgres: memorm's tables `VACUUM` cleaned.
        reindexed: Postgres: the full-text indexes rebuilt (`reindex=True`).
        merged: SQLite: the full-text indexes merged.
        skipped: what still holds deleted rows' traces: on Postgres the
            tables (and, with `reindex=True`, the indexes) the role may
            not clean, being neither their owner nor a superuser; on SQLite
            `"write-ahead log"` when a reader kept it from being truncated.
    """

    vacuumed: tuple[str, ...] = ()
    reindexed: tuple[str, ...] = ()
    merged: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        """Whether nothing was skipped."""
        return not self.skipped


@dataclass(frozen=True)
class Removed:
    """How many rows of each kind a purge or `forget` deleted (or, in a dry run, would delete).

    Cascades count: a deleted session's messages are in `messages`.
    `checkpoints` counts graph checkpoints a checkpoint purge deleted (their
    pending writes and the channel values only they held went with them);
    a session's graph state deleted with the session is not counted.
    `scrubbed` is what the scrub `forget` runs afterwards cleared and
    skipped ([`Scrubbed`][memorm.scrub.Scrubbed]; None when no scrub ran); it
    is not a count, and equality, sums and `as_dict` leave it out.
    """

    agents: int = 0
    sessions: int = 0
    messages: int = 0
    passages: int = 0
    checkpoints: int = 0
    scrubbed: Scrubbed | None = dataclasses.field(default=None, compare=False)

    def __add__(self, other: Removed) -> Removed:
        return Removed(**{kind: getattr(self, kind) + getattr(other, kind) for kind in _COUNTS})

    @property
    def total(self) -> int:
        """Rows of every kind together."""
        return sum(getattr(self, kind) for kind in _COUNTS)

    def as_dict(self) -> dict[str, int]:
        """`{"agents": …, "sessions": …, "messages": …, "passages": …, "checkpoints": …}`."""
        return {kind: getattr(self, kind) for kind in _COUNTS}


_COUNTS = ("agents", "sessions", "messages", "passages", "checkpoints")


def check_batch(batch: object) -> int:
    """`batch` as rows per transaction of a batched delete, from 1 to `MAX_BATCH`."""
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
        raise ValidationError(f"batch: expected an integer from 1 to {MAX_BATCH:,}, got {batch!r}")
    return batch
