"""Statements that go to the driver directly, on the hot paths.

**Bulk inserts.** SQLAlchemy's executemany costs about 1.3x the raw driver's
and the ORM's `add_all` about 5x, so batches skip both:

* SQLite: the aiosqlite connection's own `executemany` with one INSERT.
* Postgres: `COPY … FROM STDIN (FORMAT binary)` through asyncpg's
  `copy_records_to_table`, several times faster than multi-row INSERTs,
  for batches of `COPY_THRESHOLD` rows or more; smaller ones use a
  prepared INSERT (asyncpg's `executemany`), and so does a role under
  row-level security, for which Postgres refuses `COPY FROM`.

**Fetches** (`fetch`).  The hot statements (appends, windows, context)
are module-level constants, compiled once per dialect (`memorm.compiled`) with their values'
bind processors and their rows' decoders (`Decoder`: a window's repeated
session and agent ids and timestamps are decoded once), and sent to the
driver itself: aiosqlite's `execute_fetchall` (one thread hop, where
SQLAlchemy's adapter makes up to four; a unit of work's first statement
takes its `BEGIN IMMEDIATE` along in the same hop) or asyncpg's `fetch`
(a prepared statement, from asyncpg's cache).

Derived columns (a table's full-text search words) are filled from their
source column, so no bulk write can leave them out.  Everything runs on the
unit of work's connection (`memorm.link.Link`), inside its transaction.
Values go through each column type's own bind and result processors, so the
rows are exactly what SQLAlchemy would have sent and returned.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

from memorm.compiled import Decoder, Processor, compiled, decode
from memorm.connection_state import WATCHERS, sent
from memorm.translate import check_writable, guarded

if TYPE_CHECKING:
    from memorm.link import Link

__all__ = [
    "COPY_THRESHOLD",
    "Insert",
    "OnConflict",
    "fetch",
    "insert_many",
    "insert_rows",
]

OnConflict = Literal["error", "ignore", "update"]  # what an insert does with a row whose key is taken
COPY_THRESHOLD = 64  # rows; below this a prepared INSERT beats COPY's set-up on Postgres
Rows = Sequence[Sequence[Any]] | Sequence[Mapping[str, Any]]
"""Rows to insert: tuples of values in column order, or dicts holding them under the columns' names."""


class Insert(NamedTuple):
    """Rows for one table (`Rows`: tuples or dicts), and what a taken key does (`OnConflict`).

    `keep`: columns a row replacing a stored one (`"update"`) leaves as stored (`created_at`, say).
    """

    table: sa.Table
    columns: Sequence[str]
    rows: Rows
    on_conflict: OnConflict = "error"
    keep: tuple[str, ...] = ()


async def insert_rows(
    link: Link,
    table: sa.Table,
    columns: Sequence[str],
    rows: Rows,
    *,
    on_conflict: OnConflict = "error",
) -> None:
    """Insert `rows` (tuples of values in `columns` order, or dicts holding those columns) into `table`.

    `on_conflict` says what a row whose primary key is taken does: raise
    (`"error"`, as a plain INSERT), leave the stored row (`"ignore"`), or
    replace the stored row's other columns (`"update"`).  Both engines
    spell it `ON CONFLICT (key) DO …`.
    """
    await insert_many(link, [Insert(table, columns, rows, on_conflict)])


