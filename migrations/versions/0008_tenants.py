"""tenants: every row has an owner; keys lead with it; row-level security on Postgres

Every table gains `tenant` (text, NOT NULL); existing rows land in the
tenant "default".  Primary keys become (tenant, id), so an id another tenant
holds never conflicts; agent names are unique per tenant, session keys per
(tenant, agent), and foreign keys pair the tenant with the parent's id, so
no row can point into another tenant.  Indexes lead with the tenant.

Postgres: the column is added with a constant default (no table rewrite),
the keys and indexes are rebuilt (index builds, no rewrite), the default
becomes `current_setting('memorm.tenant', true)`, and row-level security is
enabled and forced on every table with one policy, `memorm_tenant`.  SQLite:
each table is rebuilt once (batch mode) with the new column and keys; the
FTS5 indexes, keyed on rowid, are rebuilt after.  The DDL is a frozen copy
of memorm.rls and memorm.search.fts_ddl as of this revision.

The downgrade refuses a database holding a tenant other than "default": the
old keys could not hold two tenants' rows.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("agents", "embedding_models", "sessions", "messages", "archival_passages")
DEFAULT = "default"
SETTING = "current_setting('memorm.tenant', true)"
POLICY = "memorm_tenant"
FTS = (("messages", "search_words"), ("archival_passages", "search_words"))

# Foreign keys: (table, name, local columns, parent, parent columns), without the tenant.
FOREIGN_KEYS = (
    ("embedding_models", "fk_embedding_models_agent_id_agents", ["agent_id"], "agents", ["id"]),
    ("sessions", "fk_sessions_agent_id_agents", ["agent_id"], "agents", ["id"]),
    ("messages", "fk_messages_session_id_sessions", ["session_id"], "sessions", ["id"]),
    ("archival_passages", "fk_archival_passages_agent_id_agents", ["agent_id"], "agents", ["id"]),
)
# Unique constraints: (table, old name, new name, columns without the tenant).
UNIQUES = (
    ("agents", "uq_agents_name", "uq_agents_tenant_name", ["name"]),
    (
        "embedding_models",
        "uq_embedding_models_agent_id_name",
        "uq_embedding_models_tenant_agent_id_name",
        ["agent_id", "name"],
    ),
    ("messages", "uq_messages_session_id_seq", "uq_messages_tenant_session_id_seq", ["session_id", "seq"]),
)
# Indexes: (table, old name, new name, columns without the tenant, unique).
INDEXES = (
    (
        "sessions",
        "ix_sessions_agent_id_created_at",
        "ix_sessions_tenant_agent_id_created_at",
        ["agent_id", "created_at"],
        False,
    ),
    ("sessions", "ix_sessions_agent_id_key", "ix_sessions_tenant_agent_id_key", ["agent_id", "key"], True),
    (
        "messages",
        "ix_messages_agent_id_created_at",
        "ix_messages_tenant_agent_id_created_at",
        ["agent_id", "created_at"],
        False,
    ),
    (
        "archival_passages",
        "ix_archival_passages_agent_id_embedding_model_created_at",
        "ix_archival_passages_tenant_agent_id_embedding_model_created_at",
        ["agent_id", "embedding_model", "created_at"],
        False,
    ),
)


def _sqlite() -> bool:
    return op.get_bind().dialect.name == "sqlite"


# -- SQLite's FTS5 indexes (keyed on rowid, which a table rebuild renumbers) -------------------


def _drop_fts5(table: str) -> None:
    for event in ("ai", "ad", "au"):
        op.execute(f"DROP TRIGGER IF EXISTS {table}_fts_{event}")
    op.execute(f"DROP TABLE IF EXISTS {table}_fts")


def _create_fts5(table: str, column: str) -> None:
    fts = f"{table}_fts"
    old = f"INSERT INTO {fts}({fts}, rowid, {column}) VALUES ('delete', old.rowid, old.{column});"
    new = f"INSERT INTO {fts}(rowid, {column}) VALUES (new.rowid, new.{column});"
    for statement in (
        f"CREATE VIRTUAL TABLE {fts} USING fts5({column}, content='{table}', content_rowid='rowid', "
        "tokenize='ascii')",
        f"CREATE TRIGGER {fts}_ai AFTER INSERT ON {table} BEGIN {new} END",
        f"CREATE TRIGGER {fts}_ad AFTER DELETE ON {table} BEGIN {old} END",
        f"CREATE TRIGGER {fts}_au AFTER UPDATE OF {column} ON {table} BEGIN {old} {new} END",
        f"INSERT INTO {fts}({fts}) VALUES ('rebuild')",
    ):
        op.execute(statement)


# -- the keys, both ways ------------------------------------------------------------------------


def _keys(batch: Any, table: str, *, tenant: bool) -> None:
    """In a SQLite batch: swap `table`'s keys for the ones with (`tenant`) or without the tenant."""
    lead = ["tenant"] if tenant else []
    for source, name, *_ in FOREIGN_KEYS:
        if source == table:
            batch.drop_constraint(name, type_="foreignkey")
    batch.drop_constraint(f"pk_{table}", type_="primary")
    batch.create_primary_key(f"pk_{table}", [*lead, "id"])
    for source, old, new, columns in UNIQUES:
        if source == table:
            batch.drop_constraint(old if tenant else new, type_="unique")
            batch.create_unique_constraint(new if tenant else old, [*lead, *columns])
    for source, old, new, columns, unique in INDEXES:
        if source == table:
            batch.drop_index(old if tenant else new)
            batch.create_index(new if tenant else old, [*lead, *columns], unique=unique)


