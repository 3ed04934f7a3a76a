"""Archival scenario 1: ``uow.passages.add_many`` against the raw driver's bulk write, batch by batch."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from benchmarks.archival_data import BATCH, DIM, NAME, Corpus
from benchmarks.raw.passages import MODEL, WRITTEN, RawPostgres, RawSQLite
from benchmarks.report import Row
from benchmarks.timing import Samples, timed
from memorm import Database
from memorm.models import PASSAGES

INSERT_TARGET = 1.5


async def memorm_add(db: Database, agent_id: uuid.UUID, items: Sequence[dict[str, Any]]) -> list[uuid.UUID]:
    async with db.unit_of_work() as uow:
        return [passage.id for passage in await uow.passages.add_many(agent_id, items)]


async def new_agent(db: Database, name: str) -> uuid.UUID:
    async with db.unit_of_work() as uow:
        return (await uow.agents.create(name)).id


async def check_equivalence(db: Database, raw: RawSQLite | RawPostgres) -> None:
    """Guard the comparison: memorm and the raw baseline must store the same passages and model.

    Three passages go in through each (into two agents of the same store); they
    must read back the same through memorm, both agents' archive versions and
    models must agree, and on SQLite each stored value's type and length (the
    encodings) must match.  The agents are deleted afterwards.
    """
    columns = tuple(column.name for column in PASSAGES.columns)
    if columns != WRITTEN:
        raise AssertionError(f"archival_passages now has columns {columns}: update benchmarks.raw.passages")
    items = [
        {"text": f"check {i} ü", "embedding": [0.25 * (i + 1), -1.5, 1e-3, 3.0] * (DIM // 4)}
        for i in range(3)
    ]
    ours, theirs = await new_agent(db, "archival-check-memorm"), await new_agent(db, "archival-check-raw")
    await memorm_add(db, ours, items)
    await raw.add_many(theirs, items)
    seen = {}
    async with db.unit_of_work(read_only=True) as uow:
        for agent_id in (ours, theirs):
            agent = await uow.agents.get(agent_id)
            model = await uow.passages.get_model(agent_id, MODEL)
            page = await uow.passages.list(agent_id, limit=10)
            seen[agent_id] = (
                agent.archive_version,
                (model.name, model.dim, model.precision, model.meta),
                sorted(
                    (p.text, p.vector, p.embedding_half, p.meta, p.embedding_model, p.embedding_dim)
                    for p in page.items
                ),
            )
    if seen[ours] != seen[theirs]:
        raise AssertionError(
            f"the raw baseline stores other values than memorm:\n{seen[ours]}\n{seen[theirs]}"
        )
    if isinstance(raw, RawSQLite):
        shapes = [await raw.shapes(agent_id) for agent_id in (ours, theirs)]
        if shapes[0] != shapes[1]:
            raise AssertionError(f"the raw baseline encodes passages unlike memorm:\n{shapes}")
    async with db.unit_of_work() as uow:
        await uow.agents.delete(ours)
        await uow.agents.delete(theirs)


# -- benchmarks -----------------------------------------------------------------------------------


async def bench_insert(
    db: Database,
    raw: RawSQLite | RawPostgres,
    raw_agent: uuid.UUID,
    agent_id: uuid.UUID,
    engine: str,
    corpus: Corpus,
) -> tuple[Row, list[uuid.UUID]]:
    """Fill both stores batch by batch, alternating who goes first; memorm's ids in corpus order."""
    ours, theirs = Samples(), Samples()
    ids: list[uuid.UUID] = []
    count = len(corpus.vectors)
    for number, start in enumerate(range(0, count, BATCH)):
        items = corpus.items(start, min(count, start + BATCH))
        jobs = [
            ("memorm", lambda batch=items: memorm_add(db, agent_id, batch)),
            ("raw", lambda batch=items: raw.add_many(raw_agent, batch)),
        ]
        if number % 2:
            jobs.reverse()
        for side, job in jobs:
            result = await timed(job, ours if side == "memorm" else theirs, collect=True)
            if side == "memorm":
                ids += result
    note = (
        f"{count:,} passages in {len(ours.seconds)} batches: memorm {sum(ours.seconds):.2f} s, "
        f"raw {sum(theirs.seconds):.2f} s in total; raw = "
        + ("executemany" if engine == "sqlite" else "COPY with pgvector's binary codec")
        + "; both pay the full-text "
        + ("triggers" if engine == "sqlite" else "GIN index")
    )
    row = Row(
        NAME,
        engine,
        f"add_many {BATCH:,} x {DIM}-d (uow each)",
        ours,
        theirs,
        rows=BATCH,
        target=INSERT_TARGET,
        note=note,
    )
    return row, ids
