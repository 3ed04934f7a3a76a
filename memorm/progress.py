"""Progress of long operations (copies, purges): a protocol, and a reporter that stays silent."""

from __future__ import annotations

from typing import Protocol

__all__ = ["Reporter", "Silent"]


class Reporter(Protocol):
    """Where progress goes (a progress bar in the CLI; `Silent` elsewhere)."""

    def start(self, task: str, total: int) -> None:
        """A new task (`"messages"`, `"verify messages"`…) of `total` rows begins."""

    def advance(self, task: str, rows: int) -> None:
        """`rows` more rows of `task` are done."""


class Silent:
    """A [`Reporter`][memorm.progress.Reporter] that reports nothing."""

    def start(self, task: str, total: int) -> None:
        """Ignore the start."""

    def advance(self, task: str, rows: int) -> None:
        """Ignore the progress."""
