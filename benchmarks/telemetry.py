"""Telemetry: what memorm's OpenTelemetry support costs a unit of work, off and on.

The work is the chat path's hottest read, ``window(limit=50)`` of a session of
1,000 messages in a read-only unit of work, decoded into objects.  Five
memorm series and the raw driver's same window run interleaved:

1. memorm with no provider set (OpenTelemetry's API installed, as with the
   ``otel`` extra, but nothing set up): the cost every user pays, one check
   per unit of work;
2. memorm reporting to the SDK's providers with no exporter (the issue's
   goal: at most 5% over 1);
3. the same with an exporter that drops what it is handed (a span
   processor's cost) and a metric reader, recording the statements' text
   too (``statements=True``);
4. providers whose tracer and meter record nothing (the API's no-op
   tracer and meter behind providers that count as set): memorm's own
   machinery, the spans' and records' SDK cost left out;
5. the SDK's providers with a sampler that keeps 1% of the traces (no
   exporter): what a busy server usually runs.

The first row compares memorm with no provider against the raw driver, as
every benchmark does; the others compare memorm with telemetry on against
memorm with it off (the "raw" column of those rows is memorm, off).

A chat turn as an agent server makes it (the user's message appended, the
context read under a 2,000-token budget, the reply appended: three units of
work) runs with telemetry off and on (no exporter) too, taking turns: the
goal holds for the chat path, its hottest read and a whole turn.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from opentelemetry import metrics as otel_metrics
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from benchmarks.chat_memorm import memorm_append, memorm_context, memorm_window, new_session
from benchmarks.core import both_sides, histories
from benchmarks.report import Row
from benchmarks.timing import Samples, interleaved
from memorm import Database
from memorm.telemetry import instrument, uninstrument

NAME = "telemetry"
TARGET_OFF = 1.5  # the window's own goal (benchmarks/core.py): no provider set must not move it
OFF_GOAL = "telemetry off (no provider): window(50) within the window's goal"
TARGET_ON = 1.05
ON_GOAL = f"telemetry on, no exporter: <= {TARGET_ON:g}x telemetry off"


class _Dropped(SpanExporter):
    """Ends every span as an exporter would, then drops it: the SDK's cost, not a backend's."""

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _bare() -> dict[str, Any]:
    """The SDK's providers with nowhere to send: the issue's "a provider set and no exporter"."""
    return {"tracer_provider": TracerProvider(), "meter_provider": MeterProvider()}


class _IdleTracing(otel_trace.TracerProvider):
    """A provider set, whose tracer makes spans that record nothing (the API's no-op tracer)."""

    def get_tracer(self, *args: Any, **kwargs: Any) -> otel_trace.Tracer:
        return otel_trace.NoOpTracer()


class _IdleMetering(otel_metrics.MeterProvider):
    """A provider set, whose instruments record nothing (the API's no-op meter)."""

    def get_meter(self, name: str, *args: Any, **kwargs: Any) -> otel_metrics.Meter:
        return otel_metrics.NoOpMeter(name)


def _idle() -> dict[str, Any]:
    """Providers that do nothing with what memorm hands them: memorm's own cost, not the SDK's."""
    return {"tracer_provider": _IdleTracing(), "meter_provider": _IdleMetering()}


def _sampled() -> dict[str, Any]:
    """A tracer keeping one trace in a hundred (its other spans do not record), and a meter."""
    tracing = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.01)))
    return {"tracer_provider": tracing, "meter_provider": MeterProvider()}


def _exporting() -> dict[str, Any]:
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(_Dropped()))
    return {
        "tracer_provider": tracing,
        "meter_provider": MeterProvider(metric_readers=[InMemoryMetricReader()]),
    }


