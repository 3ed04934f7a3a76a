"""initial schema: agents, sessions, messages, archival passages

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import memorm.types

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _row_columns() -> list[sa.Column]:  # type: ignore[type-arg]
    """The columns every memorm table starts with."""
    return [
        sa.Column("id", memorm.types.UUIDType(), nullable=False),
        sa.Column("created_at", memorm.types.UTCDateTime(), nullable=False),
        sa.Column("updated_at", memorm.types.UTCDateTime(), nullable=False),
        sa.Column("meta", memorm.types.JSONType(), nullable=False),
    ]


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        # Database-wide and shared with other schemas: created here, never dropped.
        op.execute("CREATE EXTENSION IF NOT EXISTS vector")

    op.create_table(
        "agents",
        *_row_columns(),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("system", sa.Text(), nullable=False),
        sa.Column("core_memory", memorm.types.JSONType(), nullable=False),
        sa.Column("llm_config", memorm.types.JSONType(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agents")),
        sa.UniqueConstraint("name", name=op.f("uq_agents_name")),
    )
    op.create_table(
        "sessions",
        *_row_columns(),
        sa.Column("agent_id", memorm.types.UUIDType(), nullable=False),
        sa.Column("title", sa.Text(), nullable=True),
        sa.Column("next_seq", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["agent_id"], ["agents.id"], name=op.f("fk_sessions_agent_id_agents"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sessions")),
    )
    op.create_index(op.f("ix_sessions_agent_id_created_at"), "sessions", ["agent_id", "created_at"])
    op.create_table(
        "messages",
        *_row_columns(),
        sa.Column("session_id", memorm.types.UUIDType(), nullable=False),
        sa.Column("agent_id", memorm.types.UUIDType(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=True),
        sa.Column("tool_calls", memorm.types.JSONType(), nullable=True),
        sa.Column("tool_call_id", sa.Text(), nullable=True),
        sa.Column("token_count", sa.Integer(), nullable=True),
        sa.CheckConstraint("role IN ('system', 'user', 'assistant', 'tool')", name=op.f("ck_messages_role")),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_messages_session_id_sessions"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_messages")),
        sa.UniqueConstraint("session_id", "seq", name=op.f("uq_messages_session_id_seq")),
    )
    op.create_index(op.f("ix_messages_agent_id_created_at"), "messages", ["agent_id", "created_at"])
    op.create_table(
        "archival_passages",
        *_row_columns(),
        sa.Column("agent_id", memorm.types.UUIDType(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("embedding", memorm.types.VectorType(), nullable=True),
        sa.Column("embedding_half", memorm.types.VectorType(half=True), nullable=True),
        sa.Column("embedding_model", sa.Text(), nullable=False),
        sa.Column("embedding_dim", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["agent_id"], ["agents.id"], name=op.f("fk_archival_passages_agent_id_agents"), ondelete="CASCADE"
        ),
        sa.CheckConstraint(
            "(embedding IS NULL) <> (embedding_half IS NULL)", name=op.f("ck_archival_passages_one_embedding")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_archival_passages")),
    )
    op.create_index(
        op.f("ix_archival_passages_agent_id_embedding_model_created_at"),
        "archival_passages",
        ["agent_id", "embedding_model", "created_at"],
    )


def downgrade() -> None:
    op.drop_table("archival_passages")
    op.drop_table("messages")
    op.drop_table("sessions")
    op.drop_table("agents")