async def insert_many(
    link: Link, inserts: Sequence[Insert], *, first: tuple[Any, dict[str, Any]] | None = None
) -> None:
    """`insert_rows` for several tables, in order; on SQLite in one trip to aiosqlite's thread.

    `first`: a statement (as `fetch` takes it) and its parameters, run before the
    inserts in the same call (a delete of what the rows replace, say).
    """
    inserts = [insert for insert in inserts if insert.rows]
    if not inserts and first is None:
        return
    check_writable(link)
    dialect = link.dialect
    before = None if first is None else _bound(link, *first)
    async with guarded(link):
        prepared = []
        for table, columns, rows, on_conflict, keep in inserts:
            names, sources = _with_derived(table, tuple(columns))
            records = _convert(_processors(dialect, table, names), rows, sources, columns)
            sql = _insert_sql(dialect, table, names, on_conflict, keep)
            prepared.append((table, names, records, sql, on_conflict))
        statements: list[Statement] = [] if before is None else [(before[0], before[1], False)]
        statements += [(sql, records, True) for _, _, records, sql, _ in prepared]
        if link.sqlite:  # the BEGIN, if one is due, goes along (see _sqlite_run)
            if WATCHERS:
                if link.needs_begin:
                    sent(link.engine, "BEGIN IMMEDIATE")
                for sql, values, _ in statements:
                    sent(link.engine, sql, values)
            await _sqlite_run(link, statements)
            return
        if not link.take_only_call(len(statements)):
            await link.ready()
        driver = link.driver
        if before is not None:
            if WATCHERS:
                sent(link.engine, before[0], before[1])
            await driver.execute(before[0], *before[1])
        for table, names, records, sql, on_conflict in prepared:
            # A unit of work that sets its tenant runs under row-level security, and Postgres
            # refuses COPY FROM to a table with row-level security.  COPY knows no conflicts.
            copy = (
                link.state.tenant_setting is None
                and on_conflict == "error"
                and len(records) >= COPY_THRESHOLD
            )
            if WATCHERS:
                sent(link.engine, f"COPY {table.name}" if copy else sql, records)
            if copy:
                await driver.copy_records_to_table(table.name, records=records, columns=names)
            elif len(records) == 1:
                await driver.execute(sql, *records[0])
            else:
                await driver.executemany(sql, records)


