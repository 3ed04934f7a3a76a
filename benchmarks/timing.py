"""How a comparison is timed: samples of wall-clock seconds, and the two sides taking turns.

memorm and the raw driver doing the same work are timed in the same run, in
turns (:func:`alternate`, :func:`interleaved`), so that load drifting meanwhile
hits both alike; :func:`timed` adds one run's wall time to its :class:`Samples`.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Job", "Samples", "alternate", "interleaved", "timed"]


@dataclass
class Samples:
    """Wall-clock seconds of repeated runs of one operation."""

    seconds: list[float] = field(default_factory=list)

    def add(self, seconds: float) -> None:
        self.seconds.append(seconds)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def summary(self) -> dict[str, float | int]:
        ordered = sorted(self.seconds)
        return {
            "n": len(ordered),
            "median": statistics.median(ordered),
            "min": ordered[0],
            "p90": ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))],
            "mean": statistics.fmean(ordered),
        }


async def timed(fn: Callable[[], Awaitable[Any]], samples: Samples, *, collect: bool = False) -> Any:
    """Await ``fn()`` once, adding its wall time to ``samples``; returns its result.

    ``collect=True`` runs a full garbage collection first (outside the timing),
    so that large benchmarks do not pay for the previous repetition's garbage.
    """
    if collect:
        gc.collect()
    start = time.perf_counter()
    result = await fn()
    samples.add(time.perf_counter() - start)
    return result


async def alternate(
    operations: tuple[Callable[[], Awaitable[Any]], Callable[[], Awaitable[Any]]], reps: int
) -> tuple[Samples, Samples]:
    """Time two operations `reps` times each, alternating (which goes first too); their samples."""
    first, second = Samples(), Samples()
    for turn in range(reps):
        pairs = ((operations[0], first), (operations[1], second))[:: 1 if turn % 2 else -1]
        for operation, samples in pairs:
            await timed(operation, samples)
    return first, second


Job = tuple[Samples, Callable[[], Awaitable[Any]]]


async def interleaved(jobs: Sequence[Job], rounds: int, *, offset: int = 0, collect: bool = False) -> None:
    """Run every job once per round, rotating who goes first, each adding its time to its samples.

    Load that drifts meanwhile (other processes on the machine) then hits every series alike.
    """
    for round_ in range(offset, offset + rounds):
        shift = round_ % len(jobs)
        for samples, job in [*jobs[shift:], *jobs[:shift]]:
            await timed(job, samples, collect=collect)
