"""`memorm import-memgpt DIR`: agents saved by MemGPT (as JSON) into memorm."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["register"]


async def _import_memgpt(args: argparse.Namespace) -> int:
    from memorm.cli.open_database import open_database
    from memorm.embeddings import HashingEmbedder
    from memorm.legacy.memgpt import import_agents, read_directory

    # Everything is read and checked first: a refused directory writes nothing.
    agents = read_directory(Path(args.directory), only=args.agent)
    embedder = HashingEmbedder()
    async with open_database(args.url) as db:
        await db.check_schema()
        results = await import_agents(db, agents, embedder=embedder)
    for result in results:
        if result.imported:
            print(
                f"imported agent {result.name!r}: {result.messages} messages in one session, "
                f"{result.passages} archival passages"
            )
        else:
            print(f"skipped agent {result.name!r}: {result.reason}")
    if any(result.imported and result.passages for result in results):
        print(f"archival passages are embedded with {embedder.model}, a stand-in: re-embed with your model")
    return 0


def register(commands: Any) -> None:
    command = commands.add_parser(
        "import-memgpt",
        help="import a MemGPT-style directory of agent state (JSON only; pickles are refused)",
        description="Import DIR/<agent>/{config,messages,archival}.json; see docs/cli.md for the layout.",
    )
    command.add_argument("directory", metavar="DIR", help="a folder of agent folders, or one agent's folder")
    command.add_argument("--agent", metavar="NAME", help="import only the agent called NAME")
    command.add_argument("--url", help="database URL")
    command.set_defaults(handler=_import_memgpt)
