"""The graph store's statements (`uow.graph_store`): its columns, its conditions, statements built once.

Statements the store sends often (one get, one put, a search's listing
per filter shape) are built once, with named parameters, so they compile
once too.  Where the engines differ (row locks), one function here decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql import ColumnElement

from memorm.link import Link
from memorm.models import STORE_ITEMS, STORE_VECTORS
from memorm.repositories.store_items import StoredItem
from memorm.search.filters import ValueShape, shaped_conditions
from memorm.types import VectorType

__all__ = [
    "DELETE_VECTORS_OF",
    "GET_ONE",
    "ITEM_COLUMNS",
    "PUT_ONE",
    "READ",
    "VECTOR_COLUMNS",
    "listing_statement",
    "lock_statement",
    "needs_row_locks",
    "search_conditions",
    "stored_item",
    "under",
    "under_values",
]

_I, _V = STORE_ITEMS, STORE_VECTORS
ITEM_COLUMNS = (
    "tenant",
    "agent_id",
    "namespace",
    "key",
    "value",
    "created_at",
    "updated_at",
    "expires_at",
    "ttl_minutes",
)
VECTOR_COLUMNS = ("tenant", "agent_id", "namespace", "key", "field", "embedding")
READ = (_I.c.namespace, _I.c.key, _I.c.value, _I.c.created_at, _I.c.updated_at, _I.c.ttl_minutes)
"""The columns an item is read by (`stored_item` makes a `StoredItem` of them)."""


_ONE = {"tenant": "tenant", "agent_id": "agent", "namespace": "namespace", "key": "key"}  # column: parameter


def _of_one_item(table: sa.Table) -> list[ColumnElement[bool]]:
    """One item's rows of `table`: its tenant, agent, namespace and key, as parameters."""
    return [table.c[column] == sa.bindparam(name) for column, name in _ONE.items()]


DELETE_VECTORS_OF = sa.delete(_V).where(*_of_one_item(_V))  # one item's embeddings


def _put_one() -> Any:
    """One item stored with its embeddings, which replace its old ones: one statement (Postgres).

    The item's upsert and the delete of its embeddings of fields not in
    `:fields` are CTEs beside the upsert of the new embeddings (`:fields`
    and `:embeddings`, arrays): no row is touched twice, and the
    embeddings' foreign key to the item is checked as the statement ends,
    the item there.  With no fields, every old embedding goes.
    """
    parameter = {"agent_id": "agent", "created_at": "now", "updated_at": "now"}
    item = postgresql.insert(_I).values(
        {name: sa.bindparam(parameter.get(name, name), type_=_I.c[name].type) for name in ITEM_COLUMNS}
    )
    key = [column.name for column in _I.primary_key.columns]
    replaced = {name: item.excluded[name] for name in ITEM_COLUMNS if name not in (*key, "created_at")}
    stored = item.on_conflict_do_update(index_elements=key, set_=replaced).cte("item")
    fields = sa.bindparam("fields", type_=postgresql.ARRAY(sa.Text))
    others = sa.delete(_V).where(*_of_one_item(_V), sa.not_(_V.c.field == sa.any_(fields))).cte("others")
    embeddings = sa.bindparam("embeddings", type_=postgresql.ARRAY(VectorType(array_item=True), dimensions=1))
    new = sa.func.unnest(fields, embeddings).table_valued("field", "embedding").render_derived()
    owner = [sa.bindparam(name, type_=_V.c[column].type) for column, name in _ONE.items()]
    vectors = postgresql.insert(_V).from_select(
        list(VECTOR_COLUMNS), sa.select(*owner, new.c.field, new.c.embedding)
    )
    vector_key = [column.name for column in _V.primary_key.columns]
    upsert = vectors.on_conflict_do_update(
        index_elements=vector_key, set_={"embedding": vectors.excluded.embedding}
    )
    return upsert.add_cte(stored).add_cte(others)


