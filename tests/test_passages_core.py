"""Archival passages: text and embedding stored in one row."""

from __future__ import annotations

import math
import uuid
from typing import Any

import numpy as np
import pytest
from conftest import count_rows

from memorm import Agent, Database, NotFoundError, ValidationError

pytestmark = pytest.mark.anyio


async def _new_agent(db: Database, name: str = "sam") -> Agent:
    async with db.unit_of_work() as uow:
        return await uow.agents.create(name)


def _float32(values: list[float]) -> list[float]:
    return np.asarray(values, dtype=np.float32).astype(np.float64).tolist()


async def test_added_passage_reads_back_counts_and_deletes(db: Database) -> None:
    agent = await _new_agent(db)
    async with db.unit_of_work() as uow:
        passage = await uow.passages.add(
            agent.id, "Ada likes tea", [0.25, -0.5, 1.0], embedding_model="mini", meta={"src": "chat"}
        )
        await uow.passages.add(str(agent.id), "Ada lives in London", [0.0, 0.5, 0.5], embedding_model="mini")
        await uow.passages.add(agent.id, "default model", [1.0])
    async with db.unit_of_work() as uow:
        stored = await uow.passages.get(passage.id)
        assert await uow.passages.count(agent.id) == 3
        assert await uow.passages.count(agent.id, embedding_model="mini") == 2
        assert await uow.passages.count(agent.id, embedding_model="other") == 0
    assert (stored.agent_id, stored.text, stored.meta) == (agent.id, "Ada likes tea", {"src": "chat"})
    assert (stored.embedding, stored.embedding_model, stored.embedding_dim) == ([0.25, -0.5, 1.0], "mini", 3)
    async with db.unit_of_work() as uow:
        await uow.passages.delete(str(passage.id))
    async with db.unit_of_work() as uow:
        assert await uow.passages.count(agent.id) == 2
        with pytest.raises(NotFoundError):
            await uow.passages.get(passage.id)
        with pytest.raises(NotFoundError):
            await uow.passages.delete(passage.id)


async def test_embedding_round_trips_at_float32_precision(db: Database) -> None:
    agent = await _new_agent(db)
    rng = np.random.default_rng(7)
    # a tiny and a huge component: the largest a vector may hold is just under MAX_VECTOR_LENGTH
    values = [*rng.standard_normal(382).tolist(), 1e-30, -9.0e18]
    from_numpy = rng.standard_normal(384).astype(np.float32)
    async with db.unit_of_work() as uow:
        as_list = await uow.passages.add(agent.id, "list", values)
        as_array = await uow.passages.add(agent.id, "array", from_numpy)
    async with db.unit_of_work() as uow:
        stored_list = (await uow.passages.get(as_list.id)).embedding
        stored_array = (await uow.passages.get(as_array.id)).embedding
    assert stored_list == _float32(values)
    assert stored_array == from_numpy.astype(np.float64).tolist()
    assert all(isinstance(x, float) for x in stored_list)


async def test_wrong_dimension_for_the_same_agent_and_model_raises_validation_error(db: Database) -> None:
    agent = await _new_agent(db)
    async with db.unit_of_work() as uow:
        await uow.passages.add(agent.id, "three", [1.0, 2.0, 3.0], embedding_model="m")
    async with db.unit_of_work() as uow:
        with pytest.raises(ValidationError):
            await uow.passages.add(agent.id, "four", [1.0, 2.0, 3.0, 4.0], embedding_model="m")
        with pytest.raises(ValidationError):
            await uow.passages.add(agent.id, "two", [1.0, 2.0], embedding_model="m")
        await uow.passages.add(agent.id, "three again", [3.0, 2.0, 1.0], embedding_model="m")
    async with db.unit_of_work() as uow:
        assert await uow.passages.count(agent.id, embedding_model="m") == 2


async def test_models_with_different_dimensions_coexist(db: Database) -> None:
    agent = await _new_agent(db)
    other = await _new_agent(db, "max")
    async with db.unit_of_work() as uow:
        small = await uow.passages.add(agent.id, "small", [0.5] * 4, embedding_model="small")
        big = await uow.passages.add(agent.id, "big", [0.25] * 1536, embedding_model="big")
        # Another agent may use the same model name with its own dimension.
        theirs = await uow.passages.add(other.id, "theirs", [1.0] * 8, embedding_model="small")
    async with db.unit_of_work() as uow:
        got = [await uow.passages.get(p.id) for p in (small, big, theirs)]
        assert await uow.passages.count(agent.id) == 2
    assert [(p.embedding_model, p.embedding_dim, len(p.embedding)) for p in got] == [
        ("small", 4, 4),
        ("big", 1536, 1536),
        ("small", 8, 8),
    ]
    assert got[1].embedding == [0.25] * 1536


@pytest.mark.parametrize(
    "vector",
    [
        [1.0, math.nan, 2.0],
        [1.0, math.inf],
        [-math.inf],
        np.array([0.5, np.nan], dtype=np.float32),
        [],
        np.array([], dtype=np.float32),
        ["1.0", "2.0"],
        [1.0, None],
        [True, False],
        [1.0, [2.0]],
        "0.1,0.2",
        b"\x00\x00\x80?",
        None,
        {"a": 1.0},
        [0.0] * 16001,
    ],
    ids=lambda v: f"{type(v).__name__}-{len(v) if hasattr(v, '__len__') else v}",
)
async def test_bad_vectors_raise_validation_error_and_write_nothing(db: Database, vector: Any) -> None:
    agent = await _new_agent(db)
    async with db.unit_of_work() as uow:
        with pytest.raises(ValidationError):
            await uow.passages.add(agent.id, "bad", vector)
        await uow.passages.add(agent.id, "good", [1.0, 2.0])
    assert await count_rows(db, "archival_passages") == 1


@pytest.mark.parametrize("fields", [{"text": None}, {"embedding_model": ""}, {"meta": {"x": math.nan}}])
async def test_bad_passage_fields_raise_validation_error_and_write_nothing(
    db: Database, fields: dict[str, Any]
) -> None:
    agent = await _new_agent(db)
    kwargs: dict[str, Any] = {"text": "t", "embedding": [1.0], **fields}
    async with db.unit_of_work() as uow:
        with pytest.raises(ValidationError):
            await uow.passages.add(agent.id, **kwargs)
    assert await count_rows(db, "archival_passages") == 0


async def test_passage_for_unknown_agent_raises_not_found_and_writes_nothing(db: Database) -> None:
    await _new_agent(db)
    async with db.unit_of_work() as uow:
        with pytest.raises(NotFoundError):
            await uow.passages.add(uuid.uuid4(), "orphan", [1.0, 2.0])
        with pytest.raises(NotFoundError):
            await uow.passages.get(uuid.uuid4())
        with pytest.raises(ValidationError):
            await uow.passages.get("not-a-uuid")
        assert await uow.passages.count(uuid.uuid4()) == 0
    assert await count_rows(db, "archival_passages") == 0
