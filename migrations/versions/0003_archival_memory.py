"""archival memory: embedding model registry, per-agent archive version

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import memorm.types
from memorm.ids import uuid7

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "embedding_models",
        sa.Column("id", memorm.types.UUIDType(), nullable=False),
        sa.Column("created_at", memorm.types.UTCDateTime(), nullable=False),
        sa.Column("updated_at", memorm.types.UTCDateTime(), nullable=False),
        sa.Column("meta", memorm.types.JSONType(), nullable=False),
        sa.Column("agent_id", memorm.types.UUIDType(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("dim", sa.Integer(), nullable=False),
        sa.Column("precision", sa.String(length=8), nullable=False),
        sa.CheckConstraint("precision IN ('float32', 'float16')", name=op.f("ck_embedding_models_precision")),
        sa.ForeignKeyConstraint(
            ["agent_id"], ["agents.id"], name=op.f("fk_embedding_models_agent_id_agents"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_embedding_models")),
        sa.UniqueConstraint("agent_id", "name", name=op.f("uq_embedding_models_agent_id_name")),
    )
    # Register the models of passages stored before this revision.
    models = sa.table(
        "embedding_models",
        sa.column("id", memorm.types.UUIDType()),
        sa.column("created_at", memorm.types.UTCDateTime()),
        sa.column("updated_at", memorm.types.UTCDateTime()),
        sa.column("meta", memorm.types.JSONType()),
        sa.column("agent_id", memorm.types.UUIDType()),
        sa.column("name", sa.Text()),
        sa.column("dim", sa.Integer()),
        sa.column("precision", sa.String(8)),
    )
    stored = op.get_bind().execute(
        sa.select(
            sa.column("agent_id", memorm.types.UUIDType()),
            sa.column("embedding_model", sa.Text()),
            sa.func.min(sa.column("embedding_dim", sa.Integer())),
            # a model stored in embedding_half is a float16 model
            sa.func.max(sa.case((sa.column("embedding_half").is_not(None), 1), else_=0)),
        )
        .select_from(sa.table("archival_passages"))
        .group_by(sa.column("agent_id"), sa.column("embedding_model"))
    )
    now = memorm.types.utcnow()
    rows = [
        {
            "id": uuid7(),
            "created_at": now,
            "updated_at": now,
            "meta": {},
            "agent_id": agent_id,
            "name": name,
            "dim": dim,
            "precision": "float16" if half else "float32",
        }
        for agent_id, name, dim, half in stored
    ]
    if rows:
        op.bulk_insert(models, rows)
    # ADD COLUMN with a default: no table rebuild on SQLite (which would lose the FTS triggers).
    op.add_column("agents", sa.Column("archive_version", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("agents") as batch:
        batch.drop_column("archive_version")
    op.drop_table("embedding_models")
