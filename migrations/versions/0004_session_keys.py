"""session keys: an external key per session, unique per agent

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A nullable ADD COLUMN and a new index: no table rebuild on SQLite.
    op.add_column("sessions", sa.Column("key", sa.Text(), nullable=True))
    op.create_index(op.f("ix_sessions_agent_id_key"), "sessions", ["agent_id", "key"], unique=True)


def downgrade() -> None:
    op.drop_index(op.f("ix_sessions_agent_id_key"), table_name="sessions")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("key")
