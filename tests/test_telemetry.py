"""OpenTelemetry traces and metrics (`memorm.telemetry`), read back through the SDK's in-memory exporters."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
import sqlalchemy as sa
from conftest import ENGINES, Store
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from reliability.test_connections import _kill, _sibling

from memorm import Database, Message, telemetry
from memorm.errors import NotFoundError
from memorm.repositories import MessageRepository
from memorm.telemetry import COUNTING, active, instrument, uninstrument

pytestmark = pytest.mark.anyio

SECRET = "the-content-no-span-may-show"


@dataclass
class Exported:
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader
    tracing: TracerProvider
    metering: MeterProvider

    def finished(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if name is None or s.name == name]

    def points(self, name: str) -> list[Any]:
        data = self.metrics.get_metrics_data()
        assert data is not None
        return [
            point
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == name
            for point in metric.data.data_points
        ]


@pytest.fixture
def exported() -> Iterator[Exported]:
    spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracing, metering = TracerProvider(), MeterProvider(metric_readers=[reader])
    tracing.add_span_processor(SimpleSpanProcessor(spans))
    instrument(tracer_provider=tracing, meter_provider=metering)
    try:
        yield Exported(spans, reader, tracing, metering)
    finally:
        uninstrument()


@pytest.fixture
async def chat(db: Database) -> uuid.UUID:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("otel")
        return (await uow.sessions.create(agent.id)).id


async def test_without_a_provider_nothing_is_traced_or_wrapped(db: Database, chat: uuid.UUID) -> None:
    assert active() is None  # OpenTelemetry's API is installed, but no provider was set
    async with db.unit_of_work() as uow:
        assert type(uow.messages) is MessageRepository
        await uow.messages.append(chat, [Message(role="user", content="hi")])


async def test_a_unit_of_work_and_its_calls_are_spans_with_the_database_conventions(
    db: Database, chat: uuid.UUID, exported: Exported
) -> None:
    async with db.unit_of_work() as uow:
        await uow.messages.append(chat, [Message(role="user", content=SECRET), {"role": "assistant"}])
    async with db.unit_of_work(read_only=True) as uow:
        window = await uow.messages.window(chat, limit=10)
    assert len(window) == 2
    units = exported.finished("memorm.unit_of_work")
    assert [u.attributes["memorm.read_only"] for u in units] == [False, True]
    assert {u.attributes["memorm.outcome"] for u in units} == {"commit"}
    assert all(u.attributes["db.system.name"] == db.dialect for u in units)
    append, read = exported.finished("memorm.messages.append"), exported.finished("memorm.messages.window")
    assert len(append) == len(read) == 1
    assert append[0].parent is not None
    assert append[0].parent.span_id == units[0].context.span_id
    assert read[0].parent is not None
    assert read[0].parent.span_id == units[1].context.span_id
    assert append[0].attributes["db.operation.name"] == "append"
    assert append[0].attributes["db.collection.name"] == "messages"
    assert append[0].attributes["db.response.returned_rows"] == 2
    assert read[0].attributes["db.response.returned_rows"] == 2
    assert read[0].attributes["memorm.statements"] >= 1
    assert units[1].attributes["memorm.statements"] >= read[0].attributes["memorm.statements"]
    # By default: no statement text, no tenant, and never a value.
    everything = [*units, *append, *read]
    assert not any(span.events for span in everything)
    assert not any("memorm.tenant" in span.attributes for span in everything)
    assert SECRET not in repr([dict(span.attributes) for span in everything])


async def test_statement_text_and_tenant_only_when_asked_and_never_values(
    db: Database, chat: uuid.UUID, exported: Exported
) -> None:
    instrument(
        tracer_provider=exported.tracing, meter_provider=exported.metering, statements=True, tenant=True
    )
    async with db.unit_of_work() as uow:
        await uow.messages.append(chat, [Message(role="user", content=SECRET)])
    (unit,) = exported.finished("memorm.unit_of_work")
    (append,) = exported.finished("memorm.messages.append")
    assert unit.attributes["memorm.tenant"] == "default"
    texts = [event.attributes["db.query.text"] for event in append.events if event.name == "db.query"]
    assert texts
    assert any("messages" in str(text).lower() for text in texts)
    assert SECRET not in repr([*texts, dict(append.attributes), dict(unit.attributes)])


async def test_a_failed_call_records_its_memorm_error_class(db: Database, exported: Exported) -> None:
    with pytest.raises(NotFoundError):
        async with db.unit_of_work() as uow:
            await uow.messages.append(uuid.uuid4(), [Message(role="user", content="lost")])
    (call,) = exported.finished("memorm.messages.append")
    assert call.status.status_code is StatusCode.ERROR
    assert call.attributes["error.type"] == "NotFoundError"
    assert [event.name for event in call.events] == ["exception"]
    (unit,) = exported.finished("memorm.unit_of_work")
    assert unit.attributes["memorm.outcome"] == "rollback"
    assert unit.attributes["error.type"] == "NotFoundError"
    errors = exported.points("memorm.errors")
    assert [(p.attributes["error.type"], p.value) for p in errors] == [("NotFoundError", 1)]


async def test_metrics_time_units_and_calls_and_observe_the_pools(
    db: Database, chat: uuid.UUID, exported: Exported
) -> None:
    for _ in range(3):
        async with db.unit_of_work(read_only=True) as uow:
            await uow.messages.window(chat)
    units = exported.points("memorm.unit_of_work.duration")
    assert sum(p.count for p in units) == 3
    assert {p.attributes["memorm.outcome"] for p in units} == {"commit"}
    calls = exported.points("db.client.operation.duration")
    assert [(p.attributes["db.operation.name"], p.count) for p in calls] == [("window", 3)]
    assert sum(p.count for p in exported.points("db.client.connection.wait_time")) == 3
    mine = telemetry._ENGINES[db.engines]  # this database's pool name
    counts = {
        p.attributes["db.client.connection.state"]: p.value
        for p in exported.points("db.client.connection.count")
        if p.attributes["db.client.connection.pool.name"] == mine
    }
    assert counts.get("used", 0) == 0  # every unit of work gave its connection back
    assert counts["idle"] >= 1
    limits = exported.points("db.client.connection.max")
    assert [p.value for p in limits if p.attributes["db.client.connection.pool.name"] == mine] == [15]


@pytest.mark.parametrize("how", ["task.cancel", "wait_for"])
async def test_a_cancelled_unit_of_work_ends_its_span_as_cancelled(
    db: Database, chat: uuid.UUID, exported: Exported, how: str
) -> None:
    started = asyncio.Event()

    async def held() -> None:
        async with db.unit_of_work() as uow:
            await uow.messages.append(chat, [Message(role="user", content="x")])
            started.set()
            await asyncio.sleep(30)

    if how == "task.cancel":
        task = asyncio.ensure_future(held())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    else:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(held(), 0.5)
    (unit,) = exported.finished("memorm.unit_of_work")
    assert unit.attributes["memorm.outcome"] == "cancelled"
    assert unit.status.status_code is not StatusCode.ERROR
    assert COUNTING.get() == ()
    assert db.engine.pool.checkedout() == 0


@pytest.mark.parametrize("engine", [ENGINES[1]], indirect=True)
@pytest.mark.direct  # behind a pooler, the pooler sees its server connections die
async def test_connections_found_dead_are_counted(db: Database, store: Store, exported: Exported) -> None:
    application = f"memorm-otel-{uuid.uuid4().hex[:8]}"
    small = _sibling(db, store, application, pool_size=1, max_overflow=0)
    try:
        async with small.unit_of_work(read_only=True) as uow:
            await uow.agents.list()
        assert await _kill(application) == 1
        async with small.unit_of_work(read_only=True) as uow:
            await uow.agents.list()
    finally:
        await small.dispose()
    assert sum(p.value for p in exported.points("memorm.connections.dead")) == 1


GLOBAL_PROVIDERS = """
import asyncio, sys
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from memorm import Database
from memorm.telemetry import active

