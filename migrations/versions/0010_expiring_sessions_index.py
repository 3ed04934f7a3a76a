"""the expiry index holds only the sessions that expire

Most sessions never expire (`expires_at` NULL), yet each had an entry in
`ix_sessions_expires_at`.  The index is now partial (`WHERE expires_at IS NOT
NULL`) on both engines: smaller, and a session without a time to live costs
it nothing.  Purges (`expires_at <= now`, soonest first) use it as before.

Written for distributed databases too: on a Citus coordinator, DROP INDEX and
CREATE INDEX on a distributed table run on each of its shards, inside this
migration's transaction, so a `memorm db upgrade` of a database made by
`memorm db distribute` needs nothing else.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_sessions_expires_at"
EXPIRING = sa.text("expires_at IS NOT NULL")


def upgrade() -> None:
    op.drop_index(op.f(INDEX), table_name="sessions")
    op.create_index(op.f(INDEX), "sessions", ["expires_at"], postgresql_where=EXPIRING, sqlite_where=EXPIRING)


def downgrade() -> None:
    op.drop_index(op.f(INDEX), table_name="sessions")
    op.create_index(op.f(INDEX), "sessions", ["expires_at"])
