"""memorm's rows as the JSON an MCP client reads: plain values, ids and times as strings."""

from __future__ import annotations

from typing import Any

from memorm.models import Agent, Message, Session
from memorm.search.vector import ScoredPassage

__all__ = ["agent_json", "core_memory_json", "hit_json", "message_json", "session_json"]


def agent_json(agent: Agent) -> dict[str, Any]:
    """An agent: id, name, system prompt, core memory and its version."""
    return {
        "agent_id": str(agent.id),
        "name": agent.name,
        "system": agent.system,
        "core_memory": dict(agent.core_memory),
        "version": agent.version,
    }


def core_memory_json(agent: Agent) -> dict[str, Any]:
    """An agent's core memory (label -> text) and the version to update it with."""
    return {"agent_id": str(agent.id), "core_memory": dict(agent.core_memory), "version": agent.version}


def session_json(chat: Session) -> dict[str, Any]:
    """A session: its id, agent, key and title."""
    return {"session_id": str(chat.id), "agent_id": str(chat.agent_id), "key": chat.key, "title": chat.title}


def message_json(message: Message) -> dict[str, Any]:
    """A message, without the fields it leaves empty."""
    shown: dict[str, Any] = {
        "id": str(message.id),
        "session_id": str(message.session_id),
        "seq": message.seq,
        "role": message.role,
        "content": message.content,
        "token_count": message.token_count,
        "created_at": message.created_at.isoformat(),
    }
    if message.name is not None:
        shown["name"] = message.name
    if message.tool_calls is not None:
        shown["tool_calls"] = message.tool_calls
    if message.tool_call_id is not None:
        shown["tool_call_id"] = message.tool_call_id
    return shown


def hit_json(hit: ScoredPassage) -> dict[str, Any]:
    """An archival search hit: the passage and its score (higher is nearer)."""
    passage = hit.passage
    return {
        "id": str(passage.id),
        "text": passage.text,
        "score": hit.score,
        "meta": dict(passage.meta),
        "created_at": passage.created_at.isoformat(),
    }
