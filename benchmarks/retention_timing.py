"""How the retention benchmark times its rounds, and where memorm's time goes in each.

Every sample starts from restored data (:func:`rounds`); :class:`Profile`
records memorm's statements and their times through SQLAlchemy's cursor events.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event

from benchmarks.report import format_seconds
from benchmarks.timing import Samples, timed
from memorm import Database


async def rounds(
    variants: Sequence[tuple[str, Callable[[], Awaitable[Any]]]],
    reps: int,
    restore: Callable[[], Awaitable[None]],
    check: Callable[[str, Any], Awaitable[None]],
) -> dict[str, Samples]:
    """``reps`` rounds of every variant, each on freshly restored data, in an order rotated per round."""
    samples = {name: Samples() for name, _ in variants}
    for rep in range(reps):
        shift = rep % len(variants)
        for name, work in [*variants[shift:], *variants[:shift]]:
            await restore()
            result = await timed(work, samples[name], collect=True)
            await check(name, result)
    return samples


class Profile:
    """memorm's statements in each run of an operation, with their times (SQLAlchemy cursor events).

    The events cost a few microseconds per statement; they are on in every
    memorm sample, so the samples stay comparable.
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        self.runs: list[list[tuple[str, float]]] = []

    def wrap(self, work: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
        async def profiled() -> Any:
            with self._statements() as statements:
                result = await work()
            self.runs.append(statements)
            return result

        return profiled

    @contextmanager
    def _statements(self) -> Iterator[list[tuple[str, float]]]:
        found: list[tuple[str, float]] = []

        def before(connection: Any, *_: Any) -> None:
            connection.info["bench_started"] = time.perf_counter()

        def after(connection: Any, cursor: Any, statement: str, *_: Any) -> None:
            found.append((statement, time.perf_counter() - connection.info.pop("bench_started")))

        engine = self.db.engine.sync_engine
        event.listen(engine, "before_cursor_execute", before)
        event.listen(engine, "after_cursor_execute", after)
        try:
            yield found
        finally:
            event.remove(engine, "before_cursor_execute", before)
            event.remove(engine, "after_cursor_execute", after)

    @staticmethod
    def _kind(statement: str) -> str:
        text = statement.lstrip().upper()
        if "'OPTIMIZE'" in text:
            return "FTS5 optimize"
        if text.startswith("SELECT COUNT"):
            return "counts"
        return text.split(None, 1)[0].lower()

    def note(self) -> str:
        """Median time per run by kind of statement, and the slowest statement (median of its total)."""
        if not self.runs:
            return ""

        def median(key: Callable[[str], str], value: str) -> float:
            return statistics.median(
                sum(seconds for statement, seconds in run if key(statement) == value) for run in self.runs
            )

        def head(statement: str) -> str:
            return " ".join(statement.split())[:60]

        kinds = {self._kind(statement) for run in self.runs for statement, _ in run}
        by_kind = sorted(((median(self._kind, kind), kind) for kind in kinds), reverse=True)
        heads = {head(statement) for run in self.runs for statement, _ in run}
        slowest, text = max((median(head, text), text) for text in heads)
        count = statistics.median(len(run) for run in self.runs)
        return (
            f"memorm's {count:g} statements per run by kind: "
            + ", ".join(f"{kind} {format_seconds(seconds)}" for seconds, kind in by_kind)
            + f"; slowest: `{text}…` {format_seconds(slowest)}"
        )
