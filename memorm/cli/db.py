"""`memorm db upgrade|downgrade|current|check`: the schema's migrations; `db create-role|distribute|scrub`."""

from __future__ import annotations

import argparse
import os
from typing import Any

from memorm.cli.inspect import run_check as _check

__all__ = ["register"]


async def _upgrade(args: argparse.Namespace) -> int:
    from memorm.cli.open_database import open_database

    async with open_database(args.url, create=True) as db:
        await db.upgrade(args.revision or "head")
        print(f"upgraded to {await db.current_revision()}")
    return 0


async def _downgrade(args: argparse.Namespace) -> int:
    from memorm.cli.open_database import open_database

    async with open_database(args.url) as db:
        await db.downgrade(args.revision)
        print(f"downgraded to {await db.current_revision() or 'base (empty)'}")
    return 0


async def _current(args: argparse.Namespace) -> int:
    from memorm.cli.open_database import open_database

    async with open_database(args.url) as db:
        print(await db.current_revision() or "base (no memorm schema)")
    return 0


async def _create_role(args: argparse.Namespace) -> int:
    from memorm.cli.open_database import open_database
    from memorm.errors import ValidationError
    from memorm.tenants import create_role

    password = None
    if args.password_env is not None:  # from the environment: argv shows in `ps` and shell history
        password = os.environ.get(args.password_env)
        if not password:
            state = "is empty" if password == "" else "is not set"
            raise ValidationError(f"--password-env: the environment variable {args.password_env} {state}")
    async with open_database(args.url) as db:
        for line in await create_role(db, args.role, password=password):
            print(line)
    return 0


async def _scrub(args: argparse.Namespace) -> int:
    from memorm.cli.open_database import open_database

    async with open_database(args.url) as db:
        done = await db.scrub(reindex=args.reindex)  # what it skipped, it warns about (on stderr)
    for verb, names in (("vacuumed", done.vacuumed), ("rebuilt", done.reindexed), ("merged", done.merged)):
        if names:
            print(f"{verb} {', '.join(names)}")
    if db.dialect == "sqlite" and done.complete:
        print("truncated the write-ahead log")
    return 0 if done.complete else 1


async def _distribute(args: argparse.Namespace) -> int:
    from memorm.cli.open_database import open_database

    async with open_database(args.url) as db:
        done = await db.distribute()
    for line in done or ["already distributed: nothing to do"]:
        print(line)
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
    distribute = actions.add_parser(
        "distribute",
        help="Citus: distribute memorm's tables by agent (after db upgrade; safe to run again)",
    )
    distribute.set_defaults(handler=_distribute)
    scrub = actions.add_parser(
        "scrub",
        help="clear what the files still hold of deleted rows (VACUUM; SQLite: merge, checkpoint)",
        description="Clear what the database files still hold of deleted rows, as db.scrub() does: on "
        "Postgres VACUUM memorm's tables (run it as their owner: VACUUM skips a table its role does not "
        "own, and this exits 1 naming what it skipped); on SQLite merge the full-text indexes and "
        "truncate the write-ahead log.",
    )
    scrub.add_argument(
        "--reindex",
        action="store_true",
        help="Postgres: also rebuild the full-text indexes, which keep deleted words as keys",
    )
    scrub.set_defaults(handler=_scrub)
    for action in (upgrade, downgrade, current, check, distribute, scrub):
        action.add_argument("--url", help="database URL")
    role = actions.add_parser(
        "create-role",
        help="Postgres: create (or update) the application's login role, subject to row-level security",
        description="Create ROLE, or bring an existing one in line: a login role that may read and "
        "write memorm's tables but is never a superuser, never BYPASSRLS and never their owner, so "
        "row-level security keeps each unit of work to its tenant. Safe to run again.",
    )
    role.add_argument("role", metavar="ROLE", help="the role's name")
    role.add_argument(
        "--url",
        required=True,
        metavar="ADMIN_URL",
        help="the database, as a superuser or a CREATEROLE role that owns memorm's tables",
    )
    role.add_argument(
        "--password-env",
        metavar="VAR",
        help="set the role's password to the value of the environment variable VAR (never on the "
        "command line, where ps and shell history would show it)",
    )
    role.set_defaults(handler=_create_role)
