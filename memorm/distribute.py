"""memorm on a Citus cluster: its tables distributed by agent (`Database.distribute`).

Agents are distributed by their id and every other per-agent table (the
graph-state and graph-store tables too) by `agent_id`, all colocated, so an agent's rows
live on one shard and joins between them stay there; `agent_names` (names unique per tenant) is a
reference table, copied to every node.  Migration 0009 made every key hold
the agent's column, which Citus requires of distributed tables; the unique
indexes on `(tenant, id)` that keep an id to one message or passage of a
tenant cannot (`memorm.schema_state.unshardable_indexes`): they are dropped here, and memorm's
writes check ids on a distributed database instead
(`memorm.repositories.id_claims`).  Indexes
(full-text GIN, HNSW) and row-level security policies go with the tables to
their shards.  docs/scaling.md says what routes to one shard and what fans out.
"""

from __future__ import annotations

import sqlalchemy as sa

from memorm.engines import Reachable
from memorm.errors import ValidationError
from memorm.models import AGENTS
from memorm.schema_state import CITUS_VERSION, DISTRIBUTED_TABLES, DISTRIBUTION, unshardable_indexes
from memorm.translate import translating

__all__ = ["distribute"]


async def distribute(db: Reachable) -> list[str]:
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
            if await connection.scalar(CITUS_VERSION) is None:
                raise ValidationError(
                    "this database has no Citus: run `CREATE EXTENSION citus` on a Citus coordinator first"
                )
            already = set((await connection.execute(DISTRIBUTED_TABLES)).scalars())
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
