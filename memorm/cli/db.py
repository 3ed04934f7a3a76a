"""`memorm db upgrade|downgrade|current|check`: the schema's migrations."""

from __future__ import annotations

import argparse
from typing import Any

from memorm.cli.inspect import run_check as _check

__all__ = ["register"]


async def _upgrade(args: argparse.Namespace) -> int:
    from memorm.cli.reach import open_database

    async with open_database(args.url, create=True) as db:
        await db.upgrade(args.revision or "head")
        print(f"upgraded to {await db.current_revision()}")
    return 0


async def _downgrade(args: argparse.Namespace) -> int:
    from memorm.cli.reach import open_database

    async with open_database(args.url) as db:
        await db.downgrade(args.revision)
        print(f"downgraded to {await db.current_revision() or 'base (empty)'}")
    return 0


async def _current(args: argparse.Namespace) -> int:
    from memorm.cli.reach import open_database

    async with open_database(args.url) as db:
        print(await db.current_revision() or "base (no memorm schema)")
    return 0


def register(commands: Any) -> None:
    db = commands.add_parser("db", help="schema migrations")
    actions = db.add_subparsers(dest="action", required=True, metavar="ACTION")
    upgrade = actions.add_parser(
        "upgrade", help="migrate to a revision (default: head); creates a SQLite file"
    )
    upgrade.add_argument("revision", nargs="?", help="alembic revision")
    upgrade.set_defaults(handler=_upgrade)
    downgrade = actions.add_parser("downgrade", help="migrate down to a revision ('base' empties it)")
    downgrade.add_argument("revision", help="alembic revision")
    downgrade.set_defaults(handler=_downgrade)
    current = actions.add_parser("current", help="the schema's revision")
    current.set_defaults(handler=_current)
    check = actions.add_parser("check", help="exit 1 if the schema is behind head or drifts from the models")
    check.set_defaults(handler=_check)
    for action in (upgrade, downgrade, current, check):
        action.add_argument("--url", help="database URL")
