"""The spans and timings of units of work and repository calls (`memorm.telemetry` turns them on)."""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from memorm.errors import PoolTimeoutError
from memorm.telemetry import COUNTING, Counting, Telemetry

try:
    from opentelemetry import trace as otel_trace
except ImportError:  # pragma: no cover - never made without it (`memorm.telemetry.active`)
    otel_trace = None  # type: ignore[assignment]

__all__ = ["COLLECTIONS", "Traced", "UnitTrace"]

T = TypeVar("T")

# The table each repository reads and writes first (OpenTelemetry's db.collection.name).
COLLECTIONS = {
    "agents": "agents",
    "sessions": "sessions",
    "messages": "messages",
    "passages": "archival_passages",
    "checkpoints": "graph_checkpoints",
    "graph_store": "graph_store_items",
}


# -- units of work ----------------------------------------------------------------------------


class UnitTrace:
    """One unit of work's span and timings, from `__aenter__` to `__aexit__`."""

    __slots__ = (
        "_context",
        "attributes",
        "counting",
        "entered",
        "previous",
        "read_only",
        "span",
        "started",
        "telemetry",
    )

    def __init__(
        self, telemetry: Telemetry, dialect: str, namespace: str | None, read_only: bool, tenant: str | None
    ) -> None:
        self.telemetry = telemetry
        self.read_only = read_only
        self.started = time.perf_counter()
        self.entered: float | None = None
        self.attributes: dict[str, Any] = {"db.system.name": dialect, "db.namespace": namespace or ""}
        span_attributes = {**self.attributes, "memorm.read_only": read_only}
        if telemetry.tenant and tenant is not None:
            span_attributes["memorm.tenant"] = tenant
        tracer = telemetry.tracer
        self.span = (
            None
            if tracer is None
            else tracer.start_span("memorm.unit_of_work", kind=_client(), attributes=span_attributes)
        )
        self._context: Any = None
        self.counting = Counting(self.span)
        self.previous = COUNTING.get()
        COUNTING.set((*self.previous, self.counting))

    def context(self) -> Any:
        """The OpenTelemetry context whose span is this unit of work's (its calls' parent)."""
        if self._context is None and self.span is not None:
            self._context = otel_trace.set_span_in_context(self.span)
        return self._context

    async def enter(self, opening: Awaitable[T]) -> T:
        """`opening` (the unit of work's own `__aenter__`), timed until it holds its connection."""
        try:
            opened = await opening
        except BaseException as error:
            self.closed(error)
            raise
        self.entered = time.perf_counter()
        if self.telemetry.meter is not None:
            self.telemetry.meter.wait_time.record(self.entered - self.started, self.attributes)
        return opened

    async def exit(self, closing: Awaitable[None], exc: BaseException | None) -> None:
        """`closing` (the unit of work's own `__aexit__`), then the span and metrics ended."""
        try:
            await closing
        except BaseException as error:
            self.closed(error)
            raise
        self.closed(exc)

    def closed(self, error: BaseException | None) -> None:
        """The unit of work closed: committed (`error` None), rolled back, cancelled or failed."""
        COUNTING.set(self.previous)
        if error is None:
            outcome = "commit"
        elif not isinstance(error, Exception):
            outcome = "cancelled"
        else:
            outcome = "rollback" if self.entered is not None else "error"
        kind = None if error is None or outcome == "cancelled" else type(error).__name__
        telemetry = self.telemetry
        if telemetry.meter is not None:
            attributes = {**self.attributes, "memorm.read_only": self.read_only, "memorm.outcome": outcome}
            if kind is not None and error is not None:
                attributes["error.type"] = kind
                _count_error(telemetry, error, self.attributes)
            telemetry.meter.unit_duration.record(time.perf_counter() - self.started, attributes)
        span = self.span
        if span is not None:
            span.set_attributes({"memorm.outcome": outcome, "memorm.statements": self.counting.statements})
            if kind is not None and error is not None:
                _fail(span, error, kind)
            span.end()


