"""OpenTelemetry traces and metrics of units of work and repository calls (the `memorm[otel]` extra).

memorm reports to the tracer and meter providers the application set
(`opentelemetry.trace.set_tracer_provider`, `metrics.set_meter_provider`), or
to those given to [`instrument`][memorm.telemetry.instrument].  Without
OpenTelemetry's API installed, or with no provider set, nothing is made and
each unit of work pays one check (`active`).

What is recorded, after OpenTelemetry's database conventions:

* a span per unit of work (`memorm.unit_of_work`) and, inside it, one per
  repository call (`memorm.messages.append`, `memorm.passages.search`…), with
  `db.system.name`, `db.namespace`, `db.operation.name`,
  `db.collection.name`, the rows returned (`db.response.returned_rows`) and
  the statements sent (`memorm.statements`); a failure is recorded with its
  `memorm.errors` class as `error.type`.  The statements' SQL text only with
  `instrument(statements=True)` (as `db.query.text` events), parameter values
  never; the tenant only with `instrument(tenant=True)`;
* metrics: `memorm.unit_of_work.duration` (by `memorm.read_only` and
  `memorm.outcome`), `db.client.operation.duration` per repository call,
  `db.client.connection.wait_time` (until a unit of work holds its
  connection), `db.client.connection.timeouts`, `memorm.errors` by class,
  `memorm.connections.dead` (connections found dead and replaced), and the
  pools as observed gauges: `db.client.connection.count` (by state
  `used`/`idle`), `db.client.connection.max` and
  `db.client.connection.pending_requests`.
"""

from __future__ import annotations

import contextvars
import itertools
import os
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

from memorm.connection_state import WATCHERS
from memorm.engines import Engines
from memorm.errors import MemormError
from memorm.pool_figures import pool_figures
from memorm.validation import check_flag

try:
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace as otel_trace
    from opentelemetry.metrics import _internal as _metrics_internal
except ImportError:  # pragma: no cover - the extra is not installed
    otel_metrics = otel_trace = _metrics_internal = None  # type: ignore[assignment]

# Whether the environment names a provider (OpenTelemetry loads it on first use).
_FROM_ENV = bool({"OTEL_PYTHON_TRACER_PROVIDER", "OTEL_PYTHON_METER_PROVIDER"} & os.environ.keys())
_MISSING = object()

__all__ = [
    "COUNTING",
    "Counting",
    "Instruments",
    "Telemetry",
    "active",
    "connection_dead",
    "instrument",
    "track",
    "uninstrument",
]

SCOPE = "memorm"


class _Options:
    __slots__ = ("meter_provider", "statements", "tenant", "tracer_provider")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.tracer_provider: Any = None
        self.meter_provider: Any = None
        self.statements = False
        self.tenant = False


_OPTIONS = _Options()


def instrument(
    *,
    tracer_provider: Any = None,
    meter_provider: Any = None,
    statements: bool = False,
    tenant: bool = False,
) -> None:
    """Report to these providers (default: the global ones), and say what spans may carry.

    Args:
        tracer_provider: an OpenTelemetry `TracerProvider` (None: the global one, if set).
        meter_provider: an OpenTelemetry `MeterProvider` (None: the global one, if set).
        statements: add each statement's SQL text to its repository call's span
            (`db.query.text` events).  Parameter values are never recorded.
        tenant: add the unit of work's tenant (`memorm.tenant`) to its spans.

    Raises:
        MemormError: OpenTelemetry's API is not installed (`pip install memorm[otel]`).
    """
    if otel_trace is None:  # pragma: no cover - the extra is not installed
        raise MemormError("memorm.telemetry needs OpenTelemetry's API: pip install 'memorm[otel]'")
    _OPTIONS.statements = check_flag(statements, "statements")
    _OPTIONS.tenant = check_flag(tenant, "tenant")
    _OPTIONS.tracer_provider = tracer_provider
    _OPTIONS.meter_provider = meter_provider
    _forget()