# The series with telemetry on, beside "off" and "raw": (name, providers, statements, what, note).
_ON = (
    ("on", _bare, False, "no exporter", "two spans and three metric records a unit of work"),
    ("text", _exporting, True, "an exporter, statement text", "for reference (the exporter drops all)"),
    (
        "idle",
        _idle,
        False,
        "providers that record nothing",
        "memorm's own cost: the SDK's spans and records are the rest of the row above",
    ),
    (
        "sampled",
        _sampled,
        False,
        "1% of traces sampled, metrics",
        "for reference (unsampled spans do not record)",
    ),
)


async def run_engine(engine: str, *, reads: int) -> list[Row]:
    async with both_sides(engine) as (_, db, raw, agent_id):
        chat = (await histories(db, agent_id, [1_000]))[1_000]

        def reading(
            providers: dict[str, Any] | None, statements: bool = False
        ) -> Callable[[], Awaitable[None]]:
            async def read() -> None:
                if providers is None:
                    uninstrument()
                else:
                    instrument(**providers, statements=statements)
                await memorm_window(db, chat, 50)

            return read

        async def baseline() -> None:
            await raw.window(chat, 50)

        works: dict[str, Callable[[], Awaitable[None]]] = {
            "off": reading(None),
            **{name: reading(make(), statements) for name, make, statements, _, _ in _ON},
            "raw": baseline,
        }
        try:
            await interleaved([(Samples(), work) for work in works.values()], 20)  # warm-up
            series = {name: Samples() for name in works}
            await interleaved([(series[name], work) for name, work in works.items()], reads)
        finally:
            uninstrument()
        turns = await _turns(db, agent_id, engine, reads)
    off = series["off"]
    rows = [
        Row(
            NAME,
            engine,
            "window(50) of 1,000, telemetry off (no provider set) vs raw",
            off,
            series["raw"],
            rows=50,
            target=TARGET_OFF,
            goal=OFF_GOAL,
            note="one check per unit of work whether a provider is set",
        )
    ]
    for name, _, _, what, note in _ON:
        goal = name == "on"  # the goal: a provider set, no exporter
        rows.append(
            Row(
                NAME,
                engine,
                f"window(50) of 1,000, telemetry on ({what}) vs off",
                series[name],
                off,
                rows=50,
                target=TARGET_ON if goal else None,
                goal=ON_GOAL if goal else "",
                note=f"+{(series[name].median - off.median) * 1e6:.0f} µs: {note}",
            )
        )
    return rows + turns


async def _turns(db: Database, agent_id: uuid.UUID, engine: str, turns: int) -> list[Row]:
    """A chat turn's three units of work, telemetry off and on (no exporter), taking turns."""
    chat = await new_session(db, agent_id)
    providers = _bare()
    made = itertools.count()

    def turning(on: bool) -> Callable[[], Awaitable[None]]:
        async def turn() -> None:
            if on:
                instrument(**providers)
            else:
                uninstrument()
            n = next(made)
            await memorm_append(db, chat, {"role": "user", "content": f"question {n} about the common plan"})
            await memorm_context(db, chat, 2_000)
            await memorm_append(db, chat, {"role": "assistant", "content": f"answer {n}: the plan holds"})

        return turn

    try:
        await interleaved([(Samples(), turning(False)), (Samples(), turning(True))], 20)  # warm-up
        off, on = Samples(), Samples()
        await interleaved([(off, turning(False)), (on, turning(True))], turns)
    finally:
        uninstrument()
    return [
        Row(
            NAME,
            engine,
            "chat turn (append, context 2,000 tokens, append), telemetry on (no exporter) vs off",
            on,
            off,
            rows=3,
            target=TARGET_ON,
            goal=ON_GOAL,
            note=f"+{(on.median - off.median) * 1e6:.0f} µs: three units of work, six spans, nine records",
        )
    ]


async def run(engines: Sequence[str], *, quick: bool = False) -> list[Row]:
    """The four telemetry rows on each engine in ``engines``."""
    rows: list[Row] = []
    for engine in engines:
        rows += await run_engine(engine, reads=50 if quick else 300)
    return rows