@lru_cache(maxsize=256)
def _with_derived(table: sa.Table, names: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """`names` plus the derived columns they lack, and where each one's source is in a row.

    A derived column (`info["derived_from"]`, the full-text search words)
    takes its source column's value, which its type turns into the stored form.
    """
    derived = [
        (column.name, names.index(column.info["derived_from"]))
        for column in table.c
        if "derived_from" in column.info and column.name not in names and column.info["derived_from"] in names
    ]
    return names + tuple(name for name, _ in derived), tuple(at for _, at in derived)


def _convert(
    processors: Sequence[Processor],
    rows: Rows,
    sources: Sequence[int] = (),
    columns_of: Sequence[str] = (),
) -> list[tuple[Any, ...]]:
    """Rows of Python values -> rows of driver values, by each column's bind processor.

    `rows` are tuples of values in column order, or dicts holding them under
    the names `columns_of` lists (a repository's checked rows, read as they are).

    Column by column: a batch repeats itself (every row shares its tenant,
    session and agent ids and timestamps, and often its `meta`), so a column
    holding one value converts it once, and a column of varied values goes
    through its processor in one `map` (no per-value Python loop).

    `sources`: where in the row each derived column's source value is; the
    derived values follow the row's own (see `_with_derived`).
    """
    if not rows:
        return []
    first_row: Any = rows[0]
    keyed = isinstance(first_row, Mapping)
    if len(rows) == 1:  # a chat append's one message: value by value, no columns to build
        values = [first_row[name] for name in columns_of] if keyed else list(first_row)
        values += ["" if values[at] is None else values[at] for at in sources]
        return [tuple(v if p is None or v is None else p(v) for p, v in zip(processors, values, strict=True))]
    columns: list[list[Any]]
    if keyed:
        columns = [list(map(itemgetter(name), rows)) for name in columns_of]
    else:
        columns = [list(column) for column in zip(*rows, strict=True)]
    for at in sources:
        columns.append(["" if value is None else value for value in columns[at]])  # no text: no words
    size = len(rows)
    for index, process in enumerate(processors):
        if process is None:
            continue
        column = columns[index]
        first = column[0]
        if _one_value(column, first, size):
            converted = None if first is None else process(first)
            columns[index] = [converted] * size
        elif None in column:
            columns[index] = [None if value is None else process(value) for value in column]
        else:
            columns[index] = list(map(process, column))
    return list(zip(*columns, strict=True))


def _one_value(column: list[Any], first: Any, size: int) -> bool:
    """Whether every value of `column` converts as `first` does.

    Equal strings, ids, instants and empty dicts convert alike; other equal
    values may not (`{"a": 1} == {"a": True}`), so they must be that very object.
    """
    if first is None or type(first) in _EXACT or (type(first) is dict and not first):
        return column.count(first) == size
    return all(value is first for value in column)


_EXACT = frozenset((str, uuid.UUID, datetime))


@lru_cache(maxsize=256)
def _processors(dialect: Dialect, table: sa.Table, names: tuple[str, ...]) -> tuple[Processor, ...]:
    return tuple(table.c[name].type._cached_bind_processor(dialect) for name in names)


@lru_cache(maxsize=256)
def _insert_sql(
    dialect: Dialect,
    table: sa.Table,
    names: tuple[str, ...],
    on_conflict: OnConflict,
    keep: tuple[str, ...] = (),
) -> str:
    statement = sa.insert(table).values({name: sa.bindparam(name) for name in names})
    compiled = statement.compile(dialect=dialect)
    if compiled.positiontup is None or list(compiled.positiontup) != list(names):
        raise RuntimeError("bulk insert expects positional parameters in column order")
    if on_conflict == "error":
        return str(compiled)
    key = [column.name for column in table.primary_key.columns]
    if on_conflict == "ignore":
        action = "NOTHING"
    else:
        updated = [name for name in names if name not in key and name not in keep]
        action = "UPDATE SET " + ", ".join(f"{name} = excluded.{name}" for name in updated)
    return f"{compiled} ON CONFLICT ({', '.join(key)}) DO {action}"


async def fetch(link: Link, statement: Any, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Run `statement` (a module-level constant with named bind parameters) on the driver; its rows.

    The statement is compiled once per dialect and cached, with its values'
    bind and result processors, so it must not be built anew per call.  It
    runs in the unit of work's transaction (begun first, if need be).
    """
    sql, values, results = _bound(link, statement, params)
    if link.sqlite:
        if WATCHERS:
            if link.needs_begin:  # it goes along (see _sqlite_run)
                sent(link.engine, "BEGIN IMMEDIATE")
            sent(link.engine, sql, values)
        rows = await _sqlite_run(link, [(sql, values, False)])
    else:
        if not link.take_only_call():
            await link.ready()
        if WATCHERS:
            sent(link.engine, sql, values)
        if link.fresh and link.state.read_only:  # a read first: again on a fresh connection if this one died
            rows = await link.first_trip(lambda: link.driver.fetch(sql, *values))
        else:
            rows = await link.driver.fetch(sql, *values)
    if not any(results):
        return [tuple(row) for row in rows]
    return decode(rows, results)


def _bound(
    link: Link, statement: Any, params: dict[str, Any]
) -> tuple[str, list[Any], tuple[Decoder | None, ...]]:
    """`statement`'s SQL (compiled once per dialect), `params` as driver values, its rows' decoders."""
    sql, names, binds, defaults, results = compiled(link.dialect, statement)
    given = (params[n] if n in params else defaults[n] for n in names)  # e.g. SQLite's implicit OFFSET 0
    values = [v if p is None or v is None else p(v) for p, v in zip(binds, given, strict=True)]
    return sql, values, results


Statement = tuple[str, Sequence[Any], bool]  # SQL, its values, and whether once per row of them


async def _sqlite_run(link: Link, statements: Sequence[Statement]) -> list[Any]:
    """Statements on aiosqlite, in one trip to its thread, the `BEGIN` too if one is due.

    aiosqlite runs each call in its connection's thread, a hop that costs
    more than a short statement itself; a unit of work's first statement
    takes its `BEGIN IMMEDIATE` along (through aiosqlite's own queue of
    calls), and a one-statement unit of work's call its `COMMIT` too
    (`Link.take_only_call`).  Returns the last statement's rows (none if run
    once per row).
    """
    driver = link.driver
    commit = link.take_only_call()
    begin = link.needs_begin
    if begin:
        link.begun = True
    try:
        rows = list(await driver._execute(_run, driver, statements, begin, commit))
    except BaseException:
        if begin or commit:
            link.begun = bool(driver.in_transaction)
        raise
    if commit:
        link.begun = False
        if WATCHERS:
            sent(link.engine, "COMMIT")
    return rows


def _run(driver: Any, statements: Sequence[Statement], begin: bool, commit: bool) -> list[Any]:
    """In aiosqlite's thread: `BEGIN IMMEDIATE` if `begin`, the statements, `COMMIT` if `commit`."""
    connection = driver._conn
    if begin:
        connection.execute("BEGIN IMMEDIATE")
    rows: list[Any] = []
    for sql, values, many in statements:
        if many:
            connection.executemany(sql, values)
            rows = []
        else:
            rows = connection.execute(sql, values).fetchall()
    if commit:
        connection.execute("COMMIT")
    return rows