def uninstrument() -> None:
    """Back to the defaults: the global providers, no statement text, no tenant."""
    _OPTIONS.reset()
    _forget()


class Instruments:
    """memorm's metric instruments on one meter provider (made once per provider: `_instruments`)."""

    def __init__(self, meter_provider: Any) -> None:
        meter = meter_provider.get_meter(SCOPE)
        self.unit_duration = meter.create_histogram(
            "memorm.unit_of_work.duration", unit="s", description="A unit of work, from asking to closed"
        )
        self.operation_duration = meter.create_histogram(
            "db.client.operation.duration", unit="s", description="A repository call"
        )
        self.wait_time = meter.create_histogram(
            "db.client.connection.wait_time",
            unit="s",
            description="Until a unit of work holds its connection",
        )
        self.timeouts = meter.create_counter(
            "db.client.connection.timeouts", description="Units of work that found no connection in time"
        )
        self.errors = meter.create_counter("memorm.errors", description="Errors raised, by class")
        self.dead = meter.create_counter(
            "memorm.connections.dead", description="Connections found dead (a restart, an idle timeout)"
        )
        meter.create_observable_up_down_counter(
            "db.client.connection.count", callbacks=[_connection_counts], description="Open connections"
        )
        meter.create_observable_up_down_counter(
            "db.client.connection.max", callbacks=[_connection_limits], description="The pools' bounds"
        )
        meter.create_observable_up_down_counter(
            "db.client.connection.pending_requests",
            callbacks=[_pending],
            description="Units of work waiting for a connection",
        )


_INSTRUMENTS: weakref.WeakKeyDictionary[Any, Instruments] = weakref.WeakKeyDictionary()


def _instruments(meter_provider: Any) -> Instruments:
    """The instruments on `meter_provider`, made the first time (a second set would be refused)."""
    found = _INSTRUMENTS.get(meter_provider)
    if found is None:
        found = _INSTRUMENTS[meter_provider] = Instruments(meter_provider)
    return found


_TRACERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _tracer(tracer_provider: Any) -> Any:
    """memorm's tracer of `tracer_provider` (made once: `instrument` may be called again and again)."""
    found = _TRACERS.get(tracer_provider)
    if found is None:
        found = _TRACERS[tracer_provider] = tracer_provider.get_tracer(SCOPE)
    return found


class Telemetry:
    """The tracer and instruments memorm reports to (either may be None: that provider is not set)."""

    def __init__(self, tracer_provider: Any, meter_provider: Any) -> None:
        self.tracer: Any = None if tracer_provider is None else _tracer(tracer_provider)
        self.meter = None if meter_provider is None else _instruments(meter_provider)
        self.statements = _OPTIONS.statements
        self.tenant = _OPTIONS.tenant


_NOT_SET: tuple[Any, Any, Telemetry | None] = (object(), object(), None)
_current = _NOT_SET


def active() -> Telemetry | None:
    """What memorm reports to now; None (the cheap answer) when no provider is set."""
    global _current
    if otel_trace is None:  # pragma: no cover - the extra is not installed
        return None
    tracing, metering = _global_providers()
    tracing = _OPTIONS.tracer_provider or tracing
    metering = _OPTIONS.meter_provider or metering
    seen_tracing, seen_metering, found = _current
    if tracing is seen_tracing and metering is seen_metering:
        return found
    no_op = (otel_trace.ProxyTracerProvider, otel_trace.NoOpTracerProvider)
    tracer = None if tracing is None or isinstance(tracing, no_op) else tracing
    meter = None if _no_op_meter(metering) else metering
    found = None if tracer is None and meter is None else Telemetry(tracer, meter)
    if found is not None:
        _watch_statements()
    _current = (tracing, metering, found)
    return found


