"""Copy every row of one memorm database into another (SQLite <-> Postgres), or one tenant's rows.

Tables go in dependency order, each in keyset-paged batches: read a batch
from the source, ask the destination which of its (tenant, id) keys it has,
bulk-insert the rest (COPY on Postgres) and commit.  Memory stays at one batch, and a second
run inserts nothing.  Rows are copied verbatim, counters included
(`sessions.next_seq`, `agents.archive_version`), so the copy carries on
exactly where the source stands.

The source's checksums are taken from the batches as they are copied; a
verification pass then reads the destination and compares (see
`memorm.transfer.verify`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from memorm.config import sqlite_file
from memorm.db import Database
from memorm.errors import ValidationError
from memorm.models import AGENTS
from memorm.transfer.rows import (
    DEFAULT_BATCH_SIZE,
    TABLES,
    Reporter,
    Silent,
    count_rows,
    insert_new,
    read_batches,
)
from memorm.transfer.scope import check_reach, check_scope
from memorm.transfer.target import check_destination, prepare_destination, refresh_statistics, written
from memorm.transfer.verify import Digester, TableDigest, compare_digests, digest_database
from memorm.translate import translating

__all__ = ["CopyReport", "check_apart", "copy_database", "verify_copy"]

# Where a Postgres database's memorm tables are, told apart from any other: the cluster, the
# server's start (a physical replica shares the cluster's identifier, not its start), the
# database and the agents table its search_path finds (another schema holds other tables).
_IDENTITY = sa.text(
    "SELECT (SELECT system_identifier FROM pg_control_system()), pg_postmaster_start_time(), oid,"
    " to_regclass(:table)::oid FROM pg_database WHERE datname = current_database()"
).bindparams(table=AGENTS.name)


@dataclass
class CopyReport:
    """What a copy did, by table name.

    Attributes:
        tenant: the tenant copied (None: every tenant).
        inserted: rows written to the destination.
        skipped: rows the destination already had (by tenant and id).
        source: the source's digests; `destination` the destination's (empty unverified).
        problems: one line per table that differs; empty when the copy verified.
        analyzed: the tables whose Postgres planner statistics the copy
            refreshed (`ANALYZE`), those it wrote rows to and may analyze.
    """

    tenant: str | None = None
    inserted: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    source: dict[str, TableDigest] = field(default_factory=dict)
    destination: dict[str, TableDigest] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    analyzed: list[str] = field(default_factory=list)


async def copy_database(
    source: Database,
    destination: Database,
    *,
    tenant: str | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    verify: bool = True,
    reporter: Reporter | None = None,
) -> CopyReport:
    """Copy every row of `source` (agents… passages, graph state, store items) into `destination`.

    The source must be at head.  An empty destination (no memorm schema) is
    migrated to head, once the rest is checked (a copy refused leaves it
    as it was); one with a memorm schema must be at head too
    (`SchemaError` otherwise, naming `memorm db upgrade`): see
    `memorm.transfer.target`.  Rows whose (tenant, id) the
    destination has are skipped, so the copy can be re-run after an
    interruption.

    Args:
        tenant: copy that tenant's rows only, reading and writing in units of
            work of that tenant (so an application role under row-level
            security can copy its own tenant); the destination's other
            tenants are left alone, and verification compares that tenant's
            rows.  None copies every tenant, which on Postgres needs roles
            that bypass row-level security on both sides.
        batch_size: rows read and written per statement and transaction.
        verify: compare row counts and checksums of both sides afterwards;
            differences land in `CopyReport.problems`.
        reporter: progress (see [`Reporter`][memorm.progress.Reporter]).

    Raises:
        ValidationError: `tenant` is no tenant name, or is None and a side's
            role is under row-level security; or `source` and `destination`
            are one database (`check_apart`).
    """
    scope = check_scope(tenant)
    report = reporter or Silent()
    await check_apart(source, destination)
    await source.check_schema()
    check_reach(source, scope)
    await prepare_destination(destination, await check_destination(destination, scope))
    result = CopyReport(tenant=scope)
    for table in TABLES:
        report.start(table.name, await count_rows(source, table, tenant=scope))
        digester = Digester(table)
        inserted = skipped = 0
        async for rows in read_batches(source, table, tenant=scope, batch_size=batch_size):
            digester.add(rows)
            fresh = await insert_new(destination, table, rows, tenant=scope)
            inserted += fresh
            skipped += len(rows) - fresh
            report.advance(table.name, len(rows))
        result.inserted[table.name] = inserted
        result.skipped[table.name] = skipped
        result.source[table.name] = digester.digest()
    result.analyzed = await refresh_statistics(destination, written(result.inserted), report)
    if verify:
        result.destination = await digest_database(
            destination, tenant=scope, batch_size=batch_size, reporter=report
        )
        result.problems = compare_digests(result.source, result.destination)
    return result


async def verify_copy(
    source: Database,
    destination: Database,
    *,
    tenant: str | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    reporter: Reporter | None = None,
) -> CopyReport:
    """Compare two databases without copying: counts and checksums of every table.

    Both must be at head (`SchemaError` otherwise); nothing is written.
    With a `tenant`, only that tenant's rows are compared.  A database is
    not compared with itself (`ValidationError`: see `check_apart`).
    """
    scope = check_scope(tenant)
    await check_apart(source, destination)
    await source.check_schema()
    await destination.check_schema()
    check_reach(source, scope)
    check_reach(destination, scope)
    result = CopyReport(tenant=scope)
    result.source = await digest_database(source, tenant=scope, batch_size=batch_size, reporter=reporter)
    result.destination = await digest_database(
        destination, tenant=scope, batch_size=batch_size, reporter=reporter
    )
    result.problems = compare_digests(result.source, result.destination)
    return result


async def check_apart(source: Database, destination: Database) -> None:
    """Refuse a copy (or comparison) of a database with itself, however its URLs spell it.

    SQLite: the same file (after symbolic links).  Postgres: the same
    tables (those the search path finds) of the same database of the same
    running server, as the server tells (`localhost` and `127.0.0.1` are
    one).  Copying a database into itself would skip
    every row and "verify": it only ever means a mistyped URL.

    Raises:
        ValidationError: the two are one database.
    """
    if source.engines is destination.engines:  # one Database, or views of it (`for_tenant`)
        same = True
    elif source.dialect != destination.dialect:
        same = False
    elif source.dialect == "sqlite":
        same = _same_file(sqlite_file(source.url), sqlite_file(destination.url))
    else:
        same = await _identity(source) == await _identity(destination)
    if same:
        where = source.url.render_as_string(hide_password=True)
        raise ValidationError(f"the source and the destination are one database ({where})")


def _same_file(first: os.PathLike[str] | None, second: os.PathLike[str] | None) -> bool:
    if first is None or second is None:  # in-memory databases are each their own
        return False
    if os.path.realpath(first) == os.path.realpath(second):
        return True
    try:
        return os.path.samefile(first, second)  # hard links
    except OSError:  # one is not there yet
        return False


async def _identity(db: Database) -> tuple[Any, ...]:
    with translating():
        async with db.engine.connect() as connection:
            found = (await connection.execute(_IDENTITY)).one()
            await connection.rollback()
    return tuple(found)
