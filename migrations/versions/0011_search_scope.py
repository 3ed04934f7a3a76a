"""full-text search narrowed by agent, in relevance order: owner in the FTS index, order index

Search used to find a word's matches in the whole table, then keep the
agent's, and score every one to sort them.  Now each full-text index holds
the owner beside the words, and an order index holds the agent's rows in
result order (fewer distinct words first, newest, id), so a search reads only
the agent's matches and the page it returns (memorm.search.text).

* SQLite: the FTS5 table gains a `scope` column (the agent's id and the
  tenant's UTF-8 in hex, one token), read from a view over the table; a
  virtual generated column `search_size` (distinct words, no storage) and the
  order index on (tenant, agent_id, search_size, created_at DESC, id DESC).
* Postgres: `btree_gin` (a trusted extension; on Citus, created on every
  node); the GIN index becomes (tenant, agent_id, search_words); the order
  index is on (tenant, agent_id, length(search_words), created_at DESC, id
  DESC).  On a Citus coordinator both run on every shard.

The DDL is a frozen copy of memorm.search.fts_ddl.  The downgrade restores
0006's objects (and leaves the extension, which other objects may use).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("messages", "archival_passages")
WORDS = "search_words"
NEWEST = "created_at DESC, id DESC"


def _drop_fts5(table: str) -> None:
    for event in ("ai", "ad", "au"):
        op.execute(f"DROP TRIGGER IF EXISTS {table}_fts_{event}")
    op.execute(f"DROP TABLE IF EXISTS {table}_fts")


def _fts5_0006(table: str) -> list[str]:
    fts = f"{table}_fts"
    old = f"INSERT INTO {fts}({fts}, rowid, {WORDS}) VALUES ('delete', old.rowid, old.{WORDS});"
    new = f"INSERT INTO {fts}(rowid, {WORDS}) VALUES (new.rowid, new.{WORDS});"
    return [
        f"CREATE VIRTUAL TABLE {fts} USING fts5({WORDS}, content='{table}', content_rowid='rowid', "
        "tokenize='ascii')",
        f"CREATE TRIGGER {fts}_ai AFTER INSERT ON {table} BEGIN {new} END",
        f"CREATE TRIGGER {fts}_ad AFTER DELETE ON {table} BEGIN {old} END",
        f"CREATE TRIGGER {fts}_au AFTER UPDATE OF {WORDS} ON {table} BEGIN {old} {new} END",
        f"INSERT INTO {fts}({fts}) VALUES ('rebuild')",
    ]


def _fts5_scoped(table: str) -> list[str]:
    fts, view = f"{table}_fts", f"{table}_fts_content"

    def scope(row: str) -> str:
        return f"{row}agent_id || hex({row}tenant)"

    columns = f"rowid, {WORDS}, scope"
    old = f"INSERT INTO {fts}({fts}, {columns}) VALUES ('delete', old.rowid, old.{WORDS}, {scope('old.')});"
    new = f"INSERT INTO {fts}({columns}) VALUES (new.rowid, new.{WORDS}, {scope('new.')});"
    return [
        f"CREATE VIEW {view} AS SELECT rowid AS doc, {WORDS}, {scope('')} AS scope FROM {table}",
        f"CREATE VIRTUAL TABLE {fts} USING fts5({WORDS}, scope, content='{view}', content_rowid='doc', "
        "tokenize='ascii')",
        f"CREATE TRIGGER {fts}_ai AFTER INSERT ON {table} BEGIN {new} END",
        f"CREATE TRIGGER {fts}_ad AFTER DELETE ON {table} BEGIN {old} END",
        f"CREATE TRIGGER {fts}_au AFTER UPDATE OF {WORDS}, tenant, agent_id ON {table} BEGIN {old} {new} END",
        f"INSERT INTO {fts}({fts}) VALUES ('rebuild')",  # index the rows already there
    ]


def _has_btree_gin() -> bool:
    """Whether the extension exists (say, from before a downgrade).

    Then the migration does not name it: on Citus an extension command fails
    in a transaction that has already changed distributed tables in
    parallel, as 0010 does when one upgrade runs both.
    """
    found = op.get_bind().execute(sa.text("SELECT 1 FROM pg_extension WHERE extname = 'btree_gin'"))
    return found.scalar() is not None


def upgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    if not sqlite and (context.is_offline_mode() or not _has_btree_gin()):
        op.execute("CREATE EXTENSION IF NOT EXISTS btree_gin")
    for table in TABLES:
        order = f"ix_{table}_search_order"
        if sqlite:
            _drop_fts5(table)
            size = f"length({WORDS}) - length(replace({WORDS}, ' ', ''))"
            op.execute(
                f"ALTER TABLE {table} ADD COLUMN search_size INTEGER GENERATED ALWAYS AS ({size}) VIRTUAL"
            )
            op.execute(f"CREATE INDEX {order} ON {table} (tenant, agent_id, search_size, {NEWEST})")
            for statement in _fts5_scoped(table):
                op.execute(statement)
        else:
            op.execute(f"DROP INDEX IF EXISTS ix_{table}_{WORDS}_fts")
            op.execute(
                f"CREATE INDEX ix_{table}_{WORDS}_fts ON {table} USING gin (tenant, agent_id, {WORDS})"
            )
            op.execute(f"CREATE INDEX {order} ON {table} (tenant, agent_id, length({WORDS}), {NEWEST})")


def downgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    for table in TABLES:
        op.execute(f"DROP INDEX IF EXISTS ix_{table}_search_order")
        if sqlite:
            _drop_fts5(table)
            op.execute(f"DROP VIEW IF EXISTS {table}_fts_content")
            op.execute(f"ALTER TABLE {table} DROP COLUMN search_size")
            for statement in _fts5_0006(table):
                op.execute(statement)
        else:
            op.execute(f"DROP INDEX IF EXISTS ix_{table}_{WORDS}_fts")
            op.execute(f"CREATE INDEX ix_{table}_{WORDS}_fts ON {table} USING gin ({WORDS})")