def _global_providers() -> tuple[Any, Any]:
    """The global tracer and meter providers, None where none is set.

    Read from OpenTelemetry's modules: its getters look the environment up on
    every call (a microsecond or two, most of what a unit of work pays when no
    provider is set).  When the environment names a provider (the getters then
    load it), or the globals are not where they were, the getters answer.
    """
    if not _FROM_ENV:
        tracing = getattr(otel_trace, "_TRACER_PROVIDER", _MISSING)
        metering = getattr(_metrics_internal, "_METER_PROVIDER", _MISSING)
        if tracing is not _MISSING and metering is not _MISSING:
            return tracing, metering
    return otel_trace.get_tracer_provider(), otel_metrics.get_meter_provider()


def _no_op_meter(provider: Any) -> bool:
    if provider is None:
        return True
    # The global default is a private proxy class until a provider is set.
    return (
        isinstance(provider, otel_metrics.NoOpMeterProvider)
        or type(provider).__name__ == "_ProxyMeterProvider"
    )


def _forget() -> None:
    global _current
    _current = _NOT_SET


# -- statements ------------------------------------------------------------------------------


class Counting:
    """The statements a unit of work or a repository call sent, and its span (None: no tracer)."""

    __slots__ = ("span", "statements")

    def __init__(self, span: Any) -> None:
        self.span = span
        self.statements = 0


COUNTING: contextvars.ContextVar[tuple[Counting, ...]] = contextvars.ContextVar("memorm_counting", default=())
_watching = False


def _watch_statements() -> None:
    """Count (and with `statements=True`, record) what the units of work send: both paths, once."""
    global _watching
    if _watching:
        return
    _watching = True
    WATCHERS.append(_on_driver)
    event.listen(Engine, "before_cursor_execute", _on_sqlalchemy)


def _on_driver(_pool: Any, statement: str, _parameters: Sequence[Any]) -> None:
    _counted(statement)


def _on_sqlalchemy(
    _conn: Any, _cursor: Any, statement: str, _parameters: Any, _context: Any, _many: bool
) -> None:
    _counted(statement)


def _counted(statement: str) -> None:
    counting = COUNTING.get()
    if not counting:
        return
    for each in counting:
        each.statements += 1
    span = counting[-1].span
    if span is not None and _OPTIONS.statements:
        span.add_event("db.query", {"db.query.text": statement})


# -- pools -----------------------------------------------------------------------------------

# Every database's engines, for the gauges, with its pool's name (db.client.connection.pool.name).
_ENGINES: weakref.WeakKeyDictionary[Engines, str] = weakref.WeakKeyDictionary()
_tracked = itertools.count(1)


def track(engines: Engines, where: str) -> None:
    """Count `engines`' pools in the connection gauges, named after `where` (no credentials in it)."""
    _ENGINES[engines] = f"{where}#{next(_tracked)}"


def connection_dead() -> None:
    """A connection was found dead at check-out or at its first statement, and replaced."""
    telemetry = active()
    if telemetry is not None and telemetry.meter is not None:
        telemetry.meter.dead.add(1)


def _observations(read: Callable[[Any], Iterable[tuple[int, dict[str, Any]]]]) -> list[Any]:
    found = []
    for engines, name in list(_ENGINES.items()):
        figures = pool_figures(engines)
        if figures.loops:
            for value, attributes in read(figures):
                pool = {**attributes, "db.client.connection.pool.name": name}
                found.append(otel_metrics.Observation(value, pool))
    return found


def _connection_counts(_options: Any) -> list[Any]:
    return _observations(
        lambda f: [
            (f.in_use, {"db.client.connection.state": "used"}),
            (f.idle, {"db.client.connection.state": "idle"}),
        ]
    )


def _connection_limits(_options: Any) -> list[Any]:
    return _observations(lambda f: [] if f.limit is None else [(f.limit, {})])


def _pending(_options: Any) -> list[Any]:
    return _observations(lambda f: [(f.waiting, {})])
