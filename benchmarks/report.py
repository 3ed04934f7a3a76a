"""What a benchmark returns and how it is shown: result rows, tables and goals.

A benchmark module is ``benchmarks/<name>.py`` exposing::

    async def run(engines: Sequence[str], *, quick: bool = False) -> list[Row]

It times memorm against the raw driver doing the same work
(:mod:`benchmarks.timing`, on a :mod:`benchmarks.stores` store) and returns
:class:`Row` objects; ``benchmarks.run`` prints them and writes them as JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.timing import Samples

__all__ = ["Row", "format_seconds", "print_goals", "print_table"]


@dataclass
class Row:
    """One line of a results table: memorm against the raw driver for one operation.

    ``rows`` is how many rows one timed run handles (for rows/s); ``target`` the
    largest acceptable memorm/raw ratio; rows without a raw baseline (checks such
    as "flat latency") put their verdict in ``status`` and ``note``.  ``goal``
    names the goal the row measures, as the issue that set it words it; rows
    sharing a goal meet it together (:func:`print_goals`).
    """

    module: str
    engine: str
    operation: str
    memorm: Samples | None = None
    raw: Samples | None = None
    rows: int | None = None
    target: float | None = None
    note: str = ""
    status: str | None = None
    goal: str = ""

    @property
    def ratio(self) -> float | None:
        if self.memorm is None or self.raw is None:
            return None
        return self.memorm.median / self.raw.median

    @property
    def verdict(self) -> str:
        if self.status is not None:
            return self.status
        ratio = self.ratio
        if ratio is None or self.target is None:
            return ""
        return "PASS" if ratio <= self.target else "MISS"

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["memorm"] = None if self.memorm is None else self.memorm.summary()
        data["raw"] = None if self.raw is None else self.raw.summary()
        data["ratio"] = self.ratio
        data["status"] = self.verdict
        for side in ("memorm", "raw"):
            samples = getattr(self, side)
            if samples is not None and self.rows:
                data[f"{side}_rows_per_s"] = self.rows / samples.median
        return data


def format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.0f} µs"


def _rate(rows: int | None, samples: Samples | None) -> str:
    if not rows or samples is None:
        return "-"
    return f"{rows / samples.median:,.0f}"


def print_table(title: str, rows: Sequence[Row]) -> None:
    """Print ``rows`` as an aligned text table under ``title``."""
    header = ("operation", "memorm", "raw", "ratio", "target", "status", "memorm rows/s", "raw rows/s")
    lines = [
        (
            row.operation,
            format_seconds(row.memorm.median if row.memorm else None),
            format_seconds(row.raw.median if row.raw else None),
            "-" if row.ratio is None else f"{row.ratio:.2f}x",
            "-" if row.target is None else f"<= {row.target:g}x",
            row.verdict or "-",
            _rate(row.rows, row.memorm),
            _rate(row.rows, row.raw),
        )
        for row in rows
    ]
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *lines, strict=True)]
    left = {0, 5}  # text columns; numbers align right

    def render(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.ljust(width) if index in left else cell.rjust(width)
            for index, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    print(f"\n{title}")
    print(render(header))
    print(render(["-" * width for width in widths]))
    for line in lines:
        print(render(line))
    for row in rows:
        if row.note:
            print(f"  * {row.operation}: {row.note}")


def print_goals(rows: Sequence[Row]) -> None:
    """Print each goal of ``rows`` as met or missed per engine, with its worst ratio.

    A goal is met on an engine when every row measuring it there passed.
    """
    goals = list(dict.fromkeys(row.goal for row in rows if row.goal))
    if not goals:
        return
    engines = list(dict.fromkeys(row.engine for row in rows if row.goal))
    cells = []
    for goal in goals:
        line = [goal]
        for engine in engines:
            judged = [row for row in rows if row.goal == goal and row.engine == engine and row.verdict]
            if not judged:
                line.append("-")
                continue
            met = all(row.verdict == "PASS" for row in judged)
            ratios = [row.ratio for row in judged if row.ratio is not None]
            worst = f" ({max(ratios):.2f}x)" if ratios else ""
            line.append(("met" if met else "MISSED") + worst)
        cells.append(line)
    header = ["goal", *engines]
    widths = [max(len(line[index]) for line in [header, *cells]) for index in range(len(header))]
    print("\n== goals (worst ratio of each goal's rows) ==")
    for line in [header, ["-" * width for width in widths], *cells]:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())
