"""`create_server`: memorm's MCP server (tools and resources) on one `Database`.

```python
server = create_server(db)                     # stdio or in-process: the default tenant
server = create_server(db, tenant="acme")      # one tenant of your choosing
server = create_server(db, tokens=table)       # HTTP: each bearer token names its tenant
```

One `Database` serves every request: each tool call opens a unit of work on
`db.for_tenant(tenant)`, which shares the database's pool.
"""

from __future__ import annotations

from typing import Any, Literal

from memorm.compat._extras import missing_extra

try:
    from mcp.server.mcpserver import MCPServer
except ImportError as error:
    raise missing_extra(__name__, "mcp", error) from error

from memorm import __version__
from memorm.db import Database
from memorm.embeddings import Embedder, HashingEmbedder
from memorm.mcp.auth import auth_settings, verifier
from memorm.mcp.resources import register_resources
from memorm.mcp.scope import Scope
from memorm.mcp.tokens import TokenTable
from memorm.mcp.tools import register_tools
from memorm.tenancy import DEFAULT_TENANT, check_tenant

__all__ = ["INSTRUCTIONS", "NAME", "create_server"]

NAME = "memorm"
"""The server's name, as clients list it."""

INSTRUCTIONS = """\
Long-term memory for an agent, kept in a database.
Start with get_or_create_agent (by name) and get_or_create_session (by your key for the \
conversation); keep their ids. append_messages stores each turn; read_context returns \
the newest messages that fit a token budget; search_messages finds earlier ones by their \
words. insert_archival_memory and search_archival_memory keep and find facts (similarity \
by the server's embedder; by default a word-hashing stand-in, not a semantic model). \
read_core_memory and update_core_memory hold the agent's always-present notes; an update \
needs the version you read, and fails if someone wrote since."""


def create_server(
    db: Database,
    *,
    tenant: str | None = None,
    tokens: TokenTable | None = None,
    embedder: Embedder | None = None,
    issuer_url: str = "http://127.0.0.1:8000",
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "WARNING",
) -> MCPServer[Any]:
    """memorm's MCP server on `db`: its tools and resources (see docs/integrations/mcp.md).

    Args:
        db: the database every request uses.
        tenant: the tenant of every request (default `"default"`); not with `tokens`.
        tokens: serve HTTP with bearer tokens, each naming its tenant; a
            request without a known token gets 401 and reaches no tool.
        embedder: embeds archival memory (default `HashingEmbedder()`, a
            word-hashing stand-in, not a semantic model).
        issuer_url: with `tokens`, the base URL the server answers on (the
            SDK's auth settings name who issued the tokens: whoever runs the
            server, with `memorm mcp hash-token`).
        log_level: the SDK's log level (its logs go to stderr, never a token).

    Example:
        ```python
        from mcp import Client

        async with Client(create_server(db)) as client:
            result = await client.call_tool("get_or_create_agent", {"name": "sam"})
        ```
    """
    if tokens is not None and tenant is not None:
        raise ValueError("give a tenant (stdio) or tokens (HTTP), not both")
    fixed = None if tokens is not None else check_tenant(tenant or DEFAULT_TENANT)
    scope = Scope(db, embedder or HashingEmbedder(), fixed)
    server: MCPServer[Any] = MCPServer(
        NAME,
        version=__version__,
        instructions=INSTRUCTIONS,
        log_level=log_level,
        auth=None if tokens is None else auth_settings(issuer_url),
        token_verifier=None if tokens is None else verifier(tokens),
    )
    register_tools(server, scope)
    register_resources(server, scope)
    return server
