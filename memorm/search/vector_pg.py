"""Nearest-neighbour search over archival passages on Postgres, with pgvector.

One statement, `ORDER BY embedding::vector(d) <op> q LIMIT k` with every
filter in the WHERE clause, returning the passages' columns with their
distances.  The query repeats the HNSW index's cast and model predicate
(`memorm.search.vector_index`; the predicate as a literal, so generic plans
match it too), and pgvector's iterative scan keeps a filtered search
returning `k` rows when `k` exist.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql import ColumnElement

from memorm.driver import fetch
from memorm.link import Link
from memorm.models import PASSAGES, ArchivalPassage, EmbeddingModel
from memorm.search.vector_index import indexed_column, search_settings
from memorm.search.vector_rows import (
    PASSAGE_FIELDS,
    PASSAGE_WIDTH,
    current_model,
    model_params,
    passage_of_row,
)
from memorm.types import VectorType
from memorm.validation import INT64_MAX

__all__ = ["pg_nearest"]

_OPERATORS = {"cosine": "<=>", "l2": "<->", "inner_product": "<#>"}
_TIE_MARGIN = 16  # rows read past k+offset, so equal distances there can be ordered by id


def _model_predicate(name: str, dim: int) -> ColumnElement[bool]:
    """The partial indexes' predicate: this model name at this dimension, as literals in the SQL.

    Literals, not parameters, so the planner can match the partial index
    even from a generic (cached) plan.  The name goes as an escape string
    (`E'…'`, backslashes and quotes escaped), read alike whatever
    `standard_conforming_strings` says; a name has no NUL (`check_text`).
    """
    quoted = "E'" + name.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return sa.and_(
        PASSAGES.c.embedding_model == sa.literal_column(quoted, sa.Text),
        PASSAGES.c.embedding_dim == sa.literal_column(str(int(dim)), sa.Integer),
    )


def _hits(rows: Iterable[Sequence[Any]]) -> list[tuple[ArchivalPassage, float]]:
    """Passages and distances from rows of the passage's columns followed by the distance."""
    return [(passage_of_row(row), float(row[PASSAGE_WIDTH])) for row in rows]


@dataclass(frozen=True)
class _Nearest:
    """A search's statements: `page` (the nearest few by the index, the page of them by
    (distance, id)) and `exact` (the page by (distance, id) without the index)."""

    page: sa.Select[Any]
    exact: sa.Select[Any]


# (metric, model name, dim, precision, first page's k or None): a search's statements without
# filters, built once
_STATEMENTS: dict[tuple[str, str, int, str, int | None], _Nearest] = {}
_STATEMENTS_MAX = 1024  # beyond, searches build their own: any number of model names stays bounded


def _nearest_statement(
    metric: str, name: str, dim: int, precision: str, where: Sequence[ColumnElement[bool]], first: int | None
) -> _Nearest:
    """The search's statements for this model shape and metric; without filters, built once.

    The model name and dimension are literals (`_model_predicate`); every
    other value is a parameter: `query`, `tenant`, `agent`, the model's
    (`current_model`), and for a page past the first, `near` (how many the
    inner query takes), `limit` and `offset`.  A statement built once is
    compiled once, and its cache key computed once.

    `first`: the `k` of a first page (offset 0), whose limits are literals.
    With a parameter for a LIMIT, Postgres cannot cost a generic plan, so it
    plans every execution of the prepared statement anew (custom plans); a
    literal LIMIT lets it settle on one plan after five executions.  That
    planning was a quarter of the statement's time on the server.  Pages past
    the first keep parameters, so paging through results prepares no new
    statement per offset.
    """
    key = (metric, name, dim, precision, first)
    if not where and key in _STATEMENTS:
        return _STATEMENTS[key]
    shape = EmbeddingModel(name=name, dim=dim, precision=precision)
    column = indexed_column(shape)
    target = sa.cast(sa.bindparam("query", type_=VectorType(half=precision == "float16")), column.type)
    distance = column.op(_OPERATORS[metric], return_type=sa.Float)(target).label("distance")
    scoped = sa.select(*PASSAGE_FIELDS, distance).where(
        _model_predicate(name, dim),
        PASSAGES.c.tenant == sa.bindparam("tenant"),
        PASSAGES.c.agent_id == sa.bindparam("agent"),
        current_model(sa.bindparam("tenant"), sa.bindparam("agent")),
        *where,
    )
    counts: tuple[sa.ColumnElement[int], ...]
    if first is None:
        counts = tuple(sa.bindparam(name, type_=sa.BigInteger) for name in ("near", "limit", "offset"))
    else:
        counts = tuple(sa.literal_column(str(n), sa.BigInteger) for n in (_margin(first), first, 0))
    near_limit, limit, offset = counts
    # The index yields rows in distance order only for ORDER BY distance alone:
    # the inner query takes the nearest few that way; the outer one breaks
    # ties by id and cuts the page, and says how many the inner one found and
    # the farthest distance among them, to tell whether equal distances ran
    # past the margin.  One statement, the passages' columns included.
    near = scoped.order_by(distance).limit(near_limit).subquery("near")
    page = (
        sa.select(
            *near.c,
            sa.func.count().over().label("found"),
            sa.func.max(near.c.distance).over().label("edge"),
        )
        .order_by(near.c.distance, near.c.id)
        .limit(limit)
        .offset(offset)
    )
    exact = scoped.order_by(distance, PASSAGES.c.id).limit(limit).offset(offset)
    statements = _Nearest(page, exact)
    if not where and len(_STATEMENTS) < _STATEMENTS_MAX:
        _STATEMENTS[key] = statements
    return statements


def _margin(want: int) -> int:
    """How many rows the inner query takes for the nearest `want` (offsets count: 64-bit)."""
    return min(want + _TIE_MARGIN, INT64_MAX)


async def pg_nearest(
    link: Link,
    tenant: str,
    agent_id: uuid.UUID,
    model: EmbeddingModel,
    query: list[float],
    *,
    metric: str,
    where: Sequence[ColumnElement[bool]],
    k: int,
    offset: int,
    ef_search: int | None,
) -> list[tuple[ArchivalPassage, float]]:
    """The `k` nearest passages (after `offset`) and their distances, best first, ties by id.

    None at all while `model` is no longer the agent's (`current_model`).
    """
    first = k if offset == 0 else None
    statements = _nearest_statement(metric, model.name, model.dim, model.precision, where, first)
    near = _margin(k + offset)
    values = {
        "query": query,
        **model_params(tenant, agent_id, model),
        "near": near,
        "limit": k,
        "offset": offset,
    }
    await search_settings(link, ef_search)
    if where:  # a statement of its own
        rows = [tuple(row) for row in await link.execute(statements.page, values)]
    else:
        rows = await fetch(link, statements.page, values)
    if rows and rows[0][PASSAGE_WIDTH + 1] == near and rows[-1][PASSAGE_WIDTH] == rows[0][PASSAGE_WIDTH + 2]:
        # More equal distances than the margin holds at the page's edge (duplicate
        # texts, say): order them exactly, by (distance, id), without the index.
        exact = await link.execute(statements.exact, values)
        return _hits(tuple(row) for row in exact)
    return _hits(rows)
