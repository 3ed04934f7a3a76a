"""Bulk inserts: the one write path that goes to the driver directly.

SQLAlchemy's executemany costs about 1.3x the raw driver's and the ORM's
``add_all`` about 5x, so large batches skip both:

* SQLite: the aiosqlite connection's own ``executemany`` with one INSERT.
* Postgres: ``COPY … FROM STDIN (FORMAT binary)`` through asyncpg's
  ``copy_records_to_table``, several times faster than multi-row INSERTs,
  for batches of :data:`COPY_THRESHOLD` rows or more; smaller ones use a
  prepared INSERT (asyncpg's ``executemany``).

Both run on the connection under the session, inside its transaction.  Values
are converted by each column type's own bind processor, so the rows are
exactly what an ORM INSERT would have sent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncSession

from memorm.translate import check_writable, guarded

__all__ = ["COPY_THRESHOLD", "insert_rows"]

Processor = Callable[[Any], Any] | None
COPY_THRESHOLD = 64  # rows; below this a prepared INSERT beats COPY's set-up on Postgres
_UNSET = object()


async def insert_rows(
    session: AsyncSession, table: sa.Table, columns: Sequence[str], rows: Sequence[Sequence[Any]]
) -> None:
    """Insert ``rows`` (tuples of values in ``columns`` order) into ``table``."""
    if not rows:
        return
    check_writable(session)
    async with guarded(session):
        connection = await session.connection()
        dialect = connection.dialect
        names = tuple(columns)
        records = _convert(_processors(dialect, table, names), rows)
        driver: Any = (await connection.get_raw_connection()).driver_connection
        if dialect.name == "postgresql" and len(records) >= COPY_THRESHOLD:
            await driver.copy_records_to_table(table.name, records=records, columns=names)
        else:
            await driver.executemany(_insert_sql(dialect, table, names), records)


def _convert(processors: Sequence[Processor], rows: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """Rows of Python values -> rows of driver values, by each column's bind processor.

    A batch repeats itself: every row shares its session and agent ids and its
    timestamps, and most have empty ``meta``.  A value that is the very object
    the previous row had reuses its converted form, and an empty dict converts
    once; that cuts conversion 4-6x on 10,000-row batches.
    """
    width = len(processors)
    last_in: list[Any] = [_UNSET] * width
    last_out: list[Any] = [None] * width
    empty: list[Any] = [_UNSET] * width
    records = []
    for row in rows:
        record = list(row)
        for index in range(width):
            process = processors[index]
            value = record[index]
            if process is None or value is None:
                continue
            if value is last_in[index]:
                record[index] = last_out[index]
            elif type(value) is dict and not value:
                if empty[index] is _UNSET:
                    empty[index] = process(value)
                record[index] = empty[index]
            else:
                record[index] = last_out[index] = process(value)
                last_in[index] = value
        records.append(tuple(record))
    return records


@lru_cache(maxsize=256)
def _processors(dialect: Dialect, table: sa.Table, names: tuple[str, ...]) -> tuple[Processor, ...]:
    return tuple(table.c[name].type._cached_bind_processor(dialect) for name in names)


@lru_cache(maxsize=256)
def _insert_sql(dialect: Dialect, table: sa.Table, names: tuple[str, ...]) -> str:
    statement = sa.insert(table).values({name: sa.bindparam(name) for name in names})
    compiled = statement.compile(dialect=dialect)
    if compiled.positiontup is None or list(compiled.positiontup) != list(names):
        raise RuntimeError("bulk insert expects positional parameters in column order")
    return str(compiled)
