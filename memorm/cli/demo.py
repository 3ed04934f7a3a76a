"""``memorm demo``: the README's first command."""

from __future__ import annotations

import argparse
from typing import Any

from memorm.demo import run_demo

__all__ = ["register"]


async def _demo(args: argparse.Namespace) -> int:
    await run_demo(args.url)
    return 0


def register(commands: Any) -> None:
    demo = commands.add_parser("demo", help="a short tour on the SQLite default (or --url)")
    demo.add_argument("--url", help="database URL")
    demo.set_defaults(handler=_demo)
