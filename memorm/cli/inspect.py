"""`memorm check` (the schema against the models) and `memorm stats` (what the database holds).

`memorm stats --tenant NAME` counts that tenant's rows only (and says so
when it holds none); without it, every tenant's (on Postgres, with a role
that bypasses row-level security).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memorm.cli.tenant_option import add_tenant_option

if TYPE_CHECKING:
    from memorm.db import Database

__all__ = ["register", "run_check"]

TOP_SESSIONS = 10


async def run_check(args: argparse.Namespace) -> int:
    """`memorm db check` (and its alias `memorm check`): schema at head, and no drift."""
    from memorm.cli.open_database import open_database
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
    """Bytes on disk: SQLite's file and its WAL; on Postgres, memorm's tables with indexes and TOAST.

    On a Citus cluster, the tables' shards on every node (a reference table once per node).
    """
    from pathlib import Path

    import sqlalchemy as sa

    from memorm.models import metadata

    if db.dialect == "sqlite":
        path = Path(db.url.database or "")
        files = [path, path.with_name(path.name + "-wal")]
        return sum(file.stat().st_size for file in files if file.is_file())
    total = 0
    # On Citus the coordinator's tables are empty shells: the shards' sizes are citus_'s.
    measure = sa.func.citus_total_relation_size if db.distributed else sa.func.pg_total_relation_size
    for name in sorted(metadata.tables):  # to_regclass: NULL, not an error, for a missing table
        size = measure(sa.func.to_regclass(name))
        total += int(await connection.scalar(sa.select(sa.func.coalesce(size, 0))) or 0)
    return total


@dataclass
class _Stats:
    """What `memorm stats` reports, of one tenant or of every tenant (`tenant` None)."""

    tenant: str | None
    tenants: int  # tenants with rows in the database (counted for every tenant's stats only)
    counts: dict[str, int]
    largest: list[tuple[str, str, str | None, Any, int]]  # tenant, agent, title, session id, messages
    expired: int
    size: int


async def _gather(db: Database, tenant: str | None) -> _Stats:
    """The stats of `tenant`'s rows, or of every tenant's (`tenant` None)."""
    import sqlalchemy as sa

    from memorm.models import AGENTS, MESSAGES, SESSIONS, metadata
    from memorm.types import utcnow

    def scope(*tables: sa.Table) -> list[sa.ColumnElement[bool]]:
        return [] if tenant is None else [table.c.tenant == tenant for table in tables]

    def count(*where: sa.ColumnElement[bool]) -> sa.Select[Any]:
        return sa.select(sa.func.count()).where(*where)

    messages = sa.func.count(MESSAGES.c.id).label("messages")
    # Ids are unique within a tenant only: every join pairs the tenants too.
    largest = (
        sa.select(SESSIONS.c.tenant, AGENTS.c.name, SESSIONS.c.title, SESSIONS.c.id, messages)
        .join(AGENTS, sa.and_(AGENTS.c.tenant == SESSIONS.c.tenant, AGENTS.c.id == SESSIONS.c.agent_id))
        .outerjoin(
            MESSAGES,
            sa.and_(
                MESSAGES.c.tenant == SESSIONS.c.tenant,
                MESSAGES.c.agent_id == SESSIONS.c.agent_id,  # implied; Citus joins on it shard by shard
                MESSAGES.c.session_id == SESSIONS.c.id,
            ),
        )
        .where(*scope(SESSIONS))
        .group_by(SESSIONS.c.tenant, AGENTS.c.name, SESSIONS.c.title, SESSIONS.c.id)
        .order_by(messages.desc(), SESSIONS.c.tenant, SESSIONS.c.id)
        .limit(TOP_SESSIONS)
    )
    owners = sa.union(*(sa.select(table.c.tenant) for table in metadata.tables.values())).subquery()
    opened = (
        db.unit_of_work(read_only=True, all_tenants=True)
        if tenant is None
        else db.unit_of_work(tenant, read_only=True)
    )
    now = utcnow()
    async with opened as uow:
        session = uow.link.session
        return _Stats(
            tenant=tenant,
            tenants=0
            if tenant is not None
            else int(await session.scalar(sa.select(sa.func.count()).select_from(owners)) or 0),
            counts={
                name: int(await session.scalar(count(*scope(table)).select_from(table)) or 0)
                for name, table in sorted(metadata.tables.items())
            },
            largest=[tuple(row) for row in await session.execute(largest)],
            expired=int(await session.scalar(count(*scope(SESSIONS), SESSIONS.c.expires_at <= now)) or 0),
            size=await _database_size(db, session),
        )


async def _stats(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from memorm.cli.open_database import open_database
    from memorm.cli.tenant_option import tenant_flag, tenant_scope

    async with open_database(args.url) as db:
        view, every = await tenant_scope(db, args.tenant, "stats")
        found = await _gather(view, None if every else view.tenant)
        where = db.url.render_as_string(hide_password=True)
        dialect = db.dialect

    console = Console()
    if not console.is_terminal:  # piped or captured: wide enough for a session id, unwrapped
        console = Console(width=120)
    console.print(f"memorm at {where}")
    scope = f"tenant {found.tenant!r}" if found.tenant is not None else f"every tenant ({found.tenants:,})"
    if found.tenant is not None and not any(found.counts.values()):
        # A tenant exists only through its rows: a misspelt name and a tenant with
        # nothing stored look alike, and a table of zeros would read as an answer.
        console.print(f"{scope} holds no rows (`memorm tenant list` names the tenants that do)", markup=False)
        return 0
    console.print(scope, markup=False)
    rows = Table(title="rows per table")
    rows.add_column("table")
    rows.add_column("rows", justify="right")
    for name, count in found.counts.items():
        rows.add_row(name, str(count))
    console.print(rows)
    if found.expired:
        purge = f"memorm purge --expired{tenant_flag(found.tenant)}"
        console.print(f"sessions past their expiry, awaiting `{purge}`: {found.expired}", markup=False)
    sessions = Table(title=f"largest sessions (top {TOP_SESSIONS})")
    if every:
        sessions.add_column("tenant")
    sessions.add_column("agent")
    sessions.add_column("title")
    sessions.add_column("session id", no_wrap=True)
    sessions.add_column("messages", justify="right")
    for tenant, agent, title, session_id, count in found.largest:
        cells = [agent, title or "-", str(session_id), str(count)]
        sessions.add_row(*([tenant, *cells] if every else cells))
    console.print(sessions)
    what = "database file and WAL" if dialect == "sqlite" else "memorm's tables and indexes"
    if not every:
        what += ", every tenant's rows"  # sizes are of whole tables
    console.print(f"size on disk ({what}): {_size(found.size)} ({found.size} bytes)")
    return 0


def register(commands: Any) -> None:
    check = commands.add_parser(
        "check", help="compare the live schema with memorm's models (exit 1 on drift)"
    )
    check.set_defaults(handler=run_check)
    stats = commands.add_parser("stats", help="rows per table, the largest sessions, size on disk")
    stats.set_defaults(handler=_stats)
    add_tenant_option(stats, "rows and sessions")
    for command in (check, stats):
        command.add_argument("--url", help="database URL")
