"""checkpoint versions: the channel versions a checkpoint holds, readable by SQL

`graph_checkpoints.channel_versions` (JSON: channel -> version, as text) copies
the `channel_versions` of the checkpoint (whose value is opaque bytes of its
serializer), so one statement reads a checkpoint with its channel values
(`graph_blobs`) and its pending writes.  Nullable: checkpoints written before
this revision have none, and are read as before (their values by a second
statement).  A column added to a distributed table on Citus is added on every
shard.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import memorm.types

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("graph_checkpoints", sa.Column("channel_versions", memorm.types.JSONType(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("graph_checkpoints") as batch:
        batch.drop_column("channel_versions")
