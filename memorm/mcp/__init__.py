"""`memorm mcp`: agents' memory for MCP clients (extra `mcp`), over stdio or streamable HTTP.

Agents outside Python reach memorm through the Model Context Protocol: the
server's tools append and search conversations, read context windows under a
token budget, keep and search archival memory, and read and update core
memory; its resources show an agent's core memory and a session's recent
messages.  See docs/integrations/mcp.md.

* `create_server` (`memorm.mcp.server`): the SDK's `MCPServer`, on one `Database`.
* `http_app`, `serve_http`, `serve_stdio` (`memorm.mcp.run`): the transports.
* `TokenTable`, `hash_token`, `new_token` (`memorm.mcp.tokens`): bearer
  tokens, hashed at rest, each naming one tenant.
* `load_embedder` (`memorm.mcp.embedders`): what `--embedder` names.
"""

from __future__ import annotations

from memorm.mcp.embedders import DEFAULT_EMBEDDER, load_embedder
from memorm.mcp.run import PATH, http_app, serve_http, serve_stdio
from memorm.mcp.server import create_server
from memorm.mcp.tokens import TokenTable, hash_token, new_token

__all__ = [
    "DEFAULT_EMBEDDER",
    "PATH",
    "TokenTable",
    "create_server",
    "hash_token",
    "http_app",
    "load_embedder",
    "new_token",
    "serve_http",
    "serve_stdio",
]
