"""The graph store's items as `uow.graph_store` takes and gives them, and how long they live.

An item is a JSON object under a namespace (LangGraph's labels joined by
".") and a key, both at most `MAX_KEY_BYTES`; it may expire `ttl_minutes`
after its last write (`check_minutes`), and until a sweep deletes it a
read may be told to see it still (`read_cutoff`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from memorm.errors import ValidationError
from memorm.validation import MIN_TIME

__all__ = ["MAX_KEY_BYTES", "NewItem", "StoredItem", "check_minutes", "expiry_at", "read_cutoff"]

MAX_KEY_BYTES = 1024  # of a joined namespace, and of a key: both in the primary key's btree entries
_MAX_MINUTES = 1000 * 365 * 24 * 60


class StoredItem(NamedTuple):
    """An item as read: its namespace (joined), key, value, times, TTL and search score."""

    namespace: str
    key: str
    value: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    ttl_minutes: float | None
    score: float | None = None


class NewItem(NamedTuple):
    """An item to store; `vectors` maps field paths to embeddings (None: keep no embeddings)."""

    namespace: str
    key: str
    value: dict[str, Any]
    ttl_minutes: float | None
    vectors: Mapping[str, list[float]] | None = None


def check_minutes(value: object, field: str) -> float | None:
    """A TTL in minutes (None: none) as the store keeps it: a positive float of at most a thousand years."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValidationError(f"{field}: expected a positive number of minutes or None, got {value!r:.80}")
    if value > _MAX_MINUTES:
        raise ValidationError(f"{field}: more than a thousand years")
    return float(value)


def expiry_at(now: datetime, ttl_minutes: float | None) -> datetime | None:
    """When an item written (or refreshed) at `now` expires: never without a TTL."""
    return None if ttl_minutes is None else now + timedelta(minutes=ttl_minutes)


def read_cutoff(now: datetime, expired: bool) -> datetime:
    """The time an item must outlive to be read: `now`, or with `expired` the earliest time memorm stores.

    Every item expires after it was written, so nothing has expired at
    `MIN_TIME`: the statements stay the same, and keep their cached plans.
    """
    return MIN_TIME if expired else now