async def main():
    async with Database(sys.argv[1]) as db:
        await db.create_all()
        assert active() is None
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)  # as a server's start-up does, after memorm was imported
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        async with db.unit_of_work() as uow:
            await uow.agents.create("global")
        print(sorted(span.name for span in exporter.get_finished_spans()))
        data = reader.get_metrics_data()
        print(sorted(m.name for r in data.resource_metrics for s in r.scope_metrics for m in s.metrics))

asyncio.run(main())
"""


@pytest.mark.sqlite
def test_the_global_providers_are_followed_once_the_application_sets_them(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'memorm.db'}"
    done = subprocess.run(
        [sys.executable, "-c", GLOBAL_PROVIDERS, url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    spans, instruments = done.stdout.strip().splitlines()
    assert spans == "['memorm.agents.create', 'memorm.unit_of_work']"
    assert "memorm.unit_of_work.duration" in instruments
    assert "db.client.connection.count" in instruments
    assert done.stderr == ""  # nothing logged


async def test_statements_of_your_own_queries_are_counted_too(db: Database, exported: Exported) -> None:
    async with db.unit_of_work(read_only=True) as uow:
        await uow.session.execute(sa.text("SELECT 1"))
        await uow.session.execute(sa.text("SELECT 2"))
    (unit,) = exported.finished("memorm.unit_of_work")
    assert unit.attributes["memorm.statements"] >= 2


async def test_units_of_work_on_another_loop_in_a_thread_are_traced_apart(
    db: Database, chat: uuid.UUID, exported: Exported
) -> None:
    async def read() -> None:
        async with db.unit_of_work(read_only=True) as uow:
            await uow.messages.window(chat)
        assert COUNTING.get() == ()  # nothing of the unit of work left in this loop's context

    def in_thread() -> None:
        asyncio.run(read())  # a loop of its own, as a sync framework's worker thread runs one

    thread = threading.Thread(target=in_thread)
    thread.start()
    await read()
    await anyio.to_thread.run_sync(thread.join)
    units = exported.finished("memorm.unit_of_work")
    calls = exported.finished("memorm.messages.window")
    assert len(units) == len(calls) == 2
    parents = sorted(call.parent.span_id for call in calls if call.parent is not None)
    assert parents == sorted(unit.context.span_id for unit in units)  # each call under its own unit
    assert all(unit.attributes["memorm.outcome"] == "commit" for unit in units)
