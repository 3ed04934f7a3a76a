"""`memorm tenant list|delete`: the tenants a database holds, and deleting one.

`list` reads every tenant (on Postgres, with a role that bypasses row-level
security); `delete` works in the tenant's own units of work, so the
application role may run it too.  Both call [`memorm.tenants`][memorm.tenants].
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from memorm.cli.tenant_option import tenant_name

__all__ = ["register"]

MAX_BATCH = 1_000_000  # as memorm.tenants.delete_tenant checks it
DEFAULT_BATCH = 5_000  # memorm.tenants.DELETE_BATCH, without importing it for --help


def _batch_size(text: str) -> int:
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= MAX_BATCH:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1 to {MAX_BATCH:,}, got {text!r}")
    return int(text)


def _table(tenants: dict[str, dict[str, int]]) -> list[str]:
    """Aligned lines: a header, then one tenant a line with its rows per table."""
    tables = list(next(iter(tenants.values())))
    rows = [["tenant", *tables]] + [
        [name, *(f"{count:,}" for count in counts.values())] for name, counts in tenants.items()
    ]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return [
        "  ".join(
            cell.ljust(width) if column == 0 else cell.rjust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


async def _list(args: argparse.Namespace) -> int:
    from memorm.cli.open_database import open_database
    from memorm.cli.tenant_option import every_tenant
    from memorm.tenants import list_tenants

    async with open_database(args.url) as db:
        await every_tenant(db, "tenant list")
        tenants = await list_tenants(db)
    if args.json:
        print(json.dumps(tenants, ensure_ascii=False))
    elif not tenants:
        print("no tenants: the database holds no rows")
    else:
        print("\n".join(_table(tenants)))
    return 0


async def _delete(args: argparse.Namespace) -> int:
    from memorm.cli.open_database import open_database
    from memorm.cli.progress import Bars, progress_bar
    from memorm.tenants import delete_tenant

    async with open_database(args.url) as db:
        with progress_bar() as progress:
            counts = await delete_tenant(
                db, args.name, batch=args.batch_size, dry_run=args.dry_run, reporter=Bars(progress)
            )
    if not any(counts.values()):
        print(f"tenant {args.name!r} has no rows: nothing to delete")
        return 0
    verb = "would delete" if args.dry_run else "deleted"
    for table, count in counts.items():
        print(f"{verb} {count:,} {table}")
    return 0


def register(commands: Any) -> None:
    tenant = commands.add_parser("tenant", help="list the tenants, or delete one with all its rows")
    actions = tenant.add_subparsers(dest="action", required=True, metavar="ACTION")
    list_ = actions.add_parser(
        "list",
        help="every tenant with its rows per table",
        description="Every tenant that has rows, with its row count per table. Reads every tenant: "
        "on Postgres, connect as a role that bypasses row-level security.",
    )
    list_.add_argument("--json", action="store_true", help="one JSON object: {tenant: {table: rows}}")
    list_.set_defaults(handler=_list)
    delete = actions.add_parser(
        "delete",
        help="delete every row of a tenant, in batches",
        description="Delete every agent, embedding model, session, message and archival passage of "
        "the tenant, and its sessions' graph state (LangGraph checkpoints), in batches of "
        "--batch-size rows, each its own transaction (full-text entries go too). Other tenants' "
        "rows are untouched; the tenant's own traffic may go on meanwhile.",
    )
    delete.add_argument("name", type=tenant_name, metavar="NAME", help="the tenant")
    delete.add_argument("--dry-run", action="store_true", help="print the rows there are; delete nothing")
    delete.add_argument(
        "--batch-size",
        type=_batch_size,
        default=DEFAULT_BATCH,
        metavar="N",
        help=f"rows per DELETE and per transaction (default {DEFAULT_BATCH:,})",
    )
    delete.set_defaults(handler=_delete)
    for action in (list_, delete):
        action.add_argument("--url", help="database URL")
