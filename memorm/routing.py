"""Routing session-scoped calls to the agent's shard (Citus).

On a distributed database every table but `agents` is sharded by
`agent_id`.  A call that receives only a session id (`append`, `window`,
`context`…) must name the session's agent too, or Citus asks every shard.
A session never changes agent, so the mapping is cached per `Database`:
sessions memorm creates, reads or appends to are remembered, and an unknown
session is looked up once by its key (on a distributed database that one
lookup asks every shard).  Statements on a session's messages always name
its agent, on every engine: the messages' indexes lead with
`(tenant, agent_id)`, so without it a window would read the tenant's
every message.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict

__all__ = ["SessionAgents"]


class SessionAgents:
    """(tenant, session id) -> agent id, the most recently used first kept."""

    def __init__(self, max_entries: int = 100_000) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, uuid.UUID], uuid.UUID] = OrderedDict()
        self._mutex = threading.Lock()  # units of work of every loop and thread share it

    def get(self, tenant: str, session_id: uuid.UUID) -> uuid.UUID | None:
        with self._mutex:
            agent = self._entries.get((tenant, session_id))
            if agent is not None:
                self._entries.move_to_end((tenant, session_id))
            return agent

    def put(self, tenant: str, session_id: uuid.UUID, agent_id: uuid.UUID) -> None:
        with self._mutex:
            self._entries[(tenant, session_id)] = agent_id
            self._entries.move_to_end((tenant, session_id))
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def drop(self, tenant: str, session_id: uuid.UUID) -> None:
        with self._mutex:
            self._entries.pop((tenant, session_id), None)
