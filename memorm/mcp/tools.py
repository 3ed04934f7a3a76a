"""The tools `memorm mcp` serves: conversations, context windows, archival and core memory.

Each tool is one unit of work of the request's tenant (`memorm.mcp.scope.Scope`);
bad input (an unknown id, a wrong role, NUL characters, a bad budget, a stale
core-memory version) comes back as a tool error naming the `memorm.errors`
exception, and nothing is written.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from memorm.compat._extras import missing_extra

try:
    from mcp.server.mcpserver import Context, MCPServer
    from mcp_types import ToolAnnotations
    from pydantic import Field
    from typing_extensions import NotRequired, TypedDict
except ImportError as error:
    raise missing_extra(__name__, "mcp", error) from error

from memorm.errors import ConflictError
from memorm.mcp.embedders import embed_one
from memorm.mcp.scope import Scope
from memorm.mcp.shapes import agent_json, core_memory_json, hit_json, message_json, session_json
from memorm.validation import check_text

__all__ = ["TOOLS", "MessageIn", "register_tools"]

TOOLS = (
    "get_or_create_agent",
    "get_or_create_session",
    "append_messages",
    "read_context",
    "search_messages",
    "insert_archival_memory",
    "search_archival_memory",
    "read_core_memory",
    "update_core_memory",
)
"""The tools' names, in the order they are listed."""

_Tool = TypeVar("_Tool", bound=Callable[..., Any])
_READS = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True)
_WRITES = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False)


class MessageIn(TypedDict):
    """One message to append, as chat APIs spell it."""

    role: Annotated[str, Field(description="system, user, assistant or tool")]
    content: NotRequired[str | None]
    name: NotRequired[str]
    tool_call_id: NotRequired[Annotated[str, Field(description="a tool message: the call it answers")]]
    tool_calls: NotRequired[
        Annotated[list[dict[str, Any]], Field(description="an assistant message: the tool calls it makes")]
    ]


AgentId = Annotated[str, Field(description="the agent's id (from get_or_create_agent)")]
SessionId = Annotated[str, Field(description="the session's id (from get_or_create_session)")]


def _adder(server: MCPServer[Any]) -> Callable[[ToolAnnotations], Callable[[_Tool], _Tool]]:
    """A decorator adding a tool to `server`, its docstring (dedented) as its description."""

    def tool(annotations: ToolAnnotations) -> Callable[[_Tool], _Tool]:
        def add(fn: _Tool) -> _Tool:
            server.add_tool(fn, description=inspect.cleandoc(fn.__doc__ or ""), annotations=annotations)
            return fn

        return add

    return tool


