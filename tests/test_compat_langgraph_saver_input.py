"""MemormSaver takes the same input on both engines: keys Postgres cannot store, filters, versions."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from langgraph.checkpoint.base import empty_checkpoint

from memorm import Database, ValidationError
from memorm.compat.langgraph import MemormSaver
from memorm.repositories.checkpoints import MAX_STATE_KEY_BYTES

pytestmark = pytest.mark.anyio


def _checkpoint(checkpoint_id: str, channel: str = "count", version: str = "1") -> Any:
    checkpoint = empty_checkpoint()
    checkpoint["id"] = checkpoint_id
    checkpoint["channel_values"] = {channel: 1}
    checkpoint["channel_versions"] = {channel: version}
    return checkpoint


def _config(thread: str, ns: str = "", checkpoint_id: str | None = None) -> Any:
    configurable: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


async def _saver(db: Database) -> MemormSaver:
    async with db.unit_of_work() as uow:
        return MemormSaver(db, agent=(await uow.agents.create(f"graph-{uuid.uuid4().hex[:8]}")).id)


async def _state_rows(db: Database) -> int:
    async with db.unit_of_work(read_only=True) as uow:
        counts = [
            await uow.session.scalar(sa.text(f"SELECT count(*) FROM {table}"))
            for table in ("sessions", "graph_checkpoints", "graph_writes", "graph_blobs")
        ]
    return sum(int(count or 0) for count in counts)


def _random_text(size: int, seed: int) -> str:
    """`size` bytes of UTF-8 that no compression shrinks: random 4-byte characters."""
    draw = random.Random(seed)
    return "".join(chr(draw.randrange(0x10000, 0x10FFFF)) for _ in range(size // 4))


@pytest.mark.parametrize(
    "where",
    ["checkpoint_ns", "checkpoint_id", "parent", "channel", "version", "task_id", "write_channel"],
)
@pytest.mark.parametrize("bad", ["nul", "long"])
async def test_a_key_postgres_cannot_store_is_refused_on_both_engines_before_any_statement(
    db: Database, where: str, bad: str
) -> None:
    saver = await _saver(db)
    key = "a\x00b" if bad == "nul" else "k" * 10_000  # 10 kB: past a Postgres btree entry
    ns = key if where == "checkpoint_ns" else ""
    checkpoint = _checkpoint(
        key if where == "checkpoint_id" else "1",
        channel=key if where == "channel" else "count",
        version=key if where == "version" else "1",
    )
    parent = key if where == "parent" else None
    if where in ("task_id", "write_channel"):
        channel = key if where == "write_channel" else "count"
        task = key if where == "task_id" else "task"
        call = saver.aput_writes(_config("t", checkpoint_id="1"), [(channel, 1)], task)
    else:
        call = saver.aput(_config("t", ns, parent), checkpoint, {}, dict(checkpoint["channel_versions"]))
    before = await _state_rows(db)
    with pytest.raises(ValidationError, match="NUL" if bad == "nul" else "bytes, more than the 512"):
        await call
    assert await _state_rows(db) == before  # not even the thread's session was made
    if where in ("checkpoint_ns", "checkpoint_id"):  # reads are refused alike
        with pytest.raises(ValidationError):
            await saver.aget_tuple(_config("t", ns, key if where == "checkpoint_id" else None))


async def test_the_longest_keys_fit_a_postgres_row_beside_the_longest_tenant(db: Database) -> None:
    """Three keys of `MAX_STATE_KEY_BYTES` and a tenant of 128 four-byte characters: one btree entry."""
    tenant = db.for_tenant(_random_text(512, seed=0))  # 128 characters, the most a tenant has
    async with tenant.unit_of_work() as uow:
        agent = await uow.agents.create("graph")
    saver = MemormSaver(tenant, agent=agent.id)
    ns, checkpoint_id, task, channel, version = (
        _random_text(MAX_STATE_KEY_BYTES, seed) for seed in range(1, 6)
    )
    stored = await saver.aput(
        _config("t", ns), _checkpoint(checkpoint_id, channel, version), {"step": 1}, {channel: version}
    )
    await saver.aput_writes(stored, [(channel, 2)], task)
    found = await saver.aget_tuple(stored)
    assert found is not None
    assert found.checkpoint["channel_values"] == {channel: 1}
    assert [(t, c, v) for t, c, v in found.pending_writes or []] == [(task, channel, 2)]
    with pytest.raises(ValidationError, match="bytes"):  # one byte more
        await saver.aput(_config("t", ns + "x"), _checkpoint("2"), {}, {"count": "1"})


async def test_list_filters_compare_metadata_values_whole_on_both_engines(db: Database) -> None:
    """As LangGraph's InMemorySaver (`==`): an object whatever its keys' order, a list item by item."""
    saver = await _saver(db)
    metadata = {"tags": ["a", "b"], "o": {"x": 1, "y": 2}, "step": 1}
    await saver.aput(_config("t"), _checkpoint("1"), metadata, {"count": "1"})  # type: ignore[arg-type]

    async def found(where: dict[str, Any]) -> int:
        return len([item async for item in saver.alist(_config("t"), filter=where)])

    assert await found({"o": {"y": 2, "x": 1}}) == 1  # SQLite compared the objects' text
    assert await found({"tags": ["a", "b"], "step": 1}) == 1
    assert await found({"tags": ["a"]}) == 0  # Postgres' @> took a list holding "a"
    assert await found({"tags": ["b", "a"]}) == 0
    assert await found({"o": {"x": 1}}) == 0  # equal, not contained
    assert await found({"step": 1.0}) == 1
    assert await found({"step": True}) == 0


async def test_get_next_version_refuses_what_is_no_version(db: Database) -> None:
    saver = await _saver(db)
    assert saver.get_next_version(None, None).startswith(f"{1:032}.")
    assert saver.get_next_version(f"{41:032}.0123", None).startswith(f"{42:032}.")
    assert saver.get_next_version(7, None).startswith(f"{8:032}.")  # type: ignore[arg-type]
    for bad in ("abc", "", "1x.2", "9" * 5000):
        with pytest.raises(ValidationError, match="not a channel version"):
            saver.get_next_version(bad, None)
