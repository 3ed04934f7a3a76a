"""Tables as streams of rows: read in keyset-paged batches, written without duplicates.

Rows are tuples of Python values in the table's column order
(`column_names`), exactly what the column types return and accept, so a
row read from one engine is written to the other unchanged.  A row's key is
`(tenant, id)`: ids are unique only within a tenant.  Each table is read
tenant by tenant, tenants in code point order (SQLite's and Postgres' "C"
collation; a Postgres database's own collation may order text otherwise, so
the tenants are listed and sorted here), and each tenant's rows by id.  Ids
are UUIDv7, so that is oldest first, and the same order on both engines
(SQLite keeps uuids as 32 hex digits, which sort as Postgres sorts `uuid`):
which is what lets checksums of the two sides be compared.

The LangGraph tables have no id: the graph state of the sessions
(`graph_checkpoints`, `graph_writes`, `graph_blobs`) and the agents'
long-term store (`graph_store_items`, `graph_store_vectors`).  A row's key
is its tenant and its primary key's other columns (`key_columns`), read in
that order, text compared by the database's own collation (a store
namespace byte by byte, its key by the collation), so their checksums are
order-free (`memorm.transfer.verify`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from memorm.conflicts import conflict_message, unique_keys
from memorm.db import Database
from memorm.driver import fetch, insert_rows
from memorm.errors import ConflictError, ValidationError
from memorm.models import (
    AGENT_NAMES,
    AGENTS,
    DATA_TABLES,
    MESSAGES,
    PASSAGES,
    STORE_VECTORS,
    fields,
)
from memorm.progress import Reporter, Silent
from memorm.repositories.id_claims import claim_all
from memorm.transfer.lookup import matching
from memorm.transfer.scope import Scope, scoped
from memorm.translate import guarded

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "TABLES",
    "Reporter",
    "Row",
    "Silent",
    "column_names",
    "count_rows",
    "id_index",
    "insert_new",
    "key_columns",
    "read_batches",
    "row_key",
    "table_named",
    "tenant_index",
]

# Parents before children: every foreign key finds its row already written.  The
# LangGraph tables (memorm.compat.langgraph) come last: the graph state after its
# sessions, then the agents' long-term store (items before their vectors).
TABLES: tuple[sa.Table, ...] = DATA_TABLES
DEFAULT_BATCH_SIZE = 5_000

Row = tuple[Any, ...]


def table_named(name: object) -> sa.Table:
    """The memorm table called `name`; `KeyError` if there is none."""
    for table in TABLES:
        if table.name == name:
            return table
    raise KeyError(name)


@cache
def column_names(table: sa.Table) -> tuple[str, ...]:
    """The table's columns, in the order its rows' values come.

    Derived columns (full-text search words) are not part of a row: every
    write computes them again from the row's text.
    """
    return tuple(column.name for column in fields(table))


def id_index(table: sa.Table) -> int:
    """Where `id` is in a row of `table`."""
    return column_names(table).index("id")


@cache
def key_columns(table: sa.Table) -> tuple[sa.Column[Any], ...]:
    """The columns that, with the tenant, name a row: `id`; a LangGraph table's row, its composite key."""
    if "id" in table.c:
        return (table.c.id,)
    return tuple(column for column in table.primary_key.columns if column.name != "tenant")


@cache
def _key_indexes(table: sa.Table) -> tuple[int, ...]:
    names = column_names(table)
    return (names.index("tenant"), *(names.index(column.name) for column in key_columns(table)))


def row_key(table: sa.Table, row: Row) -> tuple[Any, ...]:
    """A row's key: `(tenant, id)`, or the tenant and a LangGraph table's key columns."""
    return tuple(row[index] for index in _key_indexes(table))


def tenant_index(table: sa.Table) -> int:
    """Where `tenant` is in a row of `table`."""
    return column_names(table).index("tenant")


