"""memorm on a Citus cluster: its tables distributed by agent (`Database.distribute`).

Agents are distributed by their id and every other per-agent table (the
graph-state and graph-store tables too) by `agent_id`, all colocated, so an agent's rows
live on one shard and joins between them stay there; `agent_names` (names unique per tenant) is a
reference table, copied to every node.  Migration 0009 made every key hold
the agent's column, which Citus requires of distributed tables; the unique
indexes on `(tenant, id)` that keep an id to one message or passage of a
tenant cannot (`unshardable_indexes`): they are dropped here, and memorm's
writes check ids on a distributed database instead
(`memorm.repositories.id_claims`).  Indexes
(full-text GIN, HNSW) and row-level security policies go with the tables to
their shards.  docs/scaling.md says what routes to one shard and what fans out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sqlalchemy as sa

from memorm.errors import ValidationError
from memorm.models import (
    AGENT_NAMES,
    AGENTS,
    CHECKPOINT_TABLES,
    EMBEDDING_MODELS,
    MESSAGES,
    PASSAGES,
    SESSIONS,
    STORE_TABLES,
)
from memorm.translate import translating

if TYPE_CHECKING:
    from memorm.db import Database

__all__ = ["DISTRIBUTION", "distribute", "is_distributed", "unshardable_indexes"]

# (table, distribution column or None for a reference table), parents before children.
DISTRIBUTION: tuple[tuple[sa.Table, str | None], ...] = (
    (AGENT_NAMES, None),
    (AGENTS, "id"),
    (EMBEDDING_MODELS, "agent_id"),
    (SESSIONS, "agent_id"),
    (MESSAGES, "agent_id"),
    (PASSAGES, "agent_id"),
    *((table, "agent_id") for table in CHECKPOINT_TABLES),
    *((table, "agent_id") for table in STORE_TABLES),
)
_CITUS = sa.text("SELECT extversion FROM pg_extension WHERE extname = 'citus'")
_DONE = sa.text("SELECT logicalrelid::regclass::text FROM pg_dist_partition")
_PRESENT = sa.text(
    "SELECT name FROM unnest(CAST(:names AS text[])) AS name WHERE to_regclass(name) IS NOT NULL"
)


def unshardable_indexes(table: sa.Table, column: str | None) -> list[str]:
    """The unique indexes of `table` that lack its distribution `column` (Citus refuses those)."""
    if column is None:  # a reference table keeps every index
        return []
    return sorted(str(index.name) for index in table.indexes if index.unique and column not in index.columns)


async def is_distributed(db: Database) -> bool:
    """Whether `db` is a Citus database whose memorm tables (those its schema has) are distributed."""
    if db.dialect != "postgresql":
        return False
    with translating():
        async with db.engine.connect() as connection:
            if await connection.scalar(_CITUS) is None:
                return False
            done = set((await connection.execute(_DONE)).scalars())
            names = [table.name for table, _ in DISTRIBUTION]
            present = set((await connection.execute(_PRESENT, {"names": names})).scalars())
            await connection.rollback()
    # A schema below head (downgraded past the revision that made a table) lacks some tables.
    return AGENTS.name in done and present <= done


async def distribute(db: Database) -> list[str]:
    """Distribute memorm's tables on a Citus coordinator; returns what was done (idempotent).

    The schema must be at head (`SchemaError` otherwise); a database without
    the citus extension raises `ValidationError`.  Run it as the tables'
    owner, once, after `memorm db upgrade`; later upgrades run on the
    distributed tables.
    """
    if db.dialect != "postgresql":
        raise ValidationError("distribute is for Citus (distributed Postgres): this is SQLite")
    await db.check_schema()
    done: list[str] = []
    with translating():
        async with db.engine.begin() as connection:
            if await connection.scalar(_CITUS) is None:
                raise ValidationError(
                    "this database has no Citus: run `CREATE EXTENSION citus` on a Citus coordinator first"
                )
            already = set((await connection.execute(_DONE)).scalars())
            for table, column in DISTRIBUTION:
                if table.name in already:
                    continue
                if column is None:
                    await connection.execute(sa.text("SELECT create_reference_table(:t)"), {"t": table.name})
                    done.append(f"{table.name}: reference table")
                    continue
                for index in unshardable_indexes(table, column):  # memorm's own names: no user text
                    await connection.execute(sa.text(f'DROP INDEX IF EXISTS "{index}"'))
                parent = "default" if table is AGENTS else AGENTS.name
                await connection.execute(
                    sa.text("SELECT create_distributed_table(:t, :c, colocate_with => :with)"),
                    {"t": table.name, "c": column, "with": parent},
                )
                done.append(f"{table.name}: distributed by {column}")
    return done