PUT_ONE = _put_one()
_LIVE = sa.or_(_I.c.expires_at.is_(None), _I.c.expires_at > sa.bindparam("now", type_=_I.c.expires_at.type))
GET_ONE = sa.select(*READ).where(*_of_one_item(_I), _LIVE)  # one item, if live at :now


def under(column: Any, prefix: str) -> list[ColumnElement[bool]]:
    """`column` is the namespace `prefix` or one below it ("" matches every namespace).

    A range, not LIKE: namespaces compare byte by byte, and "/" follows ".",
    so the namespaces below "a.b" are those from "a.b." up to "a.b/".  The
    range from "a.b" itself to "a.b/" comes first, as a condition of its
    own, so the primary key's index seeks it (within it, "a.b-c" is not below
    "a.b": the second condition leaves it out).
    """
    if not prefix:
        return []
    return _range(column, prefix, prefix + "/", prefix + ".")


def _range(column: Any, prefix: Any, end: Any, below: Any) -> list[ColumnElement[bool]]:
    return [column >= prefix, column < end, sa.or_(column == prefix, column >= below)]


def under_values(prefix: str) -> dict[str, str]:
    """The values of `listing_statement`'s namespace range."""
    return {"prefix": prefix, "prefix_end": prefix + "/", "prefix_below": prefix + "."}


@lru_cache(maxsize=128)
def search_conditions(
    prefixed: bool, shape: ValueShape
) -> tuple[tuple[ColumnElement[bool], ...], tuple[ColumnElement[bool], ...]]:
    """A search's conditions, built once per shape: on the items, and the same scope on their vectors.

    The live items of an agent (under a namespace, if `prefixed`) whose
    values match a filter of that shape (`value_filter`), with named
    parameters: tenant, agent and now, those `under_values` names and
    those `value_filter` names.
    """
    named: list[Any] = [sa.bindparam(name) for name in under_values("")]
    items: tuple[ColumnElement[bool], ...] = (
        _I.c.tenant == sa.bindparam("tenant"),
        _I.c.agent_id == sa.bindparam("agent"),
        _LIVE,
    )
    vectors: tuple[ColumnElement[bool], ...] = (
        _V.c.tenant == sa.bindparam("tenant"),
        _V.c.agent_id == sa.bindparam("agent"),
    )
    if prefixed:
        items += (*_range(_I.c.namespace, *named),)
        vectors += (*_range(_V.c.namespace, *named),)
    return (*items, *shaped_conditions(_I.c.value, shape)), vectors


@lru_cache(maxsize=128)
def listing_statement(prefixed: bool, shape: ValueShape) -> sa.Select[Any]:
    """A search without a query, built once per shape (`search_conditions`): newest update first, a page."""
    return (
        sa.select(*READ)
        .where(*search_conditions(prefixed, shape)[0])
        .order_by(_I.c.updated_at.desc(), _I.c.namespace, _I.c.key)
        .limit(sa.bindparam("limit", type_=sa.Integer))
        .offset(sa.bindparam("offset", type_=sa.Integer))
    )


def needs_row_locks(link: Link) -> bool:
    """Whether writers of the same items lock them first (`lock_statement`): on Postgres, not SQLite.

    Postgres runs transactions at once, and two that write the same keys in
    different orders would deadlock; SQLite writes one transaction at a
    time, so there is nothing to lock.
    """
    return not link.sqlite


def lock_statement(agent: Sequence[ColumnElement[bool]], keys: Sequence[tuple[str, str]]) -> sa.Select[Any]:
    """Lock the agent's items at `keys` that exist, in key order, until the transaction ends (Postgres).

    `agent`: the conditions keeping the items to the tenant and agent.
    """
    return (
        sa.select(_I.c.key)
        .where(*agent, sa.tuple_(_I.c.namespace, _I.c.key).in_(keys))
        .order_by(_I.c.namespace, _I.c.key)
        .with_for_update()
    )


def stored_item(row: Any, score: float | None = None) -> StoredItem:
    """The item of a row of `READ` (and its search score, if any)."""
    namespace, key, value, created, updated, ttl = row[:6]
    return StoredItem(namespace, key, value, created, updated, ttl, score)