@cache
def _pages(table: sa.Table) -> tuple[sa.Select[Any], sa.Select[Any]]:
    """One tenant's first page and its next pages (module-level, so `fetch` caches them)."""
    limit = sa.bindparam("limit", type_=sa.Integer)
    columns = fields(table)
    own = table.c.tenant == sa.bindparam("tenant", type_=table.c.tenant.type)
    key = key_columns(table)
    first = sa.select(*columns).where(own).order_by(*key).limit(limit)
    if len(key) == 1:
        after = own & (key[0] > sa.bindparam("after", type_=key[0].type))
    else:  # a row value: both engines answer it on the primary key's index
        bound = [sa.bindparam(f"after_{i}", type_=column.type) for i, column in enumerate(key)]
        after = own & (sa.tuple_(*key) > sa.tuple_(*bound))
    return first, sa.select(*columns).where(after).order_by(*key).limit(limit)


@cache
def _next_tenant(table: sa.Table) -> sa.Select[Any]:
    """The least tenant of `table` after `:after` (built once per table)."""
    after = sa.bindparam("after", type_=table.c.tenant.type)
    return sa.select(sa.func.min(table.c.tenant)).where(table.c.tenant > after)


async def _tenants_of(db: Database, table: sa.Table, tenant: Scope) -> list[str]:
    """The tenants a read of `table` goes through, in code point order.

    Found by a loose index scan driven from here, one index probe per tenant
    (`min(tenant) WHERE tenant > last`): a recursive query would do it in
    one statement, but Citus runs a recursive query only on one shard, and
    this one it runs as a probe on every shard.  A read of every tenant's
    rows makes a statement per tenant anyway.
    """
    if tenant is not None:
        return [tenant]
    found: list[str] = []
    first = sa.select(sa.func.min(table.c.tenant))
    async with scoped(db, None, read_only=True) as uow, guarded(uow.link):
        last = await uow.link.session.scalar(first)
        while last is not None:
            found.append(last)
            last = await uow.link.session.scalar(_next_tenant(table), {"after": last})
    return sorted(found)


async def count_rows(db: Database, table: sa.Table, *, tenant: Scope = None) -> int:
    """How many rows `table` has (of `tenant`; None: of every tenant)."""
    statement = sa.select(sa.func.count()).select_from(table)
    if tenant is not None:
        statement = statement.where(table.c.tenant == tenant)
    async with scoped(db, tenant, read_only=True) as uow, guarded(uow.link):
        total = await uow.link.session.scalar(statement)
    return int(total or 0)


async def read_batches(
    db: Database, table: sa.Table, *, tenant: Scope = None, batch_size: int = DEFAULT_BATCH_SIZE
) -> AsyncIterator[list[Row]]:
    """Every row of `table` (of `tenant`; None: of every tenant) in (tenant, id) order, in batches.

    Each page is its own statement (`WHERE tenant = t AND id > last ORDER BY
    id LIMIT n`), so a long read holds no transaction open and memory stays
    at one batch.  A batch may hold rows of several tenants.  A LangGraph
    table is read in the order of its key columns instead (`key_columns`),
    text compared as the database compares it.
    """
    first, after = _pages(table)
    at = _key_indexes(table)[1:]
    batch: list[Row] = []
    for owner in await _tenants_of(db, table, tenant):
        last: dict[str, Any] | None = None
        while True:
            wanted = batch_size - len(batch)
            params: dict[str, Any] = {"tenant": owner, "limit": wanted}
            async with scoped(db, tenant, read_only=True) as uow, guarded(uow.link):
                if last is None:
                    rows = await fetch(uow.link, first, params)
                else:
                    rows = await fetch(uow.link, after, {**params, **last})
            batch += rows
            if len(batch) >= batch_size:
                yield batch
                batch = []
            if len(rows) < wanted:
                break
            values = [rows[-1][index] for index in at]
            single = len(values) == 1
            last = {"after": values[0]} if single else {f"after_{i}": v for i, v in enumerate(values)}
    if batch:
        yield batch


