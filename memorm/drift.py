"""Schema drift: what alembic's autogenerate finds between the models and a live database, in words.

[`memorm.migrate.check_drift`][memorm.migrate.check_drift] runs the comparison; this module decides
what is compared (`include_name`) and describes each difference
(`describe`) as one line naming the table, column, index or constraint.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa

from memorm.migrate import include_name as migrations_include_name
from memorm.models import metadata

__all__ = ["RUNTIME_INDEX_PREFIX", "describe", "describe_all", "include_name"]

# HNSW indexes made at run time by ``uow.passages.ensure_index`` (memorm.search.vector.index_name).
RUNTIME_INDEX_PREFIX = "ix_archival_passages_hnsw_"


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """The migrations' filter, plus what a live database legitimately holds beyond the models.

    Tables of other applications sharing the database are not memorm's
    business, and the HNSW indexes `ensure_index` builds on demand are
    expected; neither counts as drift.
    """
    if not migrations_include_name(name, type_, parent_names):
        return False
    if type_ == "table":
        return name in metadata.tables
    return not (type_ == "index" and name is not None and name.startswith(RUNTIME_INDEX_PREFIX))


def _column(table: str, column: Any) -> str:
    name = column.name if isinstance(column, sa.Column) else column
    return f"column {table}.{name}"


def _constraint(kind: str, constraint: Any) -> str:
    table = getattr(constraint, "table", None)
    where = f" on {table.name}" if table is not None else ""
    columns = ", ".join(c.name for c in getattr(constraint, "columns", ()))
    over = f" ({columns})" if columns else ""
    return f"{kind} {constraint.name or '(unnamed)'}{where}{over}"


_KINDS = {"index": "index", "constraint": "constraint", "fk": "foreign key"}


def describe(diff: Any) -> str:
    """One line for one entry of `alembic.autogenerate.compare_metadata`'s result."""
    if isinstance(diff, list):  # column modifications come grouped per column
        return "; ".join(describe(item) for item in diff)
    op = diff[0]
    action, _, kind = op.partition("_")
    if kind == "table":
        what = f"table {diff[1].name}"
    elif kind == "column":
        what = _column(diff[2], diff[3])
    elif kind in _KINDS:
        what = _constraint(_KINDS[kind], diff[1])
    elif action == "modify":
        column = _column(diff[2], diff[3])
        database, models = diff[5], diff[6]
        if kind == "nullable":
            database = "NULL" if database else "NOT NULL"
            models = "NULL" if models else "NOT NULL"
        return f"{column}: the database has {kind} {database}, memorm's models {models}"
    else:
        return f"{op}: {diff[1:]}"
    if action == "add":
        return f"{what} is missing from the database"
    if action == "remove":
        return f"the database has {what}, which memorm's models do not"
    return f"{op}: {what}"


def describe_all(diffs: Iterable[Any]) -> list[str]:
    """`describe` each difference."""
    return [describe(diff) for diff in diffs]