def _count_error(telemetry: Telemetry, error: BaseException, attributes: dict[str, Any]) -> None:
    meter = telemetry.meter
    assert meter is not None
    meter.errors.add(1, {**attributes, "error.type": type(error).__name__})
    if isinstance(error, PoolTimeoutError):
        meter.timeouts.add(1, attributes)


def _fail(span: Any, error: BaseException, kind: str) -> None:
    span.set_attribute("error.type", kind)
    span.record_exception(error)
    span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, str(error)))


def _client() -> Any:
    """OpenTelemetry's span kind for a call to a database."""
    return otel_trace.SpanKind.CLIENT


# -- repository calls ------------------------------------------------------------------------


class Traced:
    """A repository whose public coroutine methods each run in a span (`memorm.<repository>.<method>`)."""

    def __init__(self, repository: Any, name: str, trace: UnitTrace) -> None:
        self._repository = repository
        self._name = name
        self._trace = trace

    def __getattr__(self, attribute: str) -> Any:
        found = getattr(self._repository, attribute)
        if not _traced(type(self._repository), attribute, found):
            return found
        wrapped = _Call(found, self._name, attribute, self._trace)
        self.__dict__[attribute] = wrapped
        return wrapped


_TRACED: dict[tuple[type, str], bool] = {}  # (repository class, attribute): whether its calls get spans


def _traced(kind: type, attribute: str, found: Any) -> bool:
    known = _TRACED.get((kind, attribute))
    if known is None:
        known = _TRACED[(kind, attribute)] = not attribute.startswith("_") and inspect.iscoroutinefunction(
            found
        )
    return known


_ATTRIBUTES: dict[tuple[Any, ...], dict[str, Any]] = {}  # built once per shape: the SDK hashes them


def _attributes(*key: Any) -> dict[str, Any]:
    """The attributes `(dialect, namespace, repository, operation[, error])` name, made once."""
    found = _ATTRIBUTES.get(key)
    if found is None:
        dialect, namespace, repository, operation, *error = key
        found = _ATTRIBUTES[key] = {
            "db.system.name": dialect,
            "db.namespace": namespace,
            "db.operation.name": operation,
            "db.collection.name": COLLECTIONS.get(repository, repository),
            **({"error.type": error[0]} if error else {}),
        }
    return found


class _Call:
    """One repository method of one unit of work, each call in a span of its own and timed."""

    __slots__ = ("key", "method", "name", "unit")

    def __init__(self, method: Callable[..., Any], repository: str, operation: str, unit: UnitTrace) -> None:
        self.method = method
        self.unit = unit
        self.name = f"memorm.{repository}.{operation}"
        base = unit.attributes
        self.key = (base["db.system.name"], base["db.namespace"], repository, operation)

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        unit = self.unit
        telemetry = unit.telemetry
        started = time.perf_counter()
        span = None
        if telemetry.tracer is not None:
            span = telemetry.tracer.start_span(
                self.name, context=unit.context(), kind=_client(), attributes=_attributes(*self.key)
            )
        counting = Counting(span)
        outer = COUNTING.set((*COUNTING.get(), counting))
        error: BaseException | None = None
        try:
            result = await self.method(*args, **kwargs)
        except BaseException as raised:
            error = raised
            raise
        finally:
            COUNTING.reset(outer)
            kind = None if error is None or not isinstance(error, Exception) else type(error).__name__
            if telemetry.meter is not None:
                recorded = _attributes(*self.key) if kind is None else _attributes(*self.key, kind)
                telemetry.meter.operation_duration.record(time.perf_counter() - started, recorded)
            if span is not None:
                ended: dict[str, Any] = {"memorm.statements": counting.statements}
                rows = _rows(result) if error is None else None
                if rows is not None:
                    ended["db.response.returned_rows"] = rows
                span.set_attributes(ended)
                if kind is not None and error is not None:
                    _fail(span, error, kind)
                span.end()
        return result


def _rows(result: Any) -> int | None:
    """How many rows a repository call returned: a list's length, a page's items; else unknown."""
    if isinstance(result, list):
        return len(result)
    items = getattr(result, "items", None)
    return len(items) if isinstance(items, list) else None
