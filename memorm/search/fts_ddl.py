"""DDL of the full-text indexes, which `memorm.migrate.create_all` runs after the tables.

Both index the derived `search_words` column (`memorm.types.SearchWords`):
the distinct words memorm's normaliser found in the text
(`memorm.search.normalize`), so the engines' own tokenizers and the
database's locale never decide what a word is.  The indexes are not model
columns: FTS5 virtual tables exist only on SQLite, the GIN indexes only on
Postgres.  Migrations 0006 and 0011 create the same objects (their own frozen
copies of these statements); autogenerate ignores them (`is_fts_object`).

Each index is narrowed by owner, so a search costs what the agent's matches
cost, not the whole table's (`memorm.search.text`):

* SQLite: an external-content FTS5 table per indexed table, keyed on the
  source row's `rowid` and kept in sync by triggers (insert, delete —
  including cascades — and updates of the words or the owner).  Besides the
  words it indexes one `scope` token per row, the agent's id and the
  tenant's UTF-8 in hex, so a MATCH finds one agent's rows.  Its content is a
  view over the table that computes that token.  The `ascii` tokenizer splits
  only at the spaces between stored words: every other character, and every
  non-ASCII one, belongs to a word.
* Postgres: a GIN index on `(tenant, agent_id, search_words)` (`btree_gin`
  puts the owner columns in it).

And each table has an *order* index, the order results come in: the owner,
the number of distinct words, newest first, id (see `memorm.search.text`
for why that is relevance).  On Postgres it indexes `length(search_words)`;
on SQLite a virtual generated column `search_size` (an index on the
expression itself would be one SQLAlchemy cannot reflect).

A migration that rebuilds one of these tables on SQLite (batch mode) drops
these objects first and creates them again after, as 0007 to 0009 did: the
view and the triggers name the table.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import sqlalchemy as sa

from memorm.models import MESSAGES, PASSAGES, SEARCH_WORDS

__all__ = ["FTS_INDEXES", "SEARCH_SIZE", "FullTextIndex", "is_fts_object", "scope_token"]

TOKENIZER = "ascii"
SCOPE = "scope"  # the FTS5 column holding a row's owner token
SEARCH_SIZE = "search_size"  # SQLite: how many distinct words a row has (a virtual column)
_NEWEST = "created_at DESC, id DESC"
_SQLITE_SIZE = f"length({SEARCH_WORDS}) - length(replace({SEARCH_WORDS}, ' ', ''))"  # spaces: words - 1


def scope_token(tenant: str, agent: uuid.UUID) -> str:
    """The FTS5 token of one agent's rows (SQLite): what `hex(tenant)` and the stored id spell."""
    return agent.hex + tenant.encode().hex()


@dataclass(frozen=True)
class FullTextIndex:
    """The full-text index of one table, over its derived search words column."""

    table: sa.Table
    words: str = SEARCH_WORDS

    @property
    def fts_table(self) -> str:
        """The FTS5 table's name (SQLite)."""
        return f"{self.table.name}_fts"

    @property
    def fts_content(self) -> str:
        """The view the FTS5 table reads its content from (SQLite)."""
        return f"{self.table.name}_fts_content"

    @property
    def gin_index(self) -> str:
        """The GIN index's name (Postgres)."""
        return f"ix_{self.table.name}_{self.words}_fts"

    @property
    def order_index(self) -> str:
        """The index results are read in order from."""
        return f"ix_{self.table.name}_search_order"

    def sqlite_create(self) -> list[str]:
        t, c, f, v = self.table.name, self.words, self.fts_table, self.fts_content

        def scope(row: str) -> str:
            return f"{row}agent_id || hex({row}tenant)"

        columns = f"rowid, {c}, {SCOPE}"
        old = f"INSERT INTO {f}({f}, {columns}) VALUES ('delete', old.rowid, old.{c}, {scope('old.')});"
        new = f"INSERT INTO {f}({columns}) VALUES (new.rowid, new.{c}, {scope('new.')});"
        return [
            f"ALTER TABLE {t} ADD COLUMN {SEARCH_SIZE} INTEGER GENERATED ALWAYS AS ({_SQLITE_SIZE}) VIRTUAL",
            f"CREATE INDEX {self.order_index} ON {t} (tenant, agent_id, {SEARCH_SIZE}, {_NEWEST})",
            f"CREATE VIEW {v} AS SELECT rowid AS doc, {c}, {scope('')} AS {SCOPE} FROM {t}",
            f"CREATE VIRTUAL TABLE {f} USING fts5({c}, {SCOPE}, content='{v}', content_rowid='doc', "
            f"tokenize='{TOKENIZER}')",
            f"CREATE TRIGGER {f}_ai AFTER INSERT ON {t} BEGIN {new} END",
            f"CREATE TRIGGER {f}_ad AFTER DELETE ON {t} BEGIN {old} END",
            f"CREATE TRIGGER {f}_au AFTER UPDATE OF {c}, tenant, agent_id ON {t} BEGIN {old} {new} END",
            f"INSERT INTO {f}({f}) VALUES ('rebuild')",
        ]

    def sqlite_optimize(self) -> str:
        """Merge the FTS5 index into one segment, dropping what deleted rows left in older ones."""
        return f"INSERT INTO {self.fts_table}({self.fts_table}) VALUES ('optimize')"

    def sqlite_drop(self) -> list[str]:
        f = self.fts_table
        return [f"DROP TRIGGER IF EXISTS {f}_{event}" for event in ("ai", "ad", "au")] + [
            f"DROP TABLE IF EXISTS {f}",
            f"DROP VIEW IF EXISTS {self.fts_content}",
            f"DROP INDEX IF EXISTS {self.order_index}",
        ]

    def postgres_create(self) -> list[str]:
        t = self.table.name
        return [
            "CREATE EXTENSION IF NOT EXISTS btree_gin",
            f"CREATE INDEX {self.gin_index} ON {t} USING gin (tenant, agent_id, {self.words})",
            f"CREATE INDEX {self.order_index} ON {t} (tenant, agent_id, length({self.words}), {_NEWEST})",
        ]

    def postgres_drop(self) -> list[str]:
        return [f"DROP INDEX IF EXISTS {self.gin_index}", f"DROP INDEX IF EXISTS {self.order_index}"]


MESSAGES_FTS = FullTextIndex(MESSAGES)
PASSAGES_FTS = FullTextIndex(PASSAGES)
FTS_INDEXES = (MESSAGES_FTS, PASSAGES_FTS)

_SHADOW_SUFFIXES = ("", "_data", "_idx", "_docsize", "_config", "_content")


def is_fts_object(name: str | None) -> bool:
    """Whether `name` is one of the full-text objects (for autogenerate to skip)."""
    if name is None:
        return False
    if name == SEARCH_SIZE:
        return True
    for index in FTS_INDEXES:
        if name in (index.gin_index, index.order_index) or any(
            name == index.fts_table + s for s in _SHADOW_SUFFIXES
        ):
            return True
    return False
