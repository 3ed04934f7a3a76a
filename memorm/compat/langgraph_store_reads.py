"""What `MemormStore`'s reads return: stored items as LangGraph's, and namespace listings.

A `ListNamespacesOp` whose conditions are one plain prefix is one
statement; wildcards, suffixes and `max_depth` are applied in Python, a
page of namespaces at a time (`list_namespaces`).
"""

from __future__ import annotations

import heapq
import uuid
from datetime import datetime

from memorm.compat._extras import missing_extra

try:
    from langgraph.store.base import Item, ListNamespacesOp, MatchCondition, SearchItem
except ImportError as error:
    raise missing_extra(__name__, "langgraph", error) from error

from memorm.repositories.store import StoreRepository
from memorm.repositories.store_items import StoredItem

__all__ = ["as_item", "as_search_item", "list_namespaces"]

_LIST_PAGE = 1000  # namespaces read at a time when a listing filters them in Python


async def list_namespaces(
    store: StoreRepository, agent_id: uuid.UUID, op: ListNamespacesOp, now: datetime, expired: bool
) -> list[tuple[str, ...]]:
    """`op`'s page of the agent's namespaces (`expired`: those of unswept expired items count too)."""
    if op.limit == 0:
        return []
    conditions = list(op.match_conditions or ())
    fixed: tuple[str, ...] = ()
    for condition in conditions:
        if condition.match_type == "prefix":
            path = _path_of(condition)
            fixed = path[: path.index("*")] if "*" in path else path
            break
    plain = op.max_depth is None and all(
        c.match_type == "prefix" and "*" not in _path_of(c) and _path_of(c) == fixed for c in conditions
    )
    if plain:
        found = await store.namespaces(
            agent_id, ".".join(fixed), now=now, limit=op.limit, offset=op.offset, expired=expired
        )
        return [tuple(namespace.split(".")) for namespace in found]
    # Filtered (wildcards, suffixes) or truncated (max_depth) in Python, a page of
    # namespaces at a time, keeping only the first `limit + offset` in byte order.
    want = op.limit + op.offset
    kept: list[_Last] = []
    held: set[str] = set()
    after: str | None = None
    while True:
        page = await store.namespaces(
            agent_id, ".".join(fixed), now=now, limit=_LIST_PAGE, after=after, expired=expired
        )
        for namespace in page:
            labels = tuple(namespace.split("."))
            if not all(_matches(condition, labels) for condition in conditions):
                continue
            shown = ".".join(labels[: op.max_depth] if op.max_depth is not None else labels)
            if shown in held:
                continue
            if len(kept) < want:
                heapq.heappush(kept, _Last(shown))
                held.add(shown)
            elif shown < kept[0].text:
                held.discard(heapq.heapreplace(kept, _Last(shown)).text)
                held.add(shown)
        if len(page) < _LIST_PAGE:
            break
        after = page[-1]
    ordered = sorted(entry.text for entry in kept)
    return [tuple(text.split(".")) for text in ordered[op.offset : op.offset + op.limit]]


class _Last:
    """A namespace's text, ordered backwards: the heap's top is the last one kept."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __lt__(self, other: _Last) -> bool:
        return self.text > other.text


def _path_of(condition: MatchCondition) -> tuple[str, ...]:
    """A condition's labels (a lone string is one label)."""
    return (condition.path,) if isinstance(condition.path, str) else tuple(condition.path)


def _matches(condition: MatchCondition, labels: tuple[str, ...]) -> bool:
    path = _path_of(condition)
    if len(labels) < len(path):
        return False
    if condition.match_type == "suffix":
        labels, path = labels[::-1], path[::-1]
    return all(want == "*" or have == want for have, want in zip(labels, path, strict=False))


def as_item(stored: StoredItem) -> Item:
    """A stored item as LangGraph's `Item` (what `get` returns)."""
    return Item(
        value=stored.value,
        key=stored.key,
        namespace=tuple(stored.namespace.split(".")),
        created_at=stored.created_at,
        updated_at=stored.updated_at,
    )


def as_search_item(stored: StoredItem) -> SearchItem:
    """A stored item as LangGraph's `SearchItem` (what `search` returns), with its score."""
    return SearchItem(
        namespace=tuple(stored.namespace.split(".")),
        key=stored.key,
        value=stored.value,
        created_at=stored.created_at,
        updated_at=stored.updated_at,
        score=stored.score,
    )
