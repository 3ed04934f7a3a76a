"""Running `memorm mcp`: on stdio for one local client, or on streamable HTTP with a tenant per token.

Both run on the event loop they are awaited on, with the one `Database`
given; neither returns until the client leaves (stdio) or the server is
stopped (HTTP: SIGINT or SIGTERM, or `should_exit` on the uvicorn server).
"""

from __future__ import annotations

import socket
from typing import Any

from memorm.compat._extras import missing_extra

try:
    import uvicorn
    from starlette.applications import Starlette
except ImportError as error:
    raise missing_extra(__name__, "mcp", error) from error

from memorm.db import Database
from memorm.embeddings import Embedder
from memorm.mcp.server import create_server
from memorm.mcp.tokens import TokenTable

__all__ = ["PATH", "http_app", "serve_http", "serve_stdio"]

PATH = "/mcp"
"""Where the HTTP server answers MCP requests: `http://HOST:PORT/mcp`."""


def http_app(
    db: Database,
    tokens: TokenTable,
    *,
    embedder: Embedder | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
) -> Starlette:
    """The ASGI app of the streamable HTTP transport: `PATH`, behind bearer tokens.

    A request without a token the table knows gets 401.  On a loopback
    `host`, the SDK also refuses requests whose `Host` or `Origin` header
    names another (DNS rebinding).  Run it with any ASGI server; its lifespan
    runs the SDK's session manager, and serves once.
    """
    server = create_server(
        db, tokens=tokens, embedder=embedder, issuer_url=f"http://{_url_host(host)}:{port}"
    )
    return server.streamable_http_app(streamable_http_path=PATH, host=host)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


async def serve_http(
    db: Database,
    tokens: TokenTable,
    *,
    embedder: Embedder | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    sockets: list[socket.socket] | None = None,
    **uvicorn_options: Any,
) -> None:
    """Serve `http_app` with uvicorn until stopped (SIGINT, SIGTERM).

    Args:
        db: the database every request uses.
        tokens: which bearer token names which tenant.
        embedder: embeds archival memory (default: the word-hashing stand-in).
        host: the address to listen on.
        port: the port to listen on.
        sockets: listen on these instead (a test's port 0).
        **uvicorn_options: more `uvicorn.Config` settings (`log_level`…).
    """
    app = http_app(db, tokens, embedder=embedder, host=host, port=port)
    config = uvicorn.Config(app, host=host, port=port, **{"log_level": "warning", **uvicorn_options})
    await uvicorn.Server(config).serve(sockets=sockets)


async def serve_stdio(db: Database, *, tenant: str | None = None, embedder: Embedder | None = None) -> None:
    """Serve one client on this process's stdin and stdout, in `tenant` (default `"default"`)."""
    await create_server(db, tenant=tenant, embedder=embedder).run_stdio_async()
