"""`memorm copy|export|import`: moving whole databases (or one tenant), with a progress bar.

The logic lives in `memorm.transfer`; this module parses arguments,
draws progress with rich (on stderr, and only on a terminal) and prints a
summary.  A failed verification prints the tables that differ and exits 1.
The databases read must exist; the destination of `copy` and the target of
`import` are created (SQLite) and migrated when empty, once everything else
is checked: one refused is left as it was (see `memorm.transfer.target`).
`export` writes a new file (`--force` replaces a regular one; see
`memorm.transfer.files`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from memorm.cli.graph_types import add_allow_type_option

if TYPE_CHECKING:
    from memorm.transfer.copy import CopyReport

__all__ = ["register"]

# memorm.transfer's DEFAULT_BATCH_SIZE, stated for --help without importing it
# (tests/test_cli_transfer.py checks that they agree).
DEFAULT_BATCH_SIZE = 5_000
MAX_BATCH_SIZE = 20_000


def _summary(verb: str, inserted: Mapping[str, int], skipped: Mapping[str, int]) -> None:
    from memorm.transfer import TABLES

    for table in TABLES:
        name = table.name
        extra = f" ({skipped[name]:,} already there)" if skipped.get(name) else ""
        print(f"{verb} {inserted.get(name, 0):,} {name}{extra}")


def _analyzed(tables: list[str]) -> None:
    if tables:
        print(f"analyzed {len(tables)} tables (Postgres planner statistics): {', '.join(tables)}")


def _verdict(report: CopyReport) -> int:
    if report.problems:
        print("memorm: error: verification failed:", file=sys.stderr)
        for problem in report.problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    rows = sum(digest.count for digest in report.destination.values())
    of = "" if report.tenant is None else f" of tenant {report.tenant!r}"
    print(f"verified: {rows:,} rows{of} in {len(report.destination)} tables match (counts and sha256)")
    return 0


async def _copy(args: argparse.Namespace) -> int:
    from memorm.cli.open_database import open_database
    from memorm.cli.progress import Bars, progress_bar
    from memorm.transfer import copy_database
    from memorm.transfer.copy import verify_copy
    from memorm.transfer.scope import check_scope

    tenant = check_scope(args.tenant)  # a bad name creates no destination
    # The source first: a missing source creates no destination.
    async with (
        open_database(args.source) as source,
        open_database(args.destination, create=not args.verify_only) as destination,
    ):
        with progress_bar() as progress:
            bars = Bars(progress)
            if args.verify_only:
                report = await verify_copy(
                    source, destination, tenant=tenant, batch_size=args.batch_size, reporter=bars
                )
            else:
                report = await copy_database(
                    source,
                    destination,
                    tenant=tenant,
                    batch_size=args.batch_size,
                    verify=not args.no_verify,
                    reporter=bars,
                )
    if not args.verify_only:
        _summary("copied", report.inserted, report.skipped)
        _analyzed(report.analyzed)
    return _verdict(report) if report.destination else 0


async def _export(args: argparse.Namespace) -> int:
    from memorm.cli.open_database import open_database
    from memorm.cli.progress import Bars, progress_bar
    from memorm.transfer import export_jsonl
    from memorm.transfer.scope import check_scope

    tenant = check_scope(args.tenant)
    async with open_database(args.url) as db:
        with progress_bar() as progress:
            written = await export_jsonl(
                db,
                args.file,
                tenant=tenant,
                batch_size=args.batch_size,
                reporter=Bars(progress),
                overwrite=args.force,
            )
    _summary("exported", written, {})
    return 0


async def _import(args: argparse.Namespace) -> int:
    from memorm.cli.open_database import open_database
    from memorm.cli.progress import Bars, progress_bar
    from memorm.config import resolve_url
    from memorm.transfer import import_jsonl
    from memorm.transfer.jsonl import read_header
    from memorm.transfer.scope import check_scope

    resolve_url(args.url)  # a bad URL is said first,
    tenant = check_scope(args.tenant)  # then a bad tenant,
    read_header(args.file)  # then a file that is no export: none creates a database
    async with open_database(args.url, create=True) as db:
        with progress_bar() as progress:
            report = await import_jsonl(
                db,
                args.file,
                tenant=tenant,
                batch_size=args.batch_size,
                reporter=Bars(progress),
                allowed_types=args.allow_type,
            )
    _summary("imported", report.inserted, report.skipped)
    _analyzed(report.analyzed)
    return 0


def _batch_size(text: str) -> int:
    value = int(text)
    if not 1 <= value <= MAX_BATCH_SIZE:
        raise argparse.ArgumentTypeError(f"expected 1 to {MAX_BATCH_SIZE:,} rows")
    return value


def register(commands: Any) -> None:
    copy = commands.add_parser(
        "copy", help="copy every row from one database to another (re-runnable), then verify"
    )
    copy.add_argument("source", metavar="SRC_URL", help="database to read")
    copy.add_argument(
        "destination", metavar="DST_URL", help="database to write (migrated to head if it is empty)"
    )
    check = copy.add_mutually_exclusive_group()
    check.add_argument(
        "--verify-only", action="store_true", help="compare counts and checksums; copy nothing"
    )
    check.add_argument("--no-verify", action="store_true", help="skip the final comparison")
    copy.set_defaults(handler=_copy)
    export = commands.add_parser("export", help="write a database to a JSON Lines file (.gz compresses)")
    export.add_argument("url", metavar="URL", help="database to read")
    export.add_argument("file", metavar="FILE", help="file to write (a new one, unless --force)")
    export.add_argument(
        "--force", action="store_true", help="replace FILE if it exists (a regular file: nothing else)"
    )
    export.set_defaults(handler=_export)
    import_ = commands.add_parser("import", help="load a JSON Lines export (skips rows already there)")
    import_.add_argument(
        "url", metavar="URL", help="database to write (migrated to head if it is empty; else at head)"
    )
    import_.add_argument("file", metavar="FILE", help="export to read")
    add_allow_type_option(import_)
    import_.set_defaults(handler=_import)
    for command, what in ((copy, "copy"), (export, "export"), (import_, "import")):
        command.add_argument(
            "--tenant",
            metavar="NAME",
            help=f"{what} this tenant's rows only (default: every tenant's, which on Postgres "
            "needs a role that bypasses row-level security)",
        )
        command.add_argument(
            "--batch-size",
            type=_batch_size,
            default=DEFAULT_BATCH_SIZE,
            help=f"rows per statement and transaction (default {DEFAULT_BATCH_SIZE:,})",
        )