def register_tools(server: MCPServer[Any], scope: Scope) -> None:
    """Add memorm's tools to `server`, each working in `scope`'s database and tenant."""
    tool = _adder(server)

    @tool(_WRITES)
    async def get_or_create_agent(
        ctx: Context[Any, Any],
        name: Annotated[str, Field(description="the agent's unique name")],
        system: Annotated[str, Field(description="its system prompt, if it is created")] = "",
        core_memory: Annotated[
            dict[str, str] | None, Field(description="its core memory (label -> text), if it is created")
        ] = None,
    ) -> dict[str, Any]:
        """The agent called `name`, created if there is none (then with `system` and `core_memory`).

        Returns its id, core memory and version, and whether it was created now.
        """
        async with scope.tool(ctx) as uow:
            agent = await uow.agents.get_by_name(name)
            created = agent is None
            if agent is None:
                try:
                    agent = await uow.agents.create(name, system=system, core_memory=core_memory)
                except ConflictError:  # created meanwhile by another request
                    agent = await uow.agents.get_by_name(name)
                    if agent is None:
                        raise
                    created = False
        return {**agent_json(agent), "created": created}

    @tool(_WRITES)
    async def get_or_create_session(
        ctx: Context[Any, Any],
        agent_id: AgentId,
        key: Annotated[str, Field(description="your name for the conversation, unique per agent")],
        title: Annotated[str | None, Field(description="its title, if it is created")] = None,
    ) -> dict[str, Any]:
        """The agent's conversation called `key`, created on first use; returns its session id."""
        async with scope.tool(ctx) as uow:
            found = await uow.sessions.get_by_key(agent_id, key)
            chat = found or await uow.sessions.get_or_create(agent_id, key, title=title)
        return {**session_json(chat), "created": found is None}

    @tool(_WRITES)
    async def append_messages(
        ctx: Context[Any, Any],
        session_id: SessionId,
        messages: Annotated[list[MessageIn], Field(description="the messages, oldest first")],
    ) -> dict[str, Any]:
        """Append messages to a conversation, all or none; returns them with their ids and `seq` numbers.

        An assistant message with `tool_calls` and the `tool` messages answering
        it may come in one call.
        """
        async with scope.tool(ctx) as uow:
            stored = await uow.messages.append(session_id, [dict(message) for message in messages])
        return {"messages": [message_json(message) for message in stored]}

    @tool(_READS)
    async def read_context(
        ctx: Context[Any, Any],
        session_id: SessionId,
        max_tokens: Annotated[int, Field(description="the token budget, at least 1")],
        pinned_system: Annotated[
            bool, Field(description="always keep the conversation's first message if it is a system one")
        ] = True,
    ) -> dict[str, Any]:
        """The messages to send a model: the newest that fit `max_tokens`, oldest first.

        The system message (the conversation's first, if its role is system)
        stays pinned; the window never starts with a tool answer whose call was
        cut off.  `tokens` is what the returned messages count.
        """
        async with scope.tool(ctx, read_only=True) as uow:
            messages = await uow.messages.context(
                session_id, max_tokens=max_tokens, pinned_system=pinned_system
            )
        return {
            "messages": [message_json(message) for message in messages],
            "tokens": sum(message.token_count or 0 for message in messages),
        }

    @tool(_READS)
    async def search_messages(
        ctx: Context[Any, Any],
        agent_id: AgentId,
        query: Annotated[str, Field(description="words that must all appear")],
        session_id: Annotated[str | None, Field(description="search only this conversation")] = None,
        roles: Annotated[list[str] | None, Field(description="keep only these roles")] = None,
        limit: Annotated[int, Field(description="at most this many messages")] = 10,
        offset: Annotated[int, Field(description="skip this many matches")] = 0,
    ) -> dict[str, Any]:
        """Full-text search of an agent's messages (or one conversation's), best match first.

        `total` counts every match; page with `offset`.
        """
        async with scope.tool(ctx, read_only=True) as uow:
            page = await uow.messages.search(
                agent_id, query, session_id=session_id, roles=roles, limit=limit, offset=offset
            )
        return {"total": page.total, "messages": [message_json(message) for message in page.items]}

    @tool(_WRITES)
    async def insert_archival_memory(
        ctx: Context[Any, Any],
        agent_id: AgentId,
        text: Annotated[str, Field(description="the passage to remember")],
        meta: Annotated[dict[str, Any] | None, Field(description="JSON to keep beside it")] = None,
    ) -> dict[str, Any]:
        """Store a passage in the agent's long-term (archival) memory, embedded by the server's embedder.

        The default embedder is a word-hashing stand-in (HashingEmbedder), not
        a semantic model: a later search finds passages sharing its words.
        """
        with scope.tool_errors():
            check_text(text, "text")
            vector = await embed_one(scope.embedder, text)
        async with scope.tool(ctx) as uow:
            passage = await uow.passages.add(
                agent_id, text, vector, embedding_model=scope.embedder.model, meta=meta
            )
        return {"id": str(passage.id), "embedding_model": passage.embedding_model}

    @tool(_READS)
    async def search_archival_memory(
        ctx: Context[Any, Any],
        agent_id: AgentId,
        query: Annotated[str, Field(description="what to look for")],
        k: Annotated[int, Field(description="at most this many passages, 1 to 1000")] = 5,
    ) -> dict[str, Any]:
        """The agent's archival passages nearest `query`, best first, with a score (higher is nearer).

        Similarity is the server's embedder's: by default a word-hashing
        stand-in (HashingEmbedder), not a semantic model: it matches shared
        words, not meaning.
        """
        with scope.tool_errors():
            check_text(query, "query")
            vector = await embed_one(scope.embedder, query)
        async with scope.tool(ctx, read_only=True) as uow:
            hits = await uow.passages.search(agent_id, vector, k=k, embedding_model=scope.embedder.model)
        return {"embedding_model": scope.embedder.model, "passages": [hit_json(hit) for hit in hits]}

    @tool(_READS)
    async def read_core_memory(ctx: Context[Any, Any], agent_id: AgentId) -> dict[str, Any]:
        """The agent's core memory (label -> text) and its `version`, which update_core_memory needs."""
        async with scope.tool(ctx, read_only=True) as uow:
            agent = await uow.agents.get(agent_id)
        return core_memory_json(agent)

    @tool(_WRITES)
    async def update_core_memory(
        ctx: Context[Any, Any],
        agent_id: AgentId,
        label: Annotated[str, Field(description="the block to set, e.g. persona or human")],
        value: Annotated[str, Field(description="its new text")],
        expected_version: Annotated[int, Field(description="the version read_core_memory returned")],
    ) -> dict[str, Any]:
        """Set one block of the agent's core memory, if it is still at `expected_version`.

        Another writer since then makes this a ConflictError: read the core
        memory again, and retry with its new version.  Returns the new version.
        """
        async with scope.tool(ctx) as uow:
            agent = await uow.agents.update_core_memory(
                agent_id, label, value, expected_version=expected_version
            )
        return core_memory_json(agent)
