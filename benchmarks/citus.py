"""memorm on the local Citus cluster against single-node Postgres, in the same run.

The same data and memorm calls on a distributed database (a coordinator and
two workers from ../shared/recipes/citus-cluster, on this machine's cores)
and on the single Postgres server.  Both Databases know their session's
agent (warm routing), so on the cluster every call goes to one shard.  The
"raw" column is single-node Postgres: the rows report what routing through
the coordinator adds (goal: at most 1.5x).  Skipped without a cluster.
"""

from __future__ import annotations

import random
import subprocess
import uuid
from collections.abc import Sequence
from pathlib import Path

import anyio

from benchmarks.common import Row, Samples, store, timed
from benchmarks.core import chat_operations, make_messages
from memorm import Database

NAME = "citus"
TARGET = 1.5
HISTORY = 2_000
PASSAGES = 1_000
DIM = 64
_RECIPES = (Path(__file__).resolve().parents[2] / "shared" / "recipes", Path("/work/shared/recipes"))


def _recipe() -> Path | None:
    for folder in _RECIPES:
        if (folder / "citus-cluster").is_file():
            return folder / "citus-cluster"
    return None


async def _fill(db: Database, rng: random.Random) -> tuple[uuid.UUID, uuid.UUID]:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("bench")
        chat = await uow.sessions.create(agent.id)
        await uow.messages.append(chat.id, make_messages(HISTORY))
        items = [
            {"text": f"passage {i} common words", "embedding": [rng.uniform(-1, 1) for _ in range(DIM)]}
            for i in range(PASSAGES)
        ]
        await uow.passages.add_many(agent.id, items)
    return agent.id, chat.id


async def run(engines: Sequence[str], *, quick: bool = False) -> list[Row]:
    recipe = _recipe()
    if "postgres" not in engines or recipe is None:
        return []
    name = f"memorm_bench_{uuid.uuid4().hex[:8]}"
    try:
        made = await anyio.run_process([str(recipe), "newdb", name], check=True)
    except (OSError, subprocess.CalledProcessError):
        return []  # no cluster: nothing to compare
    cluster = Database(made.stdout.decode().strip().splitlines()[-1])
    reps = 30 if quick else 200
    rows: list[Row] = []
    try:
        async with store("postgres") as where:
            single = where.database()
            try:
                await cluster.upgrade()
                await cluster.distribute()
                await single.create_all()
                rng = random.Random(11)
                query = [rng.uniform(-1, 1) for _ in range(DIM)]
                sides = {"cluster": await _fill(cluster, rng), "single": await _fill(single, rng)}
                ops = {side: chat_operations(*ids, query) for side, ids in sides.items()}
                for operation in ops["cluster"]:
                    on_cluster, on_single = Samples(), Samples()
                    for _ in range(5):
                        await ops["cluster"][operation](cluster)
                        await ops["single"][operation](single)
                    for _ in range(reps):
                        await timed(lambda op=ops["cluster"][operation]: op(cluster), on_cluster)
                        await timed(lambda op=ops["single"][operation]: op(single), on_single)
                    rows.append(
                        Row(
                            NAME,
                            "postgres",
                            f"{operation}: Citus vs one server",
                            on_cluster,
                            on_single,
                            target=TARGET,
                            note="raw column: the same memorm call on single-node Postgres",
                        )
                    )
            finally:
                await single.dispose()
    finally:
        await cluster.dispose()
        await anyio.run_process([str(recipe), "dropdb", name], check=False)
    return rows
