"""The resources `memorm mcp` serves: an agent's core memory and a session's recent messages.

Both are URI templates whose contents are JSON:

| URI | contents |
|---|---|
| `memorm://agents/{agent_id}/core-memory` | `{"agent_id", "core_memory": {label: text}, "version"}` |
| `memorm://sessions/{session_id}/messages` | `{"session_id", "messages": [...]}`: the newest `RECENT` |

Messages come oldest first.  An id that is not there (or is another tenant's) is the protocol's
"resource not found" error.
"""

from __future__ import annotations

import json
from typing import Any

from memorm.compat._extras import missing_extra

try:
    from mcp.server.mcpserver import Context, MCPServer
except ImportError as error:
    raise missing_extra(__name__, "mcp", error) from error

from memorm.mcp.scope import Scope
from memorm.mcp.shapes import core_memory_json, message_json

__all__ = ["CORE_MEMORY", "MESSAGES", "RECENT", "register_resources"]

CORE_MEMORY = "memorm://agents/{agent_id}/core-memory"
"""The URI template of an agent's core memory."""

MESSAGES = "memorm://sessions/{session_id}/messages"
"""The URI template of a session's recent messages."""

RECENT = 50
"""How many of a session's newest messages its resource holds."""


def register_resources(server: MCPServer[Any], scope: Scope) -> None:
    """Add memorm's resource templates to `server`, each read in `scope`'s database and tenant."""

    @server.resource(CORE_MEMORY, name="core-memory", mime_type="application/json")
    async def core_memory(agent_id: str, ctx: Context[Any, Any]) -> str:
        """An agent's core memory (label -> text) and its version."""
        async with scope.resource(ctx) as uow:
            agent = await uow.agents.get(agent_id)
        return json.dumps(core_memory_json(agent), ensure_ascii=False)

    @server.resource(MESSAGES, name="recent-messages", mime_type="application/json")
    async def recent_messages(session_id: str, ctx: Context[Any, Any]) -> str:
        """A conversation's newest messages, oldest first."""
        async with scope.resource(ctx) as uow:
            messages = await uow.messages.window(session_id, limit=RECENT)
        shown = {"session_id": session_id, "messages": [message_json(message) for message in messages]}
        return json.dumps(shown, ensure_ascii=False)
