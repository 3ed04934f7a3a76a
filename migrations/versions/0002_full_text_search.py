"""full-text search over messages and archival passages

SQLite: external-content FTS5 tables kept in sync by triggers.
Postgres: GIN indexes on to_tsvector('simple', the text's letters and digits).
A frozen copy of memorm.search.fts_ddl as of this revision.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXED = (("messages", "content"), ("archival_passages", "text"))


def _sqlite_create(table: str, column: str) -> list[str]:
    fts = f"{table}_fts"
    old = f"INSERT INTO {fts}({fts}, rowid, {column}) VALUES ('delete', old.rowid, old.{column});"
    new = f"INSERT INTO {fts}(rowid, {column}) VALUES (new.rowid, new.{column});"
    return [
        f"CREATE VIRTUAL TABLE {fts} USING fts5({column}, content='{table}', content_rowid='rowid', "
        "tokenize='unicode61 remove_diacritics 0')",
        f"CREATE TRIGGER {fts}_ai AFTER INSERT ON {table} BEGIN {new} END",
        f"CREATE TRIGGER {fts}_ad AFTER DELETE ON {table} BEGIN {old} END",
        f"CREATE TRIGGER {fts}_au AFTER UPDATE OF {column} ON {table} BEGIN {old} {new} END",
        f"INSERT INTO {fts}({fts}) VALUES ('rebuild')",  # index rows that predate this revision
    ]


def upgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    for table, column in INDEXED:
        if sqlite:
            for statement in _sqlite_create(table, column):
                op.execute(statement)
        else:
            # Letters and digits only, as FTS5's unicode61 splits words; the first
            # 100,000 characters, since a tsvector is capped at 1 MB.
            op.execute(
                f"CREATE INDEX ix_{table}_{column}_fts ON {table} USING gin "
                f"(to_tsvector('simple'::regconfig, "
                f"regexp_replace(left({column}, 100000), '[^[:alnum:]]+', ' ', 'g')))"
            )


def downgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    for table, column in INDEXED:
        if sqlite:
            for event in ("ai", "ad", "au"):
                op.execute(f"DROP TRIGGER IF EXISTS {table}_fts_{event}")
            op.execute(f"DROP TABLE IF EXISTS {table}_fts")
        else:
            op.execute(f"DROP INDEX IF EXISTS ix_{table}_{column}_fts")