def _foreign_keys(batch: Any, table: str, *, tenant: bool) -> None:
    """`table`'s foreign keys, with the tenant or without, on a SQLite `batch` (or `op`)."""
    lead = ["tenant"] if tenant else []
    for source, name, columns, parent, parent_columns in FOREIGN_KEYS:
        if source != table:
            continue
        if batch is op:
            op.create_foreign_key(
                name, table, parent, [*lead, *columns], [*lead, *parent_columns], ondelete="CASCADE"
            )
        else:
            batch.create_foreign_key(
                name, parent, [*lead, *columns], [*lead, *parent_columns], ondelete="CASCADE"
            )


def upgrade() -> None:
    if _sqlite():
        for table, _ in FTS:
            _drop_fts5(table)
        for table in TABLES:
            with op.batch_alter_table(table, recreate="always") as batch:
                batch.add_column(sa.Column("tenant", sa.Text(), nullable=False, server_default=DEFAULT))
                _keys(batch, table, tenant=True)
                _foreign_keys(batch, table, tenant=True)
        for table, column in FTS:
            _create_fts5(table, column)
        return
    for table in TABLES:
        # A constant default: Postgres records it in the catalog and rewrites no row.
        op.add_column(table, sa.Column("tenant", sa.Text(), nullable=False, server_default=DEFAULT))
    for table in reversed(TABLES):  # children's foreign keys go before their parents' keys
        for source, name, *_ in FOREIGN_KEYS:
            if source == table:
                op.drop_constraint(name, table, type_="foreignkey")
    for table in TABLES:
        op.drop_constraint(f"pk_{table}", table, type_="primary")
        op.create_primary_key(f"pk_{table}", table, ["tenant", "id"])
        for source, old, new, columns in UNIQUES:
            if source == table:
                op.drop_constraint(old, table, type_="unique")
                op.create_unique_constraint(new, table, ["tenant", *columns])
        for source, old, new, columns, unique in INDEXES:
            if source == table:
                op.drop_index(old, table_name=table)
                op.create_index(new, table, ["tenant", *columns], unique=unique)
    for table in TABLES:
        _foreign_keys(op, table, tenant=True)
        op.alter_column(table, "tenant", server_default=sa.text(SETTING))
        own = f"tenant = {SETTING}"
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
        op.execute(f"CREATE POLICY {POLICY} ON {table} USING ({own}) WITH CHECK ({own})")


def downgrade() -> None:
    bind = op.get_bind()
    for table in TABLES:
        other = bind.execute(
            sa.text(f"SELECT tenant FROM {table} WHERE tenant <> :default LIMIT 1"), {"default": DEFAULT}
        )
        found = other.scalar()
        if found is not None:
            raise RuntimeError(
                f"cannot downgrade below 0008: {table} holds rows of tenant {found!r}, and the old "
                "keys hold one tenant only; delete the other tenants first (memorm tenant delete)"
            )
    if _sqlite():
        for table, _ in FTS:
            _drop_fts5(table)
        for table in reversed(TABLES):
            with op.batch_alter_table(table, recreate="always") as batch:
                _keys(batch, table, tenant=False)
                _foreign_keys(batch, table, tenant=False)
                batch.drop_column("tenant")
        for table, column in FTS:
            _create_fts5(table, column)
        return
    for table in TABLES:
        op.execute(f"DROP POLICY IF EXISTS {POLICY} ON {table}")
        op.execute(f"ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY")
        op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
    for table in reversed(TABLES):
        for source, name, *_ in FOREIGN_KEYS:
            if source == table:
                op.drop_constraint(name, table, type_="foreignkey")
    for table in TABLES:
        op.drop_constraint(f"pk_{table}", table, type_="primary")
        op.create_primary_key(f"pk_{table}", table, ["id"])
        for source, old, new, columns in UNIQUES:
            if source == table:
                op.drop_constraint(new, table, type_="unique")
                op.create_unique_constraint(old, table, columns)
        for source, old, new, columns, unique in INDEXES:
            if source == table:
                op.drop_index(new, table_name=table)
                op.create_index(old, table, columns, unique=unique)
    for table in TABLES:
        _foreign_keys(op, table, tenant=False)
        op.drop_column(table, "tenant")
