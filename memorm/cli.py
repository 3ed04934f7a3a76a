"""The ``memorm`` command.

``memorm demo`` runs a short tour on the embedded SQLite default;
``memorm db upgrade|downgrade|current`` manage the schema.  Every command takes
``--url`` (else ``MEMORM_DATABASE_URL``, else ``sqlite:///memorm.db``).
Errors print one line and exit non-zero; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from memorm.db import Database
from memorm.demo import run_demo
from memorm.errors import MemormError

__all__ = ["main"]


async def _db_command(args: argparse.Namespace) -> None:
    async with Database(args.url) as db:
        if args.action == "upgrade":
            await db.upgrade(args.revision or "head")
            print(f"upgraded to {await db.current_revision()}")
        elif args.action == "downgrade":
            await db.downgrade(args.revision)
            print(f"downgraded to {await db.current_revision() or 'base (empty)'}")
        else:
            print(await db.current_revision() or "base (no memorm schema)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memorm", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="a short tour on the SQLite default (or --url)")
    demo.add_argument("--url", help="database URL")

    db = commands.add_parser("db", help="schema migrations")
    actions = db.add_subparsers(dest="action", required=True)
    for action, needs_revision in (("upgrade", False), ("downgrade", True), ("current", None)):
        sub = actions.add_parser(action)
        sub.add_argument("--url", help="database URL")
        if needs_revision is not None:
            sub.add_argument("revision", nargs=None if needs_revision else "?", help="alembic revision")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            asyncio.run(run_demo(args.url))
        else:
            asyncio.run(_db_command(args))
    except (MemormError, OSError) as error:
        if args.debug:
            raise
        print(f"memorm: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
