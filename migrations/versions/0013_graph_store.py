"""graph store: an agent's long-term store items and their embeddings (LangGraph's BaseStore)

Two tables (`GraphStoreItem`, `GraphStoreVector` in memorm.models), children of
`agents`: every row carries (tenant, agent_id), keys lead with them, and a
foreign key to the agent deletes the rows with it.

* `graph_store_items`: a JSON object under (namespace, key), namespaces being
  LangGraph's labels joined by "." and compared byte by byte (`COLLATE "C"`
  on Postgres), so a namespace prefix is a range of the primary key; with
  `expires_at` / `ttl_minutes` for expiry, and an index to sweep expired items.
* `graph_store_vectors`: one embedding per indexed field of an item, deleted
  with the item.

Postgres: row-level security and the `memorm_tenant` policy on each, as on
every table.  On a Citus coordinator whose tables are already distributed,
each new table is distributed by `agent_id`, colocated with the agents,
before its foreign keys are added.  The DDL is a frozen copy as of this
revision.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import postgresql

import memorm.types

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SETTING = "current_setting('memorm.tenant', true)"
POLICY = "memorm_tenant"
TABLES = ("graph_store_items", "graph_store_vectors")
_EXPIRING = sa.text("expires_at IS NOT NULL")


def _sqlite() -> bool:
    return op.get_bind().dialect.name == "sqlite"


def _distributed() -> bool:
    """Whether this is a Citus database whose agents are distributed already."""
    if _sqlite() or context.is_offline_mode():
        return False
    bind = op.get_bind()
    if bind.execute(sa.text("SELECT 1 FROM pg_extension WHERE extname = 'citus'")).scalar() is None:
        return False
    found = bind.execute(sa.text("SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'agents'::regclass"))
    return found.scalar() is not None


def _owner() -> list[sa.Column[object]]:
    """The columns both tables start with: tenant, agent, namespace, key."""
    default = sa.text("'default'") if _sqlite() else sa.text(SETTING)
    namespace = sa.Text().with_variant(postgresql.TEXT(collation="C"), "postgresql")
    return [
        sa.Column("tenant", sa.Text(), nullable=False, server_default=default),
        sa.Column("agent_id", memorm.types.UUIDType(), nullable=False),
        sa.Column("namespace", namespace, nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
    ]


# (name, columns, referred table, referred columns) of each table's foreign key
_KEYS = {
    "graph_store_items": (
        "fk_graph_store_items_agent_id_agents",
        ["tenant", "agent_id"],
        "agents",
        ["tenant", "id"],
    ),
    "graph_store_vectors": (
        "fk_graph_store_vectors_tenant_graph_store_items",
        ["tenant", "agent_id", "namespace", "key"],
        "graph_store_items",
        ["tenant", "agent_id", "namespace", "key"],
    ),
}


def _key(table: str) -> sa.ForeignKeyConstraint:
    name, columns, parent, referred = _KEYS[table]
    return sa.ForeignKeyConstraint(
        columns, [f"{parent}.{column}" for column in referred], name=name, ondelete="CASCADE"
    )


def _columns(table: str) -> list[sa.Column[object] | sa.Constraint]:
    owner = ["tenant", "agent_id", "namespace", "key"]
    if table == "graph_store_items":
        return [
            *_owner(),
            sa.Column("value", memorm.types.JSONType(), nullable=False),
            sa.Column("created_at", memorm.types.UTCDateTime(), nullable=False),
            sa.Column("updated_at", memorm.types.UTCDateTime(), nullable=False),
            sa.Column("expires_at", memorm.types.UTCDateTime(), nullable=True),
            sa.Column("ttl_minutes", sa.Float(), nullable=True),
            sa.PrimaryKeyConstraint(*owner, name=f"pk_{table}"),
        ]
    return [
        *_owner(),
        sa.Column("field", sa.Text(), nullable=False),
        sa.Column("embedding", memorm.types.VectorType(), nullable=False),
        sa.PrimaryKeyConstraint(*owner, "field", name=f"pk_{table}"),
    ]


def _expiry_index() -> None:
    op.create_index(
        "ix_graph_store_items_tenant_agent_id_expires_at",
        "graph_store_items",
        ["tenant", "agent_id", "expires_at"],
        postgresql_where=_EXPIRING,
        sqlite_where=_EXPIRING,
    )


def upgrade() -> None:
    if _sqlite():
        for table in TABLES:
            op.create_table(table, *_columns(table), _key(table))
        _expiry_index()
        return
    distributed = _distributed()
    own = f"tenant = {SETTING}"
    for table in TABLES:
        if distributed:  # distributed first, then pointed at the distributed parents
            op.create_table(table, *_columns(table))
        else:
            op.create_table(table, *_columns(table), _key(table))
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
        op.execute(f"CREATE POLICY {POLICY} ON {table} USING ({own}) WITH CHECK ({own})")
        if distributed:
            op.execute(f"SELECT create_distributed_table('{table}', 'agent_id', colocate_with => 'agents')")
            name, columns, parent, referred = _KEYS[table]
            op.create_foreign_key(name, table, parent, columns, referred, ondelete="CASCADE")
        if table == "graph_store_items":
            _expiry_index()


def downgrade() -> None:
    for table in reversed(TABLES):
        op.drop_table(table)
