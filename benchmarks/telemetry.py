"""Telemetry: what memorm's OpenTelemetry support costs a unit of work, off and on.

The work is the chat path's hottest read, ``window(limit=50)`` of a session of
1,000 messages in a read-only unit of work, decoded into objects.  Three
memorm series and the raw driver's same window run interleaved:

1. memorm with no provider set (OpenTelemetry's API installed, as with the
   ``otel`` extra, but nothing set up): the cost every user pays, one check
   per unit of work;
2. memorm reporting to the SDK's providers (a span processor that drops
   what it is handed, and a metric reader): the cost of the spans and
   instruments themselves;
3. memorm with the statements' text recorded too (``statements=True``).

Each row compares memorm against the raw driver, as every benchmark does;
the notes give the on/off ratios the issue asks about.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from benchmarks.chat_memorm import memorm_window
from benchmarks.core import both_sides, histories
from benchmarks.report import Row
from benchmarks.timing import Job, Samples, interleaved
from memorm.telemetry import instrument, uninstrument

NAME = "telemetry"
TARGET_OFF = 1.5  # the window's own goal (benchmarks/core.py): no provider set must not move it
OFF_GOAL = "telemetry off (no provider): window(50) within the window's goal"


class _Dropped(SpanExporter):
    """Ends every span as an exporter would, then drops it: the SDK's cost, not a backend's."""

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _providers() -> dict[str, Any]:
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(_Dropped()))
    return {
        "tracer_provider": tracing,
        "meter_provider": MeterProvider(metric_readers=[InMemoryMetricReader()]),
    }


async def run_engine(engine: str, *, reads: int) -> list[Row]:
    async with both_sides(engine) as (_, db, raw, agent_id):
        chat = (await histories(db, agent_id, [1_000]))[1_000]
        providers = _providers()

        async def off() -> None:
            uninstrument()
            await memorm_window(db, chat, 50)

        async def on() -> None:
            instrument(**providers)
            await memorm_window(db, chat, 50)

        async def with_text() -> None:
            instrument(**providers, statements=True)
            await memorm_window(db, chat, 50)

        async def baseline() -> None:
            await raw.window(chat, 50)

        series = {name: Samples() for name in ("off", "on", "text", "raw")}
        jobs: list[Job] = [
            (series["off"], off),
            (series["on"], on),
            (series["text"], with_text),
            (series["raw"], baseline),
        ]
        try:
            await interleaved(jobs, 20)  # warm-up
            series = {name: Samples() for name in series}
            jobs = [(series[name], job) for name, (_, job) in zip(series, jobs, strict=True)]
            await interleaved(jobs, reads)
        finally:
            uninstrument()
    off_median = series["off"].median
    rows = [
        Row(
            NAME,
            engine,
            "window(50) of 1,000, telemetry off (no provider set)",
            series["off"],
            series["raw"],
            rows=50,
            target=TARGET_OFF,
            goal=OFF_GOAL,
            note="one check per unit of work whether a provider is set",
        )
    ]
    for name, what in (("on", "spans and metrics"), ("text", "spans, metrics and statement text")):
        rows.append(
            Row(
                NAME,
                engine,
                f"window(50) of 1,000, telemetry on ({what})",
                series[name],
                series["raw"],
                rows=50,
                note=f"{series[name].median / off_median:.2f}x memorm with telemetry off "
                f"(+{(series[name].median - off_median) * 1e6:.0f} µs a unit of work and its call)",
            )
        )
    return rows


async def run(engines: Sequence[str], *, quick: bool = False) -> list[Row]:
    """The three telemetry rows on each engine in ``engines``."""
    rows: list[Row] = []
    for engine in engines:
        rows += await run_engine(engine, reads=50 if quick else 300)
    return rows
