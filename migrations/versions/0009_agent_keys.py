"""keys by agent: an agent's rows are keyed (tenant, id, agent_id); names move to agent_names

A distributed database (Citus) shards memorm's tables by agent: agents by
their id, the rest by agent_id.  Every primary key, unique constraint and
foreign key must then hold the agent's column, and these do on every
engine: sessions, messages, archival passages and embedding models get the
primary key (tenant, id, agent_id) (it still serves lookups by a bare id),
messages' unique (tenant, agent_id, session_id, seq) and their foreign key
to (tenant, id, agent_id) of their session.  An agent's name cannot be kept
unique by a sharded table, so names move to `agent_names` (tenant, name ->
agent_id; a reference table on Citus), filled from the agents here, with
row-level security as on the other tables (Postgres).

Postgres rebuilds keys and indexes and rewrites no row; SQLite rebuilds the
four tables once each (batch mode), and the FTS5 indexes over messages and
passages after.  The DDL is a frozen copy as of this revision.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

import memorm.types

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

AGENT_TABLES = ("embedding_models", "sessions", "messages", "archival_passages")  # an agent's rows
SETTING = "current_setting('memorm.tenant', true)"
POLICY = "memorm_tenant"
FTS = (("messages", "search_words"), ("archival_passages", "search_words"))
MESSAGE_FK = "fk_messages_session_id_sessions"
MESSAGE_UNIQUE = ("uq_messages_tenant_session_id_seq", "uq_messages_tenant_agent_id_session_id_seq")


def _sqlite() -> bool:
    return op.get_bind().dialect.name == "sqlite"


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


def _keys(target: Any, table: str, *, by_agent: bool) -> None:
    """`table`'s primary key (and, for messages, its foreign key and unique) with or without the agent."""
    batch = target is not op
    args: tuple[str, ...] = () if batch else (table,)
    key = ["tenant", "id", "agent_id"] if by_agent else ["tenant", "id"]
    if table == "messages":
        target.drop_constraint(MESSAGE_FK, *args, type_="foreignkey")
        old, new = MESSAGE_UNIQUE if by_agent else MESSAGE_UNIQUE[::-1]
        target.drop_constraint(old, *args, type_="unique")
        lead = ["tenant", "agent_id"] if by_agent else ["tenant"]
        target.create_unique_constraint(new, *args, [*lead, "session_id", "seq"])
    target.drop_constraint(f"pk_{table}", *args, type_="primary")
    target.create_primary_key(f"pk_{table}", *args, key)


def _message_fk(target: Any, *, by_agent: bool) -> None:
    local = ["tenant", "session_id", "agent_id"] if by_agent else ["tenant", "session_id"]
    remote = ["tenant", "id", "agent_id"] if by_agent else ["tenant", "id"]
    if target is op:
        op.create_foreign_key(MESSAGE_FK, "messages", "sessions", local, remote, ondelete="CASCADE")
    else:
        target.create_foreign_key(MESSAGE_FK, "sessions", local, remote, ondelete="CASCADE")


def upgrade() -> None:
    op.create_table(
        "agent_names",
        sa.Column("tenant", sa.Text(), nullable=False, server_default=_tenant_default()),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("agent_id", memorm.types.UUIDType(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "name", name=op.f("pk_agent_names")),
    )
    op.create_index(op.f("ix_agent_names_tenant_agent_id"), "agent_names", ["tenant", "agent_id"])
    op.execute("INSERT INTO agent_names (tenant, name, agent_id) SELECT tenant, name, id FROM agents")
    if _sqlite():
        for table, _ in FTS:
            _drop_fts5(table)
        with op.batch_alter_table("agents", recreate="always") as batch:
            batch.drop_constraint("uq_agents_tenant_name", type_="unique")
        for table in AGENT_TABLES:
            with op.batch_alter_table(table, recreate="always") as batch:
                _keys(batch, table, by_agent=True)
                if table == "messages":
                    _message_fk(batch, by_agent=True)
        for table, column in FTS:
            _create_fts5(table, column)
        return
    op.drop_constraint("uq_agents_tenant_name", "agents", type_="unique")
    op.drop_constraint(MESSAGE_FK, "messages", type_="foreignkey")
    for table in AGENT_TABLES:
        args = (table,)
        if table == "messages":
            old, new = MESSAGE_UNIQUE
            op.drop_constraint(old, *args, type_="unique")
            op.create_unique_constraint(new, *args, ["tenant", "agent_id", "session_id", "seq"])
        op.drop_constraint(f"pk_{table}", *args, type_="primary")
        op.create_primary_key(f"pk_{table}", *args, ["tenant", "id", "agent_id"])
    _message_fk(op, by_agent=True)
    own = f"tenant = {SETTING}"
    op.execute("ALTER TABLE agent_names ENABLE ROW LEVEL SECURITY")
    op.execute("ALTER TABLE agent_names FORCE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY {POLICY} ON agent_names USING ({own}) WITH CHECK ({own})")


def _tenant_default() -> Any:
    """The tenant column's server default: the unit of work's tenant on Postgres, "default" on SQLite."""
    return sa.text("'default'") if _sqlite() else sa.text(SETTING)


def downgrade() -> None:
    if _sqlite():
        for table, _ in FTS:
            _drop_fts5(table)
        for table in reversed(AGENT_TABLES):
            with op.batch_alter_table(table, recreate="always") as batch:
                _keys(batch, table, by_agent=False)
                if table == "messages":
                    _message_fk(batch, by_agent=False)
        with op.batch_alter_table("agents", recreate="always") as batch:
            batch.create_unique_constraint("uq_agents_tenant_name", ["tenant", "name"])
        for table, column in FTS:
            _create_fts5(table, column)
    else:
        op.drop_constraint(MESSAGE_FK, "messages", type_="foreignkey")
        for table in AGENT_TABLES:
            if table == "messages":
                new, old = MESSAGE_UNIQUE
                op.drop_constraint(old, table, type_="unique")
                op.create_unique_constraint(new, table, ["tenant", "session_id", "seq"])
            op.drop_constraint(f"pk_{table}", table, type_="primary")
            op.create_primary_key(f"pk_{table}", table, ["tenant", "id"])
        _message_fk(op, by_agent=False)
        op.create_unique_constraint("uq_agents_tenant_name", "agents", ["tenant", "name"])
    op.drop_index(op.f("ix_agent_names_tenant_agent_id"), table_name="agent_names")
    op.drop_table("agent_names")
