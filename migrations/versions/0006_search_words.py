"""full-text search on words normalised by memorm: messages/archival_passages.search_words

Each table gains a derived search_words column (tsvector on Postgres, text on
SQLite) holding its text's distinct words as memorm's normaliser finds them;
the FTS5 tables and GIN indexes now index that column instead of tokenizing
the text themselves.  The backfill runs memorm's own normaliser (through the
column type), since the stored words must be the ones the running code
searches with; the DDL below is a frozen copy of memorm.search.fts_ddl, and
of 0002's objects for the downgrade.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

import memorm.types

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXED = (("messages", "content"), ("archival_passages", "text"))
WORDS = "search_words"
BATCH = 2_000  # rows normalised and updated per statement


def _fts5(table: str, column: str, tokenizer: str) -> list[str]:
    fts = f"{table}_fts"
    old = f"INSERT INTO {fts}({fts}, rowid, {column}) VALUES ('delete', old.rowid, old.{column});"
    new = f"INSERT INTO {fts}(rowid, {column}) VALUES (new.rowid, new.{column});"
    return [
        f"CREATE VIRTUAL TABLE {fts} USING fts5({column}, content='{table}', content_rowid='rowid', "
        f"tokenize='{tokenizer}')",
        f"CREATE TRIGGER {fts}_ai AFTER INSERT ON {table} BEGIN {new} END",
        f"CREATE TRIGGER {fts}_ad AFTER DELETE ON {table} BEGIN {old} END",
        f"CREATE TRIGGER {fts}_au AFTER UPDATE OF {column} ON {table} BEGIN {old} {new} END",
        f"INSERT INTO {fts}({fts}) VALUES ('rebuild')",  # index the rows already there
    ]


def _drop_fts5(table: str) -> None:
    for event in ("ai", "ad", "au"):
        op.execute(f"DROP TRIGGER IF EXISTS {table}_fts_{event}")
    op.execute(f"DROP TABLE IF EXISTS {table}_fts")


def _backfill(table: str, column: str) -> None:
    """Every row's words, from its text, in keyset-paged batches."""
    rows = sa.table(
        table,
        sa.column("id", memorm.types.UUIDType()),
        sa.column(column, sa.Text()),
        sa.column(WORDS, memorm.types.SearchWords()),
    )
    update = sa.update(rows).where(rows.c.id == sa.bindparam("row_id")).values({WORDS: sa.bindparam("words")})
    bind = op.get_bind()
    last = None
    while True:
        page = sa.select(rows.c.id, rows.c[column]).order_by(rows.c.id).limit(BATCH)
        if last is not None:
            page = page.where(rows.c.id > last)
        found = bind.execute(page).all()
        if not found:
            return
        bind.execute(update, [{"row_id": row_id, "words": text} for row_id, text in found])
        last = found[-1][0]


def upgrade() -> None:
    if context.is_offline_mode():
        raise RuntimeError("revision 0006 computes search words in Python: run it online, not with --sql")
    sqlite = op.get_bind().dialect.name == "sqlite"
    for table, column in INDEXED:
        if sqlite:
            _drop_fts5(table)
            # NOT NULL with a default: SQLite adds it without rebuilding the table.
            words = sa.Column(WORDS, memorm.types.SearchWords(), nullable=False, server_default="")
            op.add_column(table, words)
            _backfill(table, column)
            for statement in _fts5(table, WORDS, "ascii"):
                op.execute(statement)
        else:
            op.execute(f"DROP INDEX IF EXISTS ix_{table}_{column}_fts")
            op.add_column(table, sa.Column(WORDS, memorm.types.SearchWords(), nullable=True))
            _backfill(table, column)
            op.alter_column(table, WORDS, nullable=False)
            op.execute(f"CREATE INDEX ix_{table}_{WORDS}_fts ON {table} USING gin ({WORDS})")


def downgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    for table, column in INDEXED:
        if sqlite:
            _drop_fts5(table)
            with op.batch_alter_table(table) as batch:
                batch.drop_column(WORDS)
            for statement in _fts5(table, column, "unicode61 remove_diacritics 0"):
                op.execute(statement)
        else:
            op.execute(f"DROP INDEX IF EXISTS ix_{table}_{WORDS}_fts")
            op.drop_column(table, WORDS)
            # 0002's index: letters and digits, the first 100,000 characters.
            op.execute(
                f"CREATE INDEX ix_{table}_{column}_fts ON {table} USING gin "
                f"(to_tsvector('simple'::regconfig, "
                f"regexp_replace(left({column}, 100000), '[^[:alnum:]]+', ' ', 'g')))"
            )