async def insert_new(db: Database, table: sa.Table, rows: Sequence[Row], *, tenant: Scope = None) -> int:
    """Insert the `rows` whose (tenant, id) `db` lacks, in one transaction; how many were new.

    The transaction is a unit of work of `tenant` (None: of every tenant),
    whose rows alone `rows` may hold.  Existing rows are skipped, not
    compared: a verification pass (see `memorm.transfer.verify`) tells
    whether they match.

    Raises:
        ValidationError: a row of another tenant than `tenant`.
        ConflictError: a new row takes a unique value (a name, a key) the
            database holds under another id.
    """
    if not rows:
        return 0
    owner, at = tenant_index(table), id_index(table) if "id" in table.c else -1
    if tenant is not None and any(row[owner] != tenant for row in rows):
        raise ValidationError(f"{table.name}: a row of another tenant than {tenant!r}")
    keys = [row_key(table, row) for row in rows]
    columns = [table.c.tenant, *key_columns(table)]
    # A store vector is looked up by its item (few fields each), not one statement per item.
    lookup = columns[:-1] if table is STORE_VECTORS else columns
    async with scoped(db, tenant) as uow:
        if table is MESSAGES or table is PASSAGES:
            # An id names one row of its tenant, any agent's: on a distributed database, where no
            # unique index says so, no other writer stores these ids between look-up and insert.
            for owner_tenant in sorted({row[owner] for row in rows}):
                await claim_all(uow.link, table, owner_tenant)
        async with guarded(uow.link):
            found: set[tuple[Any, ...]] = set()
            for where in matching(lookup, {key[: len(lookup)] for key in keys}):
                stored = await uow.link.session.execute(sa.select(*columns).where(where))
                found.update(tuple(key) for key in stored)
            fresh = []
            for row, key in zip(rows, keys, strict=True):
                if key not in found:  # and not twice in the batch: the first of a key is kept
                    found.add(key)
                    fresh.append(row)
            await _refuse_taken(uow.link.session, table, fresh)
        await insert_rows(uow.link, table, column_names(table), fresh)
        if table is AGENTS and fresh:  # the agents' names are kept (unique) in agent_names
            name = column_names(AGENTS).index("name")
            named = [(row[owner], row[name], row[at]) for row in fresh]
            await insert_rows(uow.link, AGENT_NAMES, ("tenant", "name", "agent_id"), named)
    return len(fresh)


async def _refuse_taken(session: AsyncSession, table: sa.Table, rows: Sequence[Row]) -> None:
    """`ConflictError` naming the value if a new row takes a unique value another row holds.

    The destination may hold a row with the same name (or key) in the same
    tenant under another id; the insert would fail on it without saying
    which.  Every unique key leads with the tenant, so other tenants' rows
    never collide.
    """
    if "id" not in table.c:
        return  # a LangGraph table: its primary key is its only unique key
    names = column_names(table)
    at = id_index(table)
    if table is AGENTS:  # names are unique per tenant in agent_names
        owner, name = names.index("tenant"), names.index("name")
        wanted_names = {(row[owner], row[name]): row[at] for row in rows}
        keyed_names = [AGENT_NAMES.c.tenant, AGENT_NAMES.c.name]
        for clause in matching(keyed_names, wanted_names):
            query = sa.select(AGENT_NAMES.c.agent_id, *keyed_names).where(clause)
            for agent_id, row_tenant, taken in (await session.execute(query)).all():
                if wanted_names.get((row_tenant, taken)) != agent_id:
                    said = conflict_message(("agents", ("name",)), {"name": taken})
                    raise ConflictError(f"{said} in the destination, under another id")
    for columns in unique_keys(table)[1:]:
        if columns == ("tenant", "id"):
            continue  # the rows' own key: those the database has were left out already
        where = [names.index(column) for column in columns]
        wanted = {tuple(row[i] for i in where): row[at] for row in rows}
        for value in [value for value in wanted if None in value]:
            del wanted[value]  # NULLs never collide (a session without a key)
        keyed = [table.c[column] for column in columns]
        for clause in matching(keyed, wanted):
            query = sa.select(table.c.id, *keyed).where(clause)
            for row_id, *taken in (await session.execute(query)).all():
                if wanted.get(tuple(taken)) != row_id:
                    said = conflict_message((table.name, columns), dict(zip(columns, taken, strict=True)))
                    raise ConflictError(f"{said} in the destination, under another id")
