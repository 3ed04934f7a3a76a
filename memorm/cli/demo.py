"""`memorm demo`: the README's first command."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


async def _demo(args: argparse.Namespace) -> int:
    from memorm.cli.open_database import open_database
    from memorm.demo import run_demo

    async with open_database(args.url, create=True) as db:
        await run_demo(db)
    return 0


def register(commands: Any) -> None:
    demo = commands.add_parser("demo", help="a short tour on the SQLite default (or --url)")
    demo.add_argument("--url", help="database URL")
    demo.set_defaults(handler=_demo)
