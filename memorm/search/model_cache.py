"""Agents' embedding models, kept in memory for vector search: one statement fewer per search.

A cached model may be stale: another process (or a unit of work that
rolled back) can drop an agent, or delete and recreate it with another
model of the same name.  So a cached model is never trusted on its own:
the search statement checks that this very model row (id, dimension,
precision) still exists (`memorm.search.vector.current_model`), and a
search that finds nothing looks the model up again.  Writes never use the
cache: they read the model in their own transaction.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from memorm.models import EmbeddingModel, hydrate

__all__ = ["ModelCache"]

_Key = tuple[str, uuid.UUID, str]  # tenant, agent, model name


class ModelCache:
    """Embedding model rows by (tenant, agent, name), least recently used first out.

    Keyed by tenant: a tenant never sees another's models, even for the same
    agent id.  Safe from any thread and event loop (a plain lock, no IO).
    """

    def __init__(self, max_entries: int = 10_000) -> None:
        self.max_entries = max_entries
        self._rows: OrderedDict[_Key, dict[str, Any]] = OrderedDict()
        self._mutex = threading.Lock()

    def get(self, tenant: str, agent_id: uuid.UUID, name: str) -> EmbeddingModel | None:
        """A fresh instance of the cached model (callers may change theirs), or None."""
        key = (tenant, agent_id, name)
        with self._mutex:
            row = self._rows.get(key)
            if row is None:
                return None
            self._rows.move_to_end(key)
        return hydrate(EmbeddingModel, dict(row))

    def put(self, row: Mapping[str, Any]) -> None:
        """Remember a model row as read from the database."""
        key = (row["tenant"], row["agent_id"], row["name"])
        with self._mutex:
            self._rows[key] = dict(row)
            self._rows.move_to_end(key)
            while len(self._rows) > self.max_entries:
                self._rows.popitem(last=False)

    def drop(self, tenant: str, agent_id: uuid.UUID, name: str) -> None:
        """Forget one model (found stale)."""
        with self._mutex:
            self._rows.pop((tenant, agent_id, name), None)

    def evict_tenant(self, tenant: str) -> None:
        """Forget every model of the tenant's agents (the tenant was deleted)."""
        with self._mutex:
            for key in [key for key in self._rows if key[0] == tenant]:
                del self._rows[key]

    def clear(self) -> None:
        """Forget every model."""
        with self._mutex:
            self._rows.clear()
