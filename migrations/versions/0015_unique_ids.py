"""unique ids: a message's or archival passage's id names one row of its tenant

Since 0009 messages and archival passages are keyed (tenant, id, agent_id),
so that Citus can shard them by agent, which let two agents of one tenant
hold the same id; calls taking a bare id (`get`, `delete`, `update_text`)
then met both rows.  A unique index on (tenant, id) of each table now keeps
an id to one row.

Rows that already share an id are not guessed at: the upgrade refuses
(`ConflictError`, nothing changed) and names up to ten of them with their
agents.  Give all but one of each a new id, or delete them (docs/migrations.md
shows how), then upgrade again.

On a Citus database whose tables are distributed the index cannot exist (the
unique indexes of a distributed table must hold its distribution column,
`agent_id`): shared ids are refused all the same, no index is made, and
memorm's writes check ids there instead (`memorm.repositories.id_claims`).
The downgrade drops the indexes.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-08
"""

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from memorm.errors import ConflictError

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("messages", "archival_passages")
NAMED = 10  # shared ids the refusal names at most


def _index(table: str) -> str:
    return f"ix_{table}_tenant_id"


def _distributed(table: str) -> bool:
    """Whether this is a Citus database whose `table` is distributed."""
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return False
    if bind.execute(sa.text("SELECT 1 FROM pg_extension WHERE extname = 'citus'")).scalar() is None:
        return False
    found = bind.execute(sa.text(f"SELECT 1 FROM pg_dist_partition WHERE logicalrelid = '{table}'::regclass"))
    return found.scalar() is not None


def _shared(table: str) -> list[str]:
    """Up to `NAMED` + 1 ids of `table` that rows of several agents of one tenant hold, in words."""
    bind = op.get_bind()
    found = bind.execute(
        sa.text(
            f"SELECT tenant, id FROM {table} GROUP BY tenant, id HAVING count(*) > 1 "
            f"ORDER BY tenant, id LIMIT {NAMED + 1}"
        )
    ).all()
    said = []
    for tenant, row_id in found:
        agents = bind.execute(
            sa.text(f"SELECT agent_id FROM {table} WHERE tenant = :tenant AND id = :id ORDER BY agent_id"),
            {"tenant": tenant, "id": row_id},
        ).scalars()
        named = ", ".join(str(_uuid(agent)) for agent in agents)
        said.append(f"{table} id {_uuid(row_id)} (tenant {tenant!r}, agents {named})")
    return said


def _uuid(value: object) -> uuid.UUID:
    """A stored id as a UUID (SQLite keeps 32 hex digits)."""
    return uuid.UUID(str(value))


def _hidden_by_policies(table: str) -> bool:
    """Whether row-level security hides rows of `table` from this role (Postgres: a forced policy).

    The tables' owner is subject to their policies (`FORCE ROW LEVEL
    SECURITY`) unless it is a superuser or `BYPASSRLS`: without a tenant
    set it would see no row, and find no shared id.
    """
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return False
    found = bind.execute(
        sa.text(
            "SELECT relforcerowsecurity AND NOT (SELECT rolsuper OR rolbypassrls FROM pg_roles "
            "WHERE rolname = current_user) FROM pg_class WHERE oid = CAST(:table AS regclass)"
        ),
        {"table": table},
    ).scalar()
    return bool(found)


def upgrade() -> None:
    hidden = [table for table in TABLES if _hidden_by_policies(table)]
    for table in hidden:  # in this transaction only: forced again below, or rolled back
        op.execute(f"ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY")
    shared = [said for table in TABLES for said in _shared(table)]
    for table in hidden:
        op.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
    if shared:
        listed = "; ".join(shared[:NAMED]) + ("; …" if len(shared) > NAMED else "")
        raise ConflictError(
            "revision 0015 makes each message and archival passage id name one row of its tenant, "
            f"but rows of several agents share ids: {listed}. Give all but one of each a new id, "
            "or delete them (see docs/migrations.md), then upgrade again; nothing was changed"
        )
    for table in TABLES:
        if not _distributed(table):
            op.create_index(op.f(_index(table)), table, ["tenant", "id"], unique=True)


def downgrade() -> None:
    for table in TABLES:
        op.execute(f"DROP INDEX IF EXISTS {_index(table)}")  # none on a distributed table
