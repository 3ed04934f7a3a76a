"""Tables as streams of rows: read in keyset-paged batches, written without duplicates.

Rows are tuples of Python values in the table's column order
(`column_names`), exactly what the column types return and accept, so a
row read from one engine is written to the other unchanged.  Ids are UUIDv7 and
paging runs on `id`: each table is read oldest first, and in the same order
on both engines (SQLite keeps uuids as 32 hex digits, which sort as Postgres
sorts `uuid`), which is what lets checksums of the two sides be compared.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from memorm.conflicts import conflict_message, unique_keys
from memorm.db import Database
from memorm.driver import fetch, insert_rows
from memorm.errors import ConflictError
from memorm.models import AGENTS, EMBEDDING_MODELS, MESSAGES, PASSAGES, SESSIONS, fields
from memorm.progress import Reporter, Silent
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
    "read_batches",
    "table_named",
]

# Parents before children: every foreign key finds its row already written.
TABLES: tuple[sa.Table, ...] = (AGENTS, EMBEDDING_MODELS, SESSIONS, MESSAGES, PASSAGES)
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
def _pages(table: sa.Table) -> tuple[sa.Select[Any], sa.Select[Any]]:
    """The first page's statement and the next pages' (module-level, so `fetch` caches them)."""
    limit = sa.bindparam("limit", type_=sa.Integer)
    columns = fields(table)
    first = sa.select(*columns).order_by(table.c.id).limit(limit)
    after = sa.select(*columns).where(table.c.id > sa.bindparam("after")).order_by(table.c.id).limit(limit)
    return first, after


async def count_rows(db: Database, table: sa.Table) -> int:
    """How many rows `table` has."""
    async with db.unit_of_work(read_only=True) as uow, guarded(uow.session):
        total = await uow.session.scalar(sa.select(sa.func.count()).select_from(table))
    return int(total or 0)


async def read_batches(
    db: Database, table: sa.Table, *, batch_size: int = DEFAULT_BATCH_SIZE
) -> AsyncIterator[list[Row]]:
    """Every row of `table` in id order, `batch_size` rows at a time.

    Each page is its own statement (`WHERE id > last ORDER BY id LIMIT n`),
    so a long read holds no transaction open and memory stays at one batch.
    """
    first, after = _pages(table)
    at = id_index(table)
    last: uuid.UUID | None = None
    while True:
        async with db.unit_of_work(read_only=True) as uow, guarded(uow.session):
            if last is None:
                rows = await fetch(uow.session, first, {"limit": batch_size})
            else:
                rows = await fetch(uow.session, after, {"after": last, "limit": batch_size})
        if rows:
            yield rows
        if len(rows) < batch_size:
            return
        last = rows[-1][at]


async def insert_new(db: Database, table: sa.Table, rows: Sequence[Row]) -> int:
    """Insert the `rows` whose id `db` lacks, in one transaction; how many were new.

    Existing rows are skipped, not compared: a verification pass (see
    `memorm.transfer.verify`) tells whether they match.
    """
    if not rows:
        return 0
    at = id_index(table)
    ids = [row[at] for row in rows]
    async with db.unit_of_work() as uow:
        async with guarded(uow.session):
            found = set(
                (await uow.session.execute(sa.select(table.c.id).where(table.c.id.in_(ids)))).scalars()
            )
            fresh = [row for row in rows if row[at] not in found] if found else list(rows)
            await _refuse_taken(uow.session, table, fresh)
        await insert_rows(uow.session, table, column_names(table), fresh)
    return len(fresh)


_CHECKED_PER_QUERY = 1_000  # value tuples per query: well inside both engines' parameter limits


async def _refuse_taken(session: AsyncSession, table: sa.Table, rows: Sequence[Row]) -> None:
    """`ConflictError` naming the value if a new row takes a unique value another row holds.

    The destination may hold a row with the same name (or key) under another
    id; the insert would fail on it without saying which.
    """
    names = column_names(table)
    at = id_index(table)
    for columns in unique_keys(table)[1:]:
        where = [names.index(column) for column in columns]
        wanted = {tuple(row[i] for i in where): row[at] for row in rows}
        wanted.pop(tuple(None for _ in where), None)  # NULLs never collide (a session without a key)
        keyed = sa.tuple_(*(table.c[column] for column in columns))
        values = list(wanted)
        for start in range(0, len(values), _CHECKED_PER_QUERY):
            chunk = values[start : start + _CHECKED_PER_QUERY]
            query = sa.select(table.c.id, *(table.c[c] for c in columns)).where(keyed.in_(chunk))
            for row_id, *taken in (await session.execute(query)).all():
                if wanted.get(tuple(taken)) != row_id:
                    said = conflict_message((table.name, columns), dict(zip(columns, taken, strict=True)))
                    raise ConflictError(f"{said} in the destination, under another id")
