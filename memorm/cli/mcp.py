"""`memorm mcp`: serve agents' memory to MCP clients; `memorm mcp hash-token`: a token's stored hash.

```
memorm mcp --url URL                                   # stdio, the default tenant
memorm mcp --url URL --tenant acme                     # stdio, another tenant
memorm mcp --url URL --transport http --tokens tokens.json --port 8000
printf %s "$TOKEN" | memorm mcp hash-token             # sha256:… for the tokens file
memorm mcp hash-token --new                            # a new token and its hash
```

Registering imports nothing of the MCP SDK; the handlers do, and without the
extra say which to install (`pip install 'memorm[mcp]'`).  On stdio nothing
but the protocol is written to stdout.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from memorm.cli.tenant_option import tenant_name
from memorm.errors import MemormError, ValidationError

__all__ = ["register"]

DEFAULT_PORT = 8000
TOKENS_VARIABLE = "MEMORM_MCP_TOKENS"


def _port(text: str) -> int:
    if not text.isascii() or not text.isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {text!r}")
    return int(text)


def _sdk() -> Any:
    """`memorm.mcp`, or a one-line error naming the extra to install."""
    try:
        import memorm.mcp
    except ImportError as error:
        raise MemormError(str(error)) from error
    return memorm.mcp


async def _serve(args: argparse.Namespace) -> int:
    from memorm.cli.open_database import open_database

    mcp = _sdk()
    embedder = mcp.load_embedder(args.embedder)
    tokens_file = args.tokens or os.environ.get(TOKENS_VARIABLE)
    if args.transport == "http":
        if not tokens_file:
            raise ValidationError(
                f"--transport http needs --tokens FILE (or {TOKENS_VARIABLE}): every request must "
                "carry a bearer token naming its tenant (`memorm mcp hash-token` makes the file's entries)"
            )
        if args.tenant is not None:
            raise ValidationError("--tenant is for stdio; on HTTP each request's token names its tenant")
        tokens = mcp.TokenTable.from_file(tokens_file)
    elif args.tokens:
        raise ValidationError("--tokens is for --transport http; on stdio give --tenant NAME")
    async with open_database(args.url) as db:
        await db.check_schema()  # a database without memorm's schema: one line now, not per call
        if args.transport == "stdio":
            await mcp.serve_stdio(db, tenant=args.tenant, embedder=embedder)
        else:
            print(
                f"memorm mcp: serving http://{args.host}:{args.port}{mcp.PATH} for "
                f"{len(tokens.tenants)} tenant(s), embedder {embedder.model}",
                file=sys.stderr,
            )
            await mcp.serve_http(db, tokens, embedder=embedder, host=args.host, port=args.port)
    return 0


async def _hash_token(args: argparse.Namespace) -> int:
    from memorm.mcp.tokens import hash_token, new_token

    if args.new:
        token = new_token()
        print(f"token: {token}")
        print(f"hash:  {hash_token(token)}")
        return 0
    if sys.stdin.isatty():
        import getpass

        token = getpass.getpass("token: ")
    else:
        token = sys.stdin.read().removesuffix("\n").removesuffix("\r")
    print(hash_token(token))
    return 0


def register(commands: Any) -> None:
    mcp = commands.add_parser(
        "mcp",
        help="serve agents' memory to MCP clients (stdio, or HTTP with a tenant per token)",
        description="Serve memorm's tools and resources over the Model Context Protocol: append and "
        "search conversations, context windows under a token budget, archival memory, core memory. "
        "Needs the `mcp` extra: pip install 'memorm[mcp]'.",
    )
    mcp.add_argument("--url", help="database URL (default: MEMORM_DATABASE_URL, else sqlite:///memorm.db)")
    mcp.add_argument(
        "--transport", choices=("stdio", "http"), default="stdio", help="how clients connect (default stdio)"
    )
    mcp.add_argument("--host", default="127.0.0.1", help="HTTP: the address to listen on (default 127.0.0.1)")
    mcp.add_argument(
        "--port",
        type=_port,
        default=DEFAULT_PORT,
        help=f"HTTP: the port to listen on (default {DEFAULT_PORT})",
    )
    mcp.add_argument(
        "--tokens",
        metavar="FILE",
        help=f"HTTP: a JSON file of tenant -> sha256 hash of its bearer token (or {TOKENS_VARIABLE})",
    )
    mcp.add_argument(
        "--tenant", type=tenant_name, metavar="NAME", help="stdio: the tenant to work in (default: default)"
    )
    mcp.add_argument(
        "--embedder",
        default="hashing",
        metavar="SPEC",
        help="archival memory's embedder: hashing (the default: a word-hashing stand-in, not a semantic "
        "model), hashing:DIM, or module:attribute naming your own",
    )
    mcp.set_defaults(handler=_serve)
    actions = mcp.add_subparsers(dest="action", metavar="hash-token")
    hash_token = actions.add_parser(
        "hash-token",
        help="print the sha256 hash of a bearer token, for the tokens file",
        description="Read a token from stdin (or a prompt) and print its hash, `sha256:…`, as the "
        "tokens file holds it. The token itself is never stored.",
    )
    hash_token.add_argument(
        "--new", action="store_true", help="make a new random token; print it and its hash"
    )
    hash_token.set_defaults(handler=_hash_token)
