"""retention: sessions.expires_at and agents.retention

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import memorm.types

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable ADD COLUMNs and one index: no table rebuild on SQLite, no rewrite on Postgres.
    op.add_column("sessions", sa.Column("expires_at", memorm.types.UTCDateTime(), nullable=True))
    op.create_index(op.f("ix_sessions_expires_at"), "sessions", ["expires_at"])
    op.add_column("agents", sa.Column("retention", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_index(op.f("ix_sessions_expires_at"), table_name="sessions")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("expires_at")
    with op.batch_alter_table("agents") as batch:
        batch.drop_column("retention")
