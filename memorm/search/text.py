"""Full-text search: one function, FTS5 on SQLite and `tsvector` on Postgres.

Both engines match the same stored words (`memorm.search.normalize`).
Results are ordered by relevance (FTS5's `bm25`; Postgres' `ts_rank`),
then newest first, then by id, so equal scores still page deterministically.
Each row stores every distinct word once, so both scores come down to the
same order: rows with fewer distinct words first.  `total` counts every
match under the same filters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql import ColumnElement, FromClause

from memorm.page import Page
from memorm.search.fts_ddl import FullTextIndex
from memorm.search.terms import fts5_query, query_terms, tsquery
from memorm.translate import guarded
from memorm.validation import check_limit

__all__ = ["merge_deleted", "search_page"]

T = TypeVar("T")


def _sqlite(index: FullTextIndex, terms: list[str]) -> tuple[FromClause, ColumnElement[bool], Any]:
    fts = sa.table(index.fts_table, sa.column("rowid"))
    hidden: ColumnElement[Any] = sa.literal_column(index.fts_table)  # FTS5's column named after its table
    # Every term double-quoted: an FTS5 string, never an operator or a column filter.
    expression = fts5_query(terms)
    # MATERIALIZED: the matches are found once, then joined by rowid.  As a plain
    # join, SQLite's planner may walk the agent's messages by index and probe the
    # FTS table per row: 2.2 s instead of 0.5 ms at 100,000 long messages.
    matches = (
        sa.select(fts.c.rowid.label("rid"), sa.func.bm25(hidden).label("rank"))
        .where(hidden.op("MATCH")(sa.bindparam("fts_query", expression)))
        .cte(f"{index.fts_table}_matches")
        .prefix_with("MATERIALIZED")
    )
    source: ColumnElement[Any] = sa.literal_column(f"{index.table.name}.rowid")
    return matches.join(index.table, source == matches.c.rid), sa.true(), matches.c.rank


def _postgres(index: FullTextIndex, terms: list[str]) -> tuple[FromClause, ColumnElement[bool], Any]:
    words = index.table.c[index.words]
    # tsquery input of quoted lexemes: no parser, dictionary or locale between the terms and the index.
    query = sa.cast(sa.bindparam("fts_query", tsquery(terms), type_=sa.Text), postgresql.TSQUERY)
    # Normalisation 1 divides by 1 + log(length): shorter matches rank higher, as with bm25.
    return index.table, words.op("@@")(query), -sa.func.ts_rank(words, query, 1)


async def search_page(
    session: AsyncSession,
    index: FullTextIndex,
    query: str,
    *,
    entity: type[T],
    where: Sequence[ColumnElement[bool]],
    limit: int,
    offset: int,
) -> Page[T]:
    """One page of `entity` rows whose indexed text matches every word of `query`."""
    check_limit(limit, offset)
    terms = query_terms(query)
    if not terms:
        return Page(items=[], total=0, limit=limit, offset=offset)
    async with guarded(session):
        dialect = (await session.connection()).dialect.name
        build = _sqlite if dialect == "sqlite" else _postgres
        source, match, rank = build(index, terms)
        table = index.table
        total = await session.scalar(sa.select(sa.func.count()).select_from(source).where(match, *where))
        if not total or offset >= total:
            return Page(items=[], total=int(total or 0), limit=limit, offset=offset)
        found = await session.execute(
            sa.select(entity)
            .select_from(source)
            .where(match, *where)
            .order_by(rank, table.c.created_at.desc(), table.c.id.desc())
            .execution_options(populate_existing=True)
            .limit(limit)
            .offset(offset)
        )
        return Page(items=list(found.scalars()), total=int(total), limit=limit, offset=offset)


async def merge_deleted(session: AsyncSession, index: FullTextIndex) -> None:
    """Make deleted rows' words unreadable in the index's own storage.

    FTS5 records a delete as a marker in a new segment; the word stays in the
    older segments (and so in `*_fts_data`) until they merge, so merge them
    all now.  A Postgres GIN index drops dead entries on `VACUUM`
    ([`memorm.Database.scrub`][memorm.db.Database.scrub]), which cannot run in a transaction.
    """
    if session.get_bind().dialect.name == "sqlite":
        async with guarded(session):
            await session.execute(sa.text(index.sqlite_optimize()))
