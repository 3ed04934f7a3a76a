"""DDL of the full-text indexes, attached to the metadata for `create_all`.

Both index the derived `search_words` column (`memorm.types.SearchWords`):
the distinct words memorm's normaliser found in the text
(`memorm.search.normalize`), so the engines' own tokenizers and the
database's locale never decide what a word is.  The indexes are not model
columns: FTS5 virtual tables exist only on SQLite, the GIN indexes only on
Postgres.  Migration 0006 creates the same objects (its own frozen copy of
these statements); autogenerate ignores them (`is_fts_object`).

* SQLite: an external-content FTS5 table per indexed table, keyed on the
  source row's `rowid` and kept in sync by triggers (insert, delete —
  including cascades — and updates of the words).  The `ascii` tokenizer
  splits only at the spaces between stored words: every other character,
  and every non-ASCII one, belongs to a word.
* Postgres: a GIN index on the `tsvector` column itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from memorm.models import MESSAGES, PASSAGES, SEARCH_WORDS

__all__ = ["FTS_INDEXES", "FullTextIndex", "is_fts_object"]

TOKENIZER = "ascii"


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
    def gin_index(self) -> str:
        """The GIN index's name (Postgres)."""
        return f"ix_{self.table.name}_{self.words}_fts"

    def sqlite_create(self) -> list[str]:
        t, c, f = self.table.name, self.words, self.fts_table
        old = f"INSERT INTO {f}({f}, rowid, {c}) VALUES ('delete', old.rowid, old.{c});"
        new = f"INSERT INTO {f}(rowid, {c}) VALUES (new.rowid, new.{c});"
        return [
            f"CREATE VIRTUAL TABLE {f} USING fts5({c}, content='{t}', content_rowid='rowid', "
            f"tokenize='{TOKENIZER}')",
            f"CREATE TRIGGER {f}_ai AFTER INSERT ON {t} BEGIN {new} END",
            f"CREATE TRIGGER {f}_ad AFTER DELETE ON {t} BEGIN {old} END",
            f"CREATE TRIGGER {f}_au AFTER UPDATE OF {c} ON {t} BEGIN {old} {new} END",
            f"INSERT INTO {f}({f}) VALUES ('rebuild')",
        ]

    def sqlite_optimize(self) -> str:
        """Merge the FTS5 index into one segment, dropping what deleted rows left in older ones."""
        return f"INSERT INTO {self.fts_table}({self.fts_table}) VALUES ('optimize')"

    def sqlite_drop(self) -> list[str]:
        f = self.fts_table
        return [f"DROP TRIGGER IF EXISTS {f}_{event}" for event in ("ai", "ad", "au")] + [
            f"DROP TABLE IF EXISTS {f}"
        ]

    def postgres_create(self) -> list[str]:
        return [f"CREATE INDEX {self.gin_index} ON {self.table.name} USING gin ({self.words})"]

    def postgres_drop(self) -> list[str]:
        return [f"DROP INDEX IF EXISTS {self.gin_index}"]


MESSAGES_FTS = FullTextIndex(MESSAGES)
PASSAGES_FTS = FullTextIndex(PASSAGES)
FTS_INDEXES = (MESSAGES_FTS, PASSAGES_FTS)

_SHADOW_SUFFIXES = ("", "_data", "_idx", "_docsize", "_config", "_content")


def is_fts_object(name: str | None) -> bool:
    """Whether `name` is one of the full-text objects (for autogenerate to skip)."""
    if name is None:
        return False
    for index in FTS_INDEXES:
        if name == index.gin_index or any(name == index.fts_table + s for s in _SHADOW_SUFFIXES):
            return True
    return False


def _attach(index: FullTextIndex) -> None:
    def create(target: sa.Table, connection: sa.Connection, **_: object) -> None:
        dialect = connection.dialect.name
        statements = index.sqlite_create() if dialect == "sqlite" else index.postgres_create()
        for statement in statements:
            connection.exec_driver_sql(statement)

    def drop(target: sa.Table, connection: sa.Connection, **_: object) -> None:
        dialect = connection.dialect.name
        statements = index.sqlite_drop() if dialect == "sqlite" else index.postgres_drop()
        for statement in statements:
            connection.exec_driver_sql(statement)

    sa.event.listen(index.table, "after_create", create)
    sa.event.listen(index.table, "before_drop", drop)


for _index in FTS_INDEXES:
    _attach(_index)
