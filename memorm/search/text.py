"""Full-text search: one function, FTS5 on SQLite and `tsvector` on Postgres.

Both engines match the same stored words (`memorm.search.normalize`).
Results are ordered by relevance, then newest first, then by id, so equal
scores still page deterministically.  Relevance is FTS5's `bm25` and
Postgres' `ts_rank` (normalisation 1), and both come down to one number: each
row stores every distinct word once, without positions, so for a given query
every matching row has the same term frequencies and only its length differs;
both scores fall as the length grows.  So the order is *fewer distinct words
first*, and memorm reads it from an index instead of scoring every match
(`FullTextIndex.order_index`: owner, number of words, newest, id).  The
equivalence is exact: `bm25` is a double, and the float4 `ts_rank` of rows
of n and n+1 lexemes differs for every n a 1 MiB `tsvector` can hold.

A search runs two statements, neither of which scores anything:

1. `total`: a count of the agent's matches, inside the index (FTS5 matches
   the agent's scope token with the words; Postgres' GIN index holds tenant
   and agent beside the words).
2. The page, by one of two plans, chosen on that count.  Few matches
   (`SMALL`), or a page deep in them: fetch every match and sort by the
   order key (a sort of `total` rows).  Many: walk the agent's rows in order
   through the order index, testing each for the words, until the page is
   full; the walk stops after `total` rows (it then costs no more than the
   other plan, which runs instead).  A word in 20% of an agent's messages
   fills a page of 10 after ~50 rows, whatever the agent's size.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import aliased
from sqlalchemy.sql import ColumnElement, Select

from memorm.page import Page
from memorm.search.fts_ddl import SCOPE, SEARCH_SIZE, FullTextIndex, scope_token
from memorm.search.terms import fts5_query, query_terms, tsquery
from memorm.translate import guarded
from memorm.validation import check_limit

__all__ = ["SMALL", "merge_deleted", "search_page"]

if TYPE_CHECKING:
    from memorm.link import Link

T = TypeVar("T")
SMALL = 256  # at most this many matches: fetch and sort them all
_WALK_SHARE = 8  # walk only for a page within the first 1/8 of the matches


class _Plan:
    """The statements of one search on one engine."""

    def __init__(
        self, index: FullTextIndex, terms: list[str], tenant: str, agent: uuid.UUID, where: Sequence[Any]
    ) -> None:
        self.index, self.terms, self.where = index, terms, list(where)
        table = index.table
        self.owner: list[ColumnElement[bool]] = [table.c.tenant == tenant, table.c.agent_id == agent]

    def size(self, source: Any) -> Any:
        raise NotImplementedError

    def count(self) -> Select[Any]:
        raise NotImplementedError

    def matches(self, entity: type[Any]) -> Select[Any]:
        """Every match, in order (to be limited)."""
        raise NotImplementedError

    def has_words(self, words: Any) -> list[ColumnElement[bool]]:
        raise NotImplementedError

    def order(self, source: Any) -> list[Any]:
        return [self.size(source), source.c.created_at.desc(), source.c.id.desc()]

    def walk(self, entity: type[Any], budget: int) -> Select[Any]:
        """The matches among the agent's first `budget` rows in order (to be limited)."""
        table = self.index.table
        first = (
            sa.select(table, self.size(table).label("fts_size"))
            .where(*self.owner, *self.where)
            .order_by(*self.order(table))
            .limit(budget)
            .subquery("fts_walk")
        )
        walked = sa.select(aliased(entity, first)).where(*self.has_words(first.c[self.index.words]))
        return self.in_walk_order(walked, first)

    def in_walk_order(self, walked: Select[Any], first: Any) -> Select[Any]:
        """`walked` in the walk's order (Postgres knows the subquery's rows come sorted: no sort)."""
        return walked.order_by(first.c.fts_size, first.c.created_at.desc(), first.c.id.desc())


