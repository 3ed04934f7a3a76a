"""messages.content may be NULL for assistant messages (OpenAI's tool-call-only messages)

OpenAI chat completions send `content: null` for an assistant message that
only carries `tool_calls`; memorm stores it as NULL and reads it back as None.
A CHECK keeps NULL to assistant messages.  SQLite cannot drop NOT NULL in
place: the table is rebuilt (batch mode), which renumbers its rowids, so the
FTS5 index over it (keyed on rowid) is dropped first and rebuilt after; the
FTS5 DDL is a frozen copy of memorm.search.fts_ddl as of 0006.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CHECK = "ck_messages_content"  # passed through op.f: the naming convention adds nothing
RULE = "content IS NOT NULL OR role = 'assistant'"


def _drop_fts5() -> None:
    for event in ("ai", "ad", "au"):
        op.execute(f"DROP TRIGGER IF EXISTS messages_fts_{event}")
    op.execute("DROP TABLE IF EXISTS messages_fts")


def _create_fts5() -> None:
    old = (
        "INSERT INTO messages_fts(messages_fts, rowid, search_words) "
        "VALUES ('delete', old.rowid, old.search_words);"
    )
    new = "INSERT INTO messages_fts(rowid, search_words) VALUES (new.rowid, new.search_words);"
    for statement in (
        "CREATE VIRTUAL TABLE messages_fts USING fts5(search_words, content='messages', "
        "content_rowid='rowid', tokenize='ascii')",
        f"CREATE TRIGGER messages_fts_ai AFTER INSERT ON messages BEGIN {new} END",
        f"CREATE TRIGGER messages_fts_ad AFTER DELETE ON messages BEGIN {old} END",
        f"CREATE TRIGGER messages_fts_au AFTER UPDATE OF search_words ON messages BEGIN {old} {new} END",
        "INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')",
    ):
        op.execute(statement)


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _drop_fts5()
        with op.batch_alter_table("messages", recreate="always") as batch:
            batch.alter_column("content", existing_type=sa.Text(), nullable=True)
            batch.create_check_constraint(op.f(CHECK), RULE)
        _create_fts5()
    else:
        op.alter_column("messages", "content", existing_type=sa.Text(), nullable=True)
        op.create_check_constraint(op.f(CHECK), "messages", RULE)


def downgrade() -> None:
    op.execute("UPDATE messages SET content = '' WHERE content IS NULL")
    if op.get_bind().dialect.name == "sqlite":
        _drop_fts5()
        with op.batch_alter_table("messages", recreate="always") as batch:
            batch.drop_constraint(op.f(CHECK), type_="check")
            batch.alter_column("content", existing_type=sa.Text(), nullable=False)
        _create_fts5()
    else:
        op.drop_constraint(op.f(CHECK), "messages", type_="check")
        op.alter_column("messages", "content", existing_type=sa.Text(), nullable=False)
