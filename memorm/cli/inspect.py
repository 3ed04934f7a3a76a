"""`memorm check` (the schema against the models) and `memorm stats` (what the database holds)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memorm.db import Database

__all__ = ["register", "run_check"]

TOP_SESSIONS = 10


async def run_check(args: argparse.Namespace) -> int:
    """`memorm db check` (and its alias `memorm check`): schema at head, and no drift."""
    from memorm.cli.reach import open_database
    from memorm.migrate import check_drift

    async with open_database(args.url) as db:
        differences = await check_drift(db)
        where = db.url.render_as_string(hide_password=True)
    if differences:
        print(f"memorm: the schema at {where} drifted from memorm's models:", file=sys.stderr)
        for difference in differences:
            print(f"  - {difference}", file=sys.stderr)
        print("memorm: fix the schema by hand, or restore it from a backup", file=sys.stderr)
        return 1
    print(f"the schema at {where} matches memorm's models")
    return 0


def _size(number: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if number < 1024 or unit == "GiB":
            return f"{number:.0f} {unit}" if unit == "B" else f"{number:.1f} {unit}"
        number /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


async def _database_size(db: Database, connection: Any) -> int:
    """Bytes on disk: SQLite's file and its WAL; on Postgres, memorm's tables with indexes and TOAST."""
    from pathlib import Path

    import sqlalchemy as sa

    from memorm.models import metadata

    if db.dialect == "sqlite":
        path = Path(db.url.database or "")
        files = [path, path.with_name(path.name + "-wal")]
        return sum(file.stat().st_size for file in files if file.is_file())
    total = 0
    for name in sorted(metadata.tables):  # to_regclass: NULL, not an error, for a missing table
        size = sa.func.pg_total_relation_size(sa.func.to_regclass(name))
        total += int(await connection.scalar(sa.select(sa.func.coalesce(size, 0))) or 0)
    return total


async def _stats(args: argparse.Namespace) -> int:
    import sqlalchemy as sa
    from rich.console import Console
    from rich.table import Table

    from memorm.cli.reach import open_database
    from memorm.models import AGENTS, MESSAGES, SESSIONS, metadata
    from memorm.translate import READ_ONLY
    from memorm.types import utcnow

    async with open_database(args.url) as db:
        await db.check_schema()
        engine = db.engine.execution_options(**{READ_ONLY: True})
        async with engine.connect() as connection:
            counts = {
                name: int(await connection.scalar(sa.select(sa.func.count()).select_from(table)) or 0)
                for name, table in sorted(metadata.tables.items())
            }
            messages = sa.func.count(MESSAGES.c.id).label("messages")
            largest = (
                await connection.execute(
                    sa.select(AGENTS.c.name, SESSIONS.c.title, SESSIONS.c.id, messages)
                    .join(AGENTS, AGENTS.c.id == SESSIONS.c.agent_id)
                    .outerjoin(MESSAGES, MESSAGES.c.session_id == SESSIONS.c.id)
                    .group_by(AGENTS.c.name, SESSIONS.c.title, SESSIONS.c.id)
                    .order_by(messages.desc(), SESSIONS.c.id)
                    .limit(TOP_SESSIONS)
                )
            ).all()
            expired = int(
                await connection.scalar(sa.select(sa.func.count()).where(SESSIONS.c.expires_at <= utcnow()))
                or 0
            )
            size = await _database_size(db, connection)
        where = db.url.render_as_string(hide_password=True)

    console = Console()
    if not console.is_terminal:  # piped or captured: wide enough for a session id, unwrapped
        console = Console(width=120)
    console.print(f"memorm at {where}")
    rows = Table(title="rows per table")
    rows.add_column("table")
    rows.add_column("rows", justify="right")
    for name, count in counts.items():
        rows.add_row(name, str(count))
    console.print(rows)
    if expired:
        console.print(f"sessions past their expiry, awaiting `memorm purge --expired`: {expired}")
    sessions = Table(title=f"largest sessions (top {TOP_SESSIONS})")
    sessions.add_column("agent")
    sessions.add_column("title")
    sessions.add_column("session id", no_wrap=True)
    sessions.add_column("messages", justify="right")
    for agent, title, session_id, count in largest:
        sessions.add_row(agent, title or "-", str(session_id), str(count))
    console.print(sessions)
    what = "database file and WAL" if db.dialect == "sqlite" else "memorm's tables and indexes"
    console.print(f"size on disk ({what}): {_size(size)} ({size} bytes)")
    return 0


def register(commands: Any) -> None:
    check = commands.add_parser(
        "check", help="compare the live schema with memorm's models (exit 1 on drift)"
    )
    check.set_defaults(handler=run_check)
    stats = commands.add_parser("stats", help="rows per table, the largest sessions, size on disk")
    stats.set_defaults(handler=_stats)
    for command in (check, stats):
        command.add_argument("--url", help="database URL")
