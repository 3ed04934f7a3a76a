"""Bad archival input raises ValidationError (or NotFoundError) before anything is written.

Each check runs inside a unit of work that then commits: a rejected call must
leave the unit of work usable and the store untouched, archive version included.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pytest
from conftest import count_rows

from memorm import Agent, ConflictError, Database, NotFoundError, ValidationError
from memorm.testing import capture_statements

pytestmark = pytest.mark.anyio

BAD_VECTORS = [
    [],
    [1.0, math.nan],
    [math.inf, 0.0],
    [-math.inf, 0.0],
    [1.0, "2.0"],
    [1.0, None],
    [True, 0.0],
    [1.0, [2.0]],
    "1.0,2.0",
    b"\x00\x00\x80?\x00\x00\x80?",
    np.ones((1, 2)),
    np.array([0.5, np.nan]),
    {"x": 1.0, "y": 2.0},
    1.0,
]
BAD_WHERE = [
    {"a.b": 1},
    {"$x": 1},
    {"it's": 1},
    {'x"]': 1},
    {"": 1},
    {"k" * 65: 1},
    {"k": {"$ne": 1}},
    {"k": {"$in": 1}},
    {"k": {"$in": []}},
    {"k": {"$in": [1], "$nin": [2]}},
    {"k": {"$in": [[1]]}},
    {"k": [1, 2]},
    {"k": {"nested": 1}},
    {"k": math.nan},
    {"k": b"bytes"},
    {"created_at": {"$gte": datetime(2024, 1, 1)}},  # naive
    {"created_at": {"$gte": "2024-01-01T00:00:00Z"}},
    {"created_at": {"$eq": datetime(2024, 1, 1, tzinfo=timezone.utc)}},
    {"created_at": {}},
    {"created_at": datetime(2024, 1, 1, tzinfo=timezone.utc)},
    {1: "x"},
    ["k", 1],
]


async def _agent_with_a_passage(db: Database) -> Agent:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("sam")
        await uow.passages.add(agent.id, "first", [1.0, 0.0])
    async with db.unit_of_work(read_only=True) as uow:
        return await uow.agents.get(agent.id)


async def _assert_untouched(db: Database, agent: Agent) -> None:
    assert await count_rows(db, "archival_passages") == 1
    assert await count_rows(db, "embedding_models") == 1
    async with db.unit_of_work(read_only=True) as uow:
        # Bumped by every passage write: a rejected call wrote nothing at all.
        assert (await uow.agents.get(agent.id)).archive_version == agent.archive_version
        [passage] = await uow.passages.list(agent.id)
    assert (passage.text, passage.embedding) == ("first", [1.0, 0.0])


@pytest.mark.parametrize("vector", BAD_VECTORS, ids=repr)
async def test_bad_vectors_are_rejected_by_every_call_that_takes_one(db: Database, vector: Any) -> None:
    agent = await _agent_with_a_passage(db)
    async with db.unit_of_work() as uow:
        [passage] = await uow.passages.list(agent.id)
        with pytest.raises(ValidationError):
            await uow.passages.add_many(
                agent.id, [{"text": "ok", "embedding": [0.0, 1.0]}, {"text": "bad", "embedding": vector}]
            )
        with pytest.raises(ValidationError):
            await uow.passages.update_text(passage.id, "changed", vector)
        with pytest.raises(ValidationError):
            await uow.passages.search(agent.id, vector, metric="l2")
        with pytest.raises(ValidationError):
            await uow.passages.hybrid_search(agent.id, "first", vector)
    await _assert_untouched(db, agent)


async def test_a_vector_of_another_dimension_than_the_model_is_rejected(db: Database) -> None:
    agent = await _agent_with_a_passage(db)
    async with db.unit_of_work() as uow:
        [passage] = await uow.passages.list(agent.id)
        for wrong in ([1.0], [1.0, 0.0, 0.0]):
            with pytest.raises(ValidationError):
                await uow.passages.add(agent.id, "wrong", wrong)
            with pytest.raises(ValidationError):
                await uow.passages.add_many(
                    agent.id, [{"text": "ok", "embedding": [0.0, 1.0]}, {"text": "x", "embedding": wrong}]
                )
            with pytest.raises(ValidationError):
                await uow.passages.update_text(passage.id, "wrong", wrong)
            with pytest.raises(ValidationError):
                await uow.passages.search(agent.id, wrong)
        with pytest.raises(ConflictError):
            await uow.passages.define_model(agent.id, "default", 3)
        with pytest.raises(ConflictError):
            await uow.passages.define_model(agent.id, "default", 2, precision="float16")
        assert (await uow.passages.define_model(agent.id, "default", 2)).dim == 2  # same shape: a no-op
    await _assert_untouched(db, agent)


async def test_a_rejected_batch_registers_no_model_and_bumps_no_version(db: Database) -> None:
    agent = await _agent_with_a_passage(db)
    mixed = [{"text": "2-d", "embedding": [1.0, 2.0]}, {"text": "3-d", "embedding": [1.0, 2.0, 3.0]}]
    async with db.unit_of_work() as uow:
        with pytest.raises(ValidationError):  # two shapes for one new model
            await uow.passages.add_many(agent.id, [item | {"embedding_model": "new"} for item in mixed])
        with pytest.raises(ValidationError):  # a new model, then a wrong shape for the known one
            await uow.passages.add_many(agent.id, [mixed[0] | {"embedding_model": "new"}, mixed[1]])
    async with db.unit_of_work() as uow:
        with pytest.raises(NotFoundError):
            await uow.passages.get_model(agent.id, "new")
    await _assert_untouched(db, agent)
    async with db.unit_of_work() as uow:  # the model is still free to take its real dimension
        await uow.passages.add(agent.id, "3-d", [1.0, 2.0, 3.0], embedding_model="new")


@pytest.mark.parametrize(
    "arguments",
    [
        {"metric": "dot"},
        {"metric": "COSINE"},
        {"metric": None},
        {"k": 0},
        {"k": 1001},
        {"k": -1},
        {"k": True},
        {"k": 2.0},
        {"k": "10"},
        {"offset": -1},
        {"offset": 1.5},
        {"ef_search": 0},
        {"ef_search": 1001},
        {"ef_search": True},
        {"embedding_model": ""},
        {"embedding_model": "  "},
        {"embedding_model": None},
    ],
    ids=repr,
)
async def test_bad_search_arguments_are_rejected(db: Database, arguments: dict[str, Any]) -> None:
    agent = await _agent_with_a_passage(db)
    async with db.unit_of_work(read_only=True) as uow:
        with pytest.raises(ValidationError):
            await uow.passages.search(agent.id, [1.0, 0.0], **arguments)
        if "offset" not in arguments and "ef_search" not in arguments:
            with pytest.raises(ValidationError):
                await uow.passages.hybrid_search(agent.id, "first", [1.0, 0.0], **arguments)


async def test_zero_query_vector_has_no_cosine_distance_but_has_the_others(db: Database) -> None:
    agent = await _agent_with_a_passage(db)
    async with db.unit_of_work(read_only=True) as uow:
        with pytest.raises(ValidationError):
            await uow.passages.search(agent.id, [0.0, 0.0])
        with pytest.raises(ValidationError):
            await uow.passages.search(agent.id, np.zeros(2), metric="cosine")
        [l2] = await uow.passages.search(agent.id, [0.0, 0.0], metric="l2")
        [ip] = await uow.passages.search(agent.id, [0.0, 0.0], metric="inner_product")
    assert (l2.distance, ip.distance) == (1.0, 0.0)


@pytest.mark.parametrize("where", BAD_WHERE, ids=repr)
async def test_bad_filters_are_rejected_by_search_and_delete_where(db: Database, where: Any) -> None:
    agent = await _agent_with_a_passage(db)
    async with db.unit_of_work() as uow:
        with pytest.raises(ValidationError):
            await uow.passages.search(agent.id, [1.0, 0.0], where=where)
        with pytest.raises(ValidationError):
            await uow.passages.delete_where(agent.id, where)
    await _assert_untouched(db, agent)


async def test_delete_where_without_a_condition_is_rejected(db: Database) -> None:
    agent = await _agent_with_a_passage(db)
    async with db.unit_of_work() as uow:
        with pytest.raises(ValidationError):
            await uow.passages.delete_where(agent.id, {})
    await _assert_untouched(db, agent)


async def test_unknown_agent_or_passage_raises_not_found(db: Database) -> None:
    agent = await _agent_with_a_passage(db)
    nobody, nothing = uuid.uuid4(), uuid.uuid4()
    async with db.unit_of_work() as uow:
        p = uow.passages
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: p.add(nobody, "x", [1.0, 0.0]),
            lambda: p.add_many(nobody, [{"text": "x", "embedding": [1.0, 0.0]}]),
            lambda: p.define_model(nobody, "m", 2),
            lambda: p.get_model(nobody, "default"),
            lambda: p.get_model(agent.id, "never-used"),
            lambda: p.search(nobody, [1.0, 0.0]),
            lambda: p.search(nobody, [1.0, 0.0], where={"k": 1}),
            lambda: p.search_text(nobody, "first"),
            lambda: p.hybrid_search(nobody, "first", [1.0, 0.0]),
            lambda: p.delete_where(nobody, {"k": 1}),
            lambda: p.get(nothing),
            lambda: p.delete(nothing),
            lambda: p.update_text(nothing, "x", [1.0, 0.0]),
        ]
        for call in calls:
            with pytest.raises(NotFoundError):
                await call()
    await _assert_untouched(db, agent)


@pytest.mark.parametrize(("value", "precision"), [(1e39, "float32"), (7e4, "float16")])
async def test_values_beyond_the_storage_precision_are_rejected(
    db: Database, value: float, precision: str
) -> None:
    agent = await _agent_with_a_passage(db)
    async with db.unit_of_work() as uow:
        await uow.passages.define_model(agent.id, "m", 2, precision=precision)
        passage = await uow.passages.add(agent.id, "fine", [1.0, 2.0], embedding_model="m")
    async with db.unit_of_work() as uow:
        with pytest.raises(ValidationError):
            await uow.passages.add(agent.id, "huge", [value, 1.0], embedding_model="m")
        with pytest.raises(ValidationError):
            await uow.passages.add_many(
                agent.id, [{"text": "x", "embedding": [1.0, -value], "embedding_model": "m"}]
            )
        with pytest.raises(ValidationError):
            await uow.passages.update_text(passage.id, "huge", [value, 1.0])
    async with db.unit_of_work(read_only=True) as uow:
        assert (await uow.passages.get(passage.id)).vector == [1.0, 2.0]
        assert await uow.passages.count(agent.id, embedding_model="m") == 1
        with pytest.raises(ValidationError):
            await uow.passages.search(agent.id, [1e39, 1.0], embedding_model="m")


async def test_a_query_beyond_float16_range_is_rejected_for_a_half_model(db: Database) -> None:
    agent = await _agent_with_a_passage(db)
    async with db.unit_of_work() as uow:
        await uow.passages.define_model(agent.id, "half", 2, precision="float16")
        await uow.passages.add(agent.id, "fine", [1.0, 2.0], embedding_model="half")
    async with db.unit_of_work(read_only=True) as uow:
        with pytest.raises(ValidationError):
            await uow.passages.search(agent.id, [7e4, 1.0], embedding_model="half", metric="inner_product")


async def test_timezone_free_created_at_is_rejected_on_write(db: Database) -> None:
    agent = await _agent_with_a_passage(db)
    async with db.unit_of_work() as uow:
        with pytest.raises(ValidationError):
            await uow.passages.add_many(
                agent.id, [{"text": "naive", "embedding": [1.0, 0.0], "created_at": datetime(2024, 1, 1)}]
            )
        with pytest.raises(ValidationError):
            await uow.passages.add_many(
                agent.id, [{"text": "x", "embedding": [1.0, 0.0], "created_at": "2024-01-01" + "T00:00Z"}]
            )
        with pytest.raises(ValidationError):
            await uow.passages.add_many(agent.id, [{"text": "x", "embedding": [1.0, 0.0], "colour": "red"}])
    await _assert_untouched(db, agent)


@pytest.mark.owner  # DDL, or plans that differ under row-level security
@pytest.mark.parametrize(
    "options",
    [
        {"m": "16) WHERE (false) --"},
        {"ef_construction": "64) WHERE (false) --"},
        {"m": 1},
        {"m": 101},
        {"m": True},
        {"m": 16.0},
        {"m": None},
        {"ef_construction": 3},
        {"ef_construction": 1001},
        {"ef_construction": False},
        {"m": 16, "ef_construction": 31},  # pgvector wants ef_construction >= 2 * m
        {"m": 100, "ef_construction": 199},
    ],
    ids=repr,
)
async def test_bad_hnsw_build_options_are_rejected(db: Database, options: dict[str, Any]) -> None:
    async with db.unit_of_work() as uow:
        with pytest.raises(ValidationError):
            await uow.passages.ensure_index("default", 2, "cosine", **options)
        # The bounds themselves are accepted (a no-op on SQLite).
        await uow.passages.ensure_index("default", 2, "l2", m=2, ef_construction=4)
        await uow.passages.ensure_index("default", 2, "inner_product", m=100, ef_construction=1000)


@pytest.mark.owner  # DDL
async def test_a_dimension_an_hnsw_index_cannot_hold_is_refused_before_any_statement(db: Database) -> None:
    # pgvector indexes up to 2,000 dimensions of `vector` and 4,000 of `halfvec`.
    async with db.unit_of_work() as uow:
        with capture_statements(db) as sent:
            with pytest.raises(ValidationError, match="at most 2,000 dimensions at float32"):
                await uow.passages.ensure_index("wide", 2001, "cosine")
            with pytest.raises(ValidationError, match="at most 4,000 dimensions at float16"):
                await uow.passages.ensure_index("wide", 4001, "cosine", precision="float16")
        assert sent == []
        # The limits themselves are built (a no-op on SQLite).
        await uow.passages.ensure_index("wide", 2000, "cosine")
        await uow.passages.ensure_index("wider", 4000, "cosine", precision="float16")