class _Sqlite(_Plan):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        _, terms, tenant, agent, _ = args
        f = self.index.fts_table
        self.fts = sa.table(f, sa.column("rowid"))
        # Every term double-quoted: an FTS5 string, never an operator or a column filter.
        expression = (
            f'{SCOPE} : "{scope_token(tenant, agent)}" AND {self.index.words} : ({fts5_query(terms)})'
        )
        hidden: ColumnElement[Any] = sa.literal_column(f)  # FTS5's column named after its table
        self.match = hidden.op("MATCH")(sa.bindparam("fts_query", expression))

    def size(self, source: Any) -> Any:
        return sa.literal_column(SEARCH_SIZE) if source is self.index.table else source.c[SEARCH_SIZE]

    def _found(self) -> Any:
        # MATERIALIZED: the matches are found once, then joined by rowid.  As a plain
        # join, SQLite's planner may walk the agent's rows by index and probe the
        # FTS table per row: 2.2 s instead of 0.5 ms at 100,000 long messages.
        found = sa.select(self.fts.c.rowid.label("rid")).where(self.match).cte("fts_matches")
        source: ColumnElement[Any] = sa.literal_column(f"{self.index.table.name}.rowid")
        return found.prefix_with("MATERIALIZED").join(self.index.table, source == found.c.rid)

    def count(self) -> Select[Any]:
        if not self.where:  # the scope token is the owner: the FTS table alone answers
            return sa.select(sa.func.count()).select_from(self.fts).where(self.match)
        return sa.select(sa.func.count()).select_from(self._found()).where(*self.where)

    def matches(self, entity: type[Any]) -> Select[Any]:
        table = self.index.table
        return (
            sa.select(entity)
            .select_from(self._found())
            .where(*self.owner, *self.where)
            .order_by(*self.order(table))
        )

    def has_words(self, words: Any) -> list[ColumnElement[bool]]:
        # The stored words, space-separated: the FTS5 ascii tokenizer's tokens.
        # LIKE folds ASCII case only, as that tokenizer does; terms hold no % or _.
        space = sa.literal_column("' '", sa.Text())  # no bind: SearchWords would make words of it
        padded = space.concat(sa.type_coerce(words, sa.Text())).concat(space)
        return [
            padded.like(sa.bindparam(f"fts_term_{i}", f"% {term} %", type_=sa.Text()))
            for i, term in enumerate(self.terms)
        ]

    def in_walk_order(self, walked: Select[Any], first: Any) -> Select[Any]:
        # SQLite would sort the subquery's rows again, reading all of them: but a
        # subquery with ORDER BY and LIMIT runs as a co-routine that hands rows on
        # in its order, so the walk stops as soon as the page is full.
        return walked


class _Postgres(_Plan):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        # tsquery input of quoted lexemes: no parser, dictionary or locale between the terms and the index.
        self.query = sa.cast(
            sa.bindparam("fts_query", tsquery(self.terms), type_=sa.Text), postgresql.TSQUERY
        )

    def size(self, source: Any) -> Any:
        return sa.func.length(source.c[self.index.words])

    def has_words(self, words: Any) -> list[ColumnElement[bool]]:
        return [words.op("@@")(self.query)]

    def count(self) -> Select[Any]:
        table = self.index.table
        return (
            sa.select(sa.func.count())
            .select_from(table)
            .where(*self.owner, *self.where, *self.has_words(table.c[self.index.words]))
        )

    def matches(self, entity: type[Any]) -> Select[Any]:
        # MATERIALIZED: the matches are found first (through the GIN index), then
        # sorted; never the order index walked with the words as a filter.
        table = self.index.table
        match = self.has_words(table.c[self.index.words])
        found = sa.select(table).where(*self.owner, *self.where, *match).cte("fts_matches")
        found = found.prefix_with("MATERIALIZED")
        return sa.select(aliased(entity, found)).order_by(*self.order(found))


async def search_page(
    link: Link,
    index: FullTextIndex,
    query: str,
    *,
    entity: type[T],
    tenant: str,
    agent: uuid.UUID,
    where: Sequence[ColumnElement[bool]] = (),
    limit: int,
    offset: int,
) -> Page[T]:
    """One page of the agent's `entity` rows whose indexed text matches every word of `query`.

    `where` narrows the agent's rows further (a session, roles, filters).
    """
    check_limit(limit, offset)
    terms = query_terms(query)
    if not terms:
        return Page(items=[], total=0, limit=limit, offset=offset)
    async with guarded(link):
        plan = (_Sqlite if link.sqlite else _Postgres)(index, terms, tenant, agent, where)
        total = int((await link.execute(plan.count())).scalar() or 0)
        if offset >= total:
            return Page(items=[], total=total, limit=limit, offset=offset)
        wanted = min(limit, total - offset)
        if total > SMALL and (offset + wanted) * _WALK_SHARE <= total:
            walked = await link.execute(
                plan.walk(entity, total).execution_options(populate_existing=True).limit(limit).offset(offset)
            )
            items = list(walked.scalars())
            if len(items) == wanted:  # the walk reached the page's last row: it is exact
                return Page(items=items, total=total, limit=limit, offset=offset)
        found = await link.execute(
            plan.matches(entity).execution_options(populate_existing=True).limit(limit).offset(offset)
        )
        return Page(items=list(found.scalars()), total=total, limit=limit, offset=offset)


async def merge_deleted(link: Link, index: FullTextIndex) -> None:
    """Make deleted rows' words unreadable in the index's own storage.

    FTS5 records a delete as a marker in a new segment; the word stays in the
    older segments (and so in `*_fts_data`) until they merge, so merge them
    all now.  A Postgres GIN index drops dead entries on `VACUUM`
    ([`memorm.Database.scrub`][memorm.db.Database.scrub]), which cannot run in a transaction.
    """
    if link.sqlite:
        async with guarded(link):
            await link.execute(sa.text(index.sqlite_optimize()))
