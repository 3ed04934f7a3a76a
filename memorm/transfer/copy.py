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

from dataclasses import dataclass, field

from memorm.db import Database
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
from memorm.transfer.target import prepare_destination, refresh_statistics, written
from memorm.transfer.verify import Digester, TableDigest, compare_digests, digest_database

__all__ = ["CopyReport", "copy_database", "verify_copy"]


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
    migrated to head first; one with a memorm schema must be at head too
    (`SchemaError` otherwise, naming `memorm db upgrade`): see
    `prepare_destination`.  Rows whose (tenant, id) the
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
            role is under row-level security.
    """
    scope = check_scope(tenant)
    report = reporter or Silent()
    await source.check_schema()
    await prepare_destination(destination)
    check_reach(source, scope)
    check_reach(destination, scope)
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
    With a `tenant`, only that tenant's rows are compared.
    """
    scope = check_scope(tenant)
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
