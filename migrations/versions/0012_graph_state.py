"""graph state: checkpoints, pending writes and channel values of a session's graph (LangGraph)

Three tables, children of `sessions` (`GraphCheckpoint`… in memorm.models): a graph's
thread is a session of an agent, so every row carries (tenant, agent_id,
session_id), keys lead with (tenant, agent_id), and a foreign key to the
session deletes the rows with it.

* `graph_checkpoints`: one per checkpoint of a (sub)graph namespace, with its
  parent, the serialized checkpoint (without channel values) and its
  metadata as JSON (filterable).
* `graph_writes`: the writes tasks made after a checkpoint; no key to the
  checkpoint, which a framework may save after them.
* `graph_blobs`: each channel's value once per version.

Postgres: row-level security and the `memorm_tenant` policy on each, as on
every table.  On a Citus coordinator whose tables are already distributed
(`memorm db distribute`), each new table is distributed by `agent_id`,
colocated with the agents, before its foreign key to the (distributed)
sessions is added: a plain table could not point at them.  The DDL is a
frozen copy as of this revision.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

import memorm.types

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SETTING = "current_setting('memorm.tenant', true)"
POLICY = "memorm_tenant"
TABLES = ("graph_checkpoints", "graph_writes", "graph_blobs")


def _sqlite() -> bool:
    return op.get_bind().dialect.name == "sqlite"


def _distributed() -> bool:
    """Whether this is a Citus database whose sessions are distributed already."""
    if _sqlite() or context.is_offline_mode():
        return False
    bind = op.get_bind()
    if bind.execute(sa.text("SELECT 1 FROM pg_extension WHERE extname = 'citus'")).scalar() is None:
        return False
    found = bind.execute(sa.text("SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'sessions'::regclass"))
    return found.scalar() is not None


def _owner() -> list[sa.Column[object]]:
    """The columns every graph-state table starts with: its tenant, agent and session."""
    default = sa.text("'default'") if _sqlite() else sa.text(SETTING)
    return [
        sa.Column("tenant", sa.Text(), nullable=False, server_default=default),
        sa.Column("agent_id", memorm.types.UUIDType(), nullable=False),
        sa.Column("session_id", memorm.types.UUIDType(), nullable=False),
        sa.Column("checkpoint_ns", sa.Text(), nullable=False),
    ]


def _session_key(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["tenant", "session_id", "agent_id"],
        ["sessions.tenant", "sessions.id", "sessions.agent_id"],
        name=f"fk_{table}_session_id_sessions",
        ondelete="CASCADE",
    )


def _columns(table: str) -> list[sa.Column[object] | sa.Constraint]:
    owner = ["tenant", "agent_id", "session_id", "checkpoint_ns"]
    if table == "graph_checkpoints":
        return [
            *_owner(),
            sa.Column("checkpoint_id", sa.Text(), nullable=False),
            sa.Column("parent_checkpoint_id", sa.Text(), nullable=True),
            sa.Column("value_type", sa.Text(), nullable=False),
            sa.Column("value", sa.LargeBinary(), nullable=False),
            sa.Column("meta", memorm.types.JSONType(), nullable=False),
            sa.Column("created_at", memorm.types.UTCDateTime(), nullable=False),
            sa.PrimaryKeyConstraint(*owner, "checkpoint_id", name=f"pk_{table}"),
        ]
    if table == "graph_writes":
        return [
            *_owner(),
            sa.Column("checkpoint_id", sa.Text(), nullable=False),
            sa.Column("task_id", sa.Text(), nullable=False),
            sa.Column("idx", sa.Integer(), autoincrement=False, nullable=False),
            sa.Column("task_path", sa.Text(), nullable=False),
            sa.Column("channel", sa.Text(), nullable=False),
            sa.Column("value_type", sa.Text(), nullable=False),
            sa.Column("value", sa.LargeBinary(), nullable=False),
            sa.PrimaryKeyConstraint(*owner, "checkpoint_id", "task_id", "idx", name=f"pk_{table}"),
        ]
    return [
        *_owner(),
        sa.Column("channel", sa.Text(), nullable=False),
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column("value_type", sa.Text(), nullable=False),
        sa.Column("value", sa.LargeBinary(), nullable=True),
        sa.PrimaryKeyConstraint(*owner, "channel", "version", name=f"pk_{table}"),
    ]


def upgrade() -> None:
    if _sqlite():
        for table in TABLES:
            op.create_table(table, *_columns(table), _session_key(table))
        return
    distributed = _distributed()
    own = f"tenant = {SETTING}"
    for table in TABLES:
        if distributed:  # distributed first, then pointed at the distributed sessions
            op.create_table(table, *_columns(table))
        else:
            op.create_table(table, *_columns(table), _session_key(table))
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
        op.execute(f"CREATE POLICY {POLICY} ON {table} USING ({own}) WITH CHECK ({own})")
        if distributed:
            op.execute(f"SELECT create_distributed_table('{table}', 'agent_id', colocate_with => 'agents')")
            op.create_foreign_key(
                f"fk_{table}_session_id_sessions",
                table,
                "sessions",
                ["tenant", "session_id", "agent_id"],
                ["tenant", "id", "agent_id"],
                ondelete="CASCADE",
            )


def downgrade() -> None:
    for table in reversed(TABLES):
        op.drop_table(table)
