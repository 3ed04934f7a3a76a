"""Operations on whole tenants: list them, delete one, and make the application's Postgres role.

`Database.delete_tenant` and the `memorm tenant` and `memorm db create-role`
commands call these.  The role is made by `memorm.roles` (its `create_role`
is importable from here too).
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from memorm.models import (
    AGENT_NAMES,
    AGENTS,
    DATA_TABLES,
    EMBEDDING_MODELS,
    MESSAGES,
    PASSAGES,
    SESSIONS,
)
from memorm.progress import Reporter, Silent
from memorm.roles import SCRAM_ITERATIONS, create_role, scram_sha_256
from memorm.search.fts_ddl import FTS_INDEXES
from memorm.search.text import merge_deleted
from memorm.tenancy import check_tenant
from memorm.translate import translating
from memorm.uow import UnitsOfWork
from memorm.validation import check_flag, check_int

__all__ = [
    "DELETE_BATCH",
    "SCRAM_ITERATIONS",
    "create_role",
    "delete_tenant",
    "list_tenants",
    "scram_sha_256",
]

DELETE_BATCH = 5_000  # rows per DELETE (and per transaction) in delete_tenant
# On a distributed database, agents minted this shortly before a deletion began may still be
# committing (node by node) as it looks for orphaned names: their names are left alone.
_IN_FLIGHT_MS = 60_000
_NAMES_AT_ONCE = 1_000  # agent ids per statement on the names: far below any driver's limit on parameters
# Children first: each batch deletes rows no other row still points to.
_DELETE_ORDER: tuple[sa.Table, ...] = tuple(reversed(DATA_TABLES))
# The tables `list_tenants` counts per tenant.
_TABLES: tuple[sa.Table, ...] = (AGENTS, EMBEDDING_MODELS, SESSIONS, MESSAGES, PASSAGES)
# The tables `delete_tenant` counts: those, the graph state of the sessions and the graph stores.
_DELETED: tuple[sa.Table, ...] = DATA_TABLES


async def list_tenants(db: UnitsOfWork) -> dict[str, dict[str, int]]:
    """Every tenant with its row count per table, by tenant name.

    Reads across tenants: on Postgres the role must bypass row-level security.
    """
    found: dict[str, dict[str, int]] = {}
    async with db.unit_of_work(read_only=True, all_tenants=True) as uow:
        for table in _TABLES:
            counts = sa.select(table.c.tenant, sa.func.count()).group_by(table.c.tenant)
            with translating():
                for tenant, count in await uow.link.session.execute(counts):
                    found.setdefault(tenant, {t.name: 0 for t in _TABLES})[table.name] = int(count)
    return dict(sorted(found.items()))


async def delete_tenant(
    db: UnitsOfWork,
    tenant: str,
    *,
    batch: int = DELETE_BATCH,
    dry_run: bool = False,
    reporter: Reporter | None = None,
) -> dict[str, int]:
    """Delete every row of `tenant`, in batches of `batch` rows, each its own transaction.

    No batch holds its locks for long, so the tenant's (and everyone's)
    traffic goes on meanwhile; rows the tenant writes during the deletion
    are deleted too if they land in a table not yet emptied, up to a batch
    more than the table held when the deletion began: a deletion racing
    the tenant's writers ends, and leaves what they wrote after that (run
    it again once they stopped, for a tenant with no rows).  Each agent's
    name goes in the transaction that deletes the agent, so a deletion cut
    short (cancelled, or a lost connection) leaves every remaining agent
    its name and no name taken by an agent that is gone; an agent created
    while the deletion runs is deleted with its name, or keeps both.  Names
    an older memorm's cut-short deletion left without their agent are
    deleted too (on a distributed database, those of agents made over a
    minute before the deletion began: a younger agent may still be
    committing, node by node).  Full-text entries go with their rows (on SQLite the index
    is merged, as by `forget`), and the in-process vector cache drops the
    tenant's matrices.
    Returns the rows deleted per table (with `dry_run`, the rows there are;
    nothing changes): agents, embedding models, sessions, messages, archival
    passages, the graph state of the sessions (`graph_checkpoints`,
    `graph_writes`, `graph_blobs`: what `memorm.compat.langgraph` stores)
    and the agents' LangGraph stores (`graph_store_items`,
    `graph_store_vectors`), every table named even when it held none.
    Works with the application role: the units of work are the tenant's own.
    """
    owner = check_tenant(tenant)
    size = check_int(batch, "batch", minimum=1, maximum=1_000_000)
    view = db.for_tenant(owner)
    counts = {table.name: 0 for table in _DELETED}
    async with view.unit_of_work(read_only=True) as uow:
        for table in _DELETED:
            with translating():
                counts[table.name] = int(
                    await uow.link.session.scalar(sa.select(sa.func.count()).where(table.c.tenant == owner))
                    or 0
                )
    if check_flag(dry_run, "dry_run"):
        return counts
    report = reporter or Silent()
    started = int(time.time() * 1000)  # as a UUIDv7's clock reads it
    deleted = {table.name: 0 for table in _DELETED}
    for table in _DELETE_ORDER:
        report.start(table.name, counts[table.name])
        bound = counts[table.name] + size  # what was there, and a batch of newcomers
        while deleted[table.name] < bound:
            async with view.unit_of_work() as uow:
                with translating():
                    if table is AGENTS:
                        done = await _delete_agents(uow.link.session, owner, size)
                    else:
                        result = await uow.link.session.execute(_delete_batch(table, owner, size))
                        done = int(result.rowcount)  # type: ignore[attr-defined]
            deleted[table.name] += done
            report.advance(table.name, done)
            if done < size:
                break
    await _delete_orphan_names(view, owner, size, minted_before=started - _IN_FLIGHT_MS)
    db.vector_cache.evict_tenant(owner)
    if db.dialect == "sqlite" and (deleted["messages"] or deleted["archival_passages"]):
        async with view.unit_of_work() as uow:
            for index in FTS_INDEXES:
                await merge_deleted(uow.link, index)
    return deleted


async def _delete_agents(session: AsyncSession, owner: str, size: int) -> int:
    """Delete up to `size` of the tenant's agents with their names, in the caller's transaction.

    Names go with their agents, so every batch that commits leaves each
    remaining agent its name and no name without its agent: a deletion cut
    short, or an agent created meanwhile (it keeps its name, or goes with
    it), never leaves a name taken by no one or an agent that has none.
    """
    found = await session.execute(_delete_batch(AGENTS, owner, size).returning(AGENTS.c.id))
    gone = list(found.scalars())
    for start in range(0, len(gone), _NAMES_AT_ONCE):
        agents = gone[start : start + _NAMES_AT_ONCE]
        await session.execute(
            sa.delete(AGENT_NAMES).where(AGENT_NAMES.c.tenant == owner, AGENT_NAMES.c.agent_id.in_(agents))
        )
    return len(gone)


async def _delete_orphan_names(view: UnitsOfWork, owner: str, size: int, *, minted_before: int) -> None:
    """Delete the tenant's names whose agent is gone (left by a deletion of an older memorm, cut short).

    A page of names at a time, each page its own transaction: the names are
    read, then their agents looked up, and the names with no agent deleted.
    An agent created meanwhile comes with its name in one transaction.  On
    one server that transaction is seen whole or not at all, so the lookup
    sees the agent of every name it read.  On a distributed database it may
    not: the name (a reference table, on every node) and the agent (on its
    shard) commit node by node, and a reader can see the name before the
    agent.  So there, only names of agents minted before `minted_before`
    (the milliseconds of the agent's UUIDv7; ids of another kind always
    qualify) are taken for orphans: what the older deletion left is older
    than that, and an agent being made now is not.
    """
    after = ""
    while True:
        async with view.unit_of_work() as uow:
            session = uow.link.session
            distributed = uow.backend.distributed
            with translating():
                page = (
                    await session.execute(
                        sa.select(AGENT_NAMES.c.name, AGENT_NAMES.c.agent_id)
                        .where(AGENT_NAMES.c.tenant == owner, AGENT_NAMES.c.name > after)
                        .order_by(AGENT_NAMES.c.name)
                        .limit(size)
                    )
                ).all()
                for start in range(0, len(page), _NAMES_AT_ONCE):
                    named = {agent_id for _, agent_id in page[start : start + _NAMES_AT_ONCE]}
                    alive = set(
                        (
                            await session.execute(
                                sa.select(AGENTS.c.id).where(AGENTS.c.tenant == owner, AGENTS.c.id.in_(named))
                            )
                        ).scalars()
                    )
                    orphans = {
                        agent
                        for agent in named - alive
                        if not distributed or agent.version != 7 or agent.int >> 80 < minted_before
                    }
                    if orphans:
                        await session.execute(
                            sa.delete(AGENT_NAMES).where(
                                AGENT_NAMES.c.tenant == owner, AGENT_NAMES.c.agent_id.in_(orphans)
                            )
                        )
        if len(page) < size:
            return
        after = page[-1].name


def _delete_batch(table: sa.Table, owner: str, size: int) -> sa.Delete:
    """Delete up to `size` of the tenant's rows of `table`, found by their key."""
    key = [table.c.id] if "id" in table.c else list(table.primary_key.columns)
    doomed = sa.select(*key).where(table.c.tenant == owner).limit(size)
    found = key[0].in_(doomed.scalar_subquery()) if len(key) == 1 else sa.tuple_(*key).in_(doomed)
    return sa.delete(table).where(table.c.tenant == owner, found)
