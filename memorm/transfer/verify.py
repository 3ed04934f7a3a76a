"""Checksums of whole tables, computed a batch at a time, and their comparison.

A table's digest is its row count and the SHA-256 of its rows' canonical
forms (`memorm.transfer.codec.canonical`, which include the tenant and the
id) in (tenant, id) order, of one tenant or of every tenant.  Equal digests
on two databases mean the same rows with the same contents, whichever
engines hold them and whatever else (other tenants) they hold.

The LangGraph tables (the graph state, the long-term store) have text keys,
which each database orders by its own collation, so their rows may come in
another order on each side: their digest is order-free, the SHA-256 of the
sum (modulo 2**256) of each row's SHA-256.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import sqlalchemy as sa

from memorm.db import Database
from memorm.transfer.codec import canonical
from memorm.transfer.rows import DEFAULT_BATCH_SIZE, TABLES, Reporter, Row, Silent, count_rows, read_batches
from memorm.transfer.scope import Scope, check_reach, check_scope

__all__ = ["Digester", "TableDigest", "compare_digests", "digest_database", "digest_table"]


@dataclass(frozen=True)
class TableDigest:
    """One table's row count and content checksum."""

    table: str
    count: int
    sha256: str


class Digester:
    """Builds a `TableDigest` from batches of rows fed in (tenant, id) order."""

    def __init__(self, table: sa.Table) -> None:
        self.table = table
        self.count = 0
        self._hash = hashlib.sha256()
        self._ordered = "id" in table.c  # else a LangGraph table: order-free (see above)
        self._sum = 0

    def add(self, rows: Iterable[Row]) -> None:
        """Take the next rows (in (tenant, id) order)."""
        for row in rows:
            if self._ordered:
                self._hash.update(canonical(self.table, row))
                self._hash.update(b"\n")
            else:
                digest = hashlib.sha256(canonical(self.table, row)).digest()
                self._sum = (self._sum + int.from_bytes(digest, "big")) % 2**256
            self.count += 1

    def digest(self) -> TableDigest:
        """The digest of every row fed so far."""
        found = self._hash if self._ordered else hashlib.sha256(self._sum.to_bytes(32, "big"))
        return TableDigest(self.table.name, self.count, found.hexdigest())


async def digest_table(
    db: Database,
    table: sa.Table,
    *,
    tenant: Scope = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    reporter: Reporter | None = None,
) -> TableDigest:
    """Read `table` of `db` through (`tenant`'s rows; None: every tenant's), a batch at a time; its digest."""
    report = reporter or Silent()
    task = f"verify {table.name}"
    report.start(task, await count_rows(db, table, tenant=tenant))
    digester = Digester(table)
    async for rows in read_batches(db, table, tenant=tenant, batch_size=batch_size):
        digester.add(rows)
        report.advance(task, len(rows))
    return digester.digest()


async def digest_database(
    db: Database,
    *,
    tenant: str | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    reporter: Reporter | None = None,
) -> dict[str, TableDigest]:
    """The digest of each of memorm's tables in `db`, by table name.

    Args:
        tenant: digest that tenant's rows only; None: every tenant's (on
            Postgres, that needs a role that bypasses row-level security).

    Raises:
        ValidationError: `tenant` is no tenant name, or is None for a role
            under row-level security.
    """
    scope = check_scope(tenant)
    await db.check_schema()
    check_reach(db, scope)
    return {
        table.name: await digest_table(db, table, tenant=scope, batch_size=batch_size, reporter=reporter)
        for table in TABLES
    }


def compare_digests(source: Mapping[str, TableDigest], destination: Mapping[str, TableDigest]) -> list[str]:
    """One line per table whose digests differ (empty when every table matches)."""
    problems = []
    for name in (table.name for table in TABLES):
        ours, theirs = source[name], destination[name]
        if ours.count != theirs.count:
            problems.append(f"{name}: {ours.count:,} rows in the source, {theirs.count:,} in the destination")
        elif ours.sha256 != theirs.sha256:
            problems.append(f"{name}: the same {ours.count:,} rows, but their ids or contents differ")
    return problems
