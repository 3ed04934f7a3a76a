"""The local Citus cluster for tests: a fresh database per test, and what to ask the cluster.

The cluster is ../shared/recipes/citus-cluster's (`.ci/run` starts it): a
coordinator on 127.0.0.1:5433 and workers on 5434 and 5435.  `citus_url`
gives each test a database of its own on every node (`citus-cluster
newdb`), dropped afterwards; without a cluster the test skips, and fails
instead under MEMORM_REQUIRE_CITUS=1 (as in `.ci/run`).  `cluster` is a
`Database` on it, upgraded and distributed; `cluster_url` the same as a URL,
for the CLI tests (plain functions: `main` runs its own event loop), and
`cluster_urls` hands out as many such URLs as a test needs.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import asyncpg
import pytest
from conftest import CITUS_RECIPE
from sqlalchemy.engine import make_url

from memorm import Database

__all__ = [
    "REQUIRE_CITUS",
    "WORKERS",
    "ClusterUrls",
    "asyncpg_url",
    "citus_url",
    "cluster",
    "cluster_url",
    "cluster_urls",
    "shard_ports",
]

REQUIRE_CITUS = os.environ.get("MEMORM_REQUIRE_CITUS") == "1"
WORKERS = (5434, 5435)  # the workers' ports


def _recipe() -> Path | None:
    if CITUS_RECIPE is not None:
        return CITUS_RECIPE
    found = shutil.which("citus-cluster")
    return Path(found) if found else None


async def _reachable(dsn: str) -> str | None:
    try:
        connection = await asyncpg.connect(dsn, timeout=5)
    except Exception as error:
        return f"the Citus coordinator is unreachable: {error}"
    try:
        if await connection.fetchval("SELECT 1 FROM pg_available_extensions WHERE name = 'citus'") is None:
            return "the Citus coordinator has no citus extension"
    finally:
        await connection.close()
    return None


def asyncpg_url(url: str) -> str:
    """`url` as asyncpg takes it (no `+asyncpg` driver name)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _skip_without_cluster() -> Path:
    """The recipe; the test skips (fails under MEMORM_REQUIRE_CITUS=1) when there is no cluster."""
    recipe = _recipe()
    reason = None if recipe is not None else "no citus-cluster recipe"
    if reason is None:
        reason = asyncio.run(_reachable("postgresql://root@127.0.0.1:5433/postgres"))
    if reason is not None:
        if REQUIRE_CITUS:
            pytest.fail(f"MEMORM_REQUIRE_CITUS=1 but {reason}")
        pytest.skip(reason)
    assert recipe is not None
    return recipe


@contextmanager
def _new_database(recipe: Path) -> Iterator[str]:
    """The URL of a new database on every node (`citus-cluster newdb`), dropped afterwards."""
    name = f"memorm_c_{uuid.uuid4().hex[:10]}"
    made = subprocess.run([str(recipe), "newdb", name], capture_output=True, text=True, check=True)
    try:
        yield made.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run([str(recipe), "dropdb", name], capture_output=True, check=False)


@pytest.fixture
def citus_url() -> Iterator[str]:
    """A fresh database on every node of the local cluster (`citus-cluster newdb`), dropped afterwards."""
    with _new_database(_skip_without_cluster()) as url:
        yield url


class ClusterUrls:
    """Hands out URLs of fresh cluster databases (`new`), all dropped when the test ends."""

    def __init__(self, recipe: Path, stack: ExitStack) -> None:
        self.recipe = recipe
        self.stack = stack

    def new(self, *, distributed: bool = True) -> str:
        """A new database; `distributed`: upgraded and distributed too."""
        url = self.stack.enter_context(_new_database(self.recipe))
        if distributed:
            asyncio.run(_distribute(url))
        return url


@pytest.fixture
def cluster_urls() -> Iterator[ClusterUrls]:
    """A factory of fresh cluster databases, for tests that need several."""
    recipe = _skip_without_cluster()
    with ExitStack() as stack:
        yield ClusterUrls(recipe, stack)


@pytest.fixture
async def cluster(citus_url: str) -> AsyncIterator[Database]:
    """A `Database` on a fresh cluster database, upgraded and distributed."""
    db = Database(citus_url)
    try:
        await db.upgrade()
        await db.distribute()
        yield db
    finally:
        await db.dispose()


async def _distribute(url: str) -> None:
    async with Database(url) as db:
        await db.upgrade()
        await db.distribute()


@pytest.fixture
def cluster_url(citus_url: str) -> str:
    """The URL of a fresh cluster database, upgraded and distributed (for CLI tests)."""
    asyncio.run(_distribute(citus_url))
    return citus_url


async def shard_ports(url: str, table: str, agents: Sequence[uuid.UUID]) -> dict[int, int]:
    """How many of `agents` have their rows of `table` on each worker, by the worker's port."""
    connection = await asyncpg.connect(asyncpg_url(url))
    try:
        rows = await connection.fetch(
            """
            SELECT n.nodeport, count(*) FROM unnest($1::uuid[]) AS a(id)
            JOIN pg_dist_placement p ON p.shardid = get_shard_id_for_distribution_column($2, a.id)
            JOIN pg_dist_node n ON n.groupid = p.groupid
            GROUP BY n.nodeport
            """,
            list(agents),
            table,
        )
    finally:
        await connection.close()
    return {port: count for port, count in rows}
