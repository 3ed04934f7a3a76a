"""`Page`: one page of a bounded list, with the true total."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["Page"]

T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    """`items` of a list of `total` rows, starting at `offset`, at most `limit` long."""

    items: list[T] = field(default_factory=list)
    total: int = 0
    limit: int = 50
    offset: int = 0

    def __iter__(self) -> Iterator[T]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    @property
    def has_more(self) -> bool:
        """Whether rows remain after this page."""
        return self.offset + len(self.items) < self.total
