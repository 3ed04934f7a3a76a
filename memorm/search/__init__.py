"""Search behind one interface per kind; the dialect is chosen here, not in repositories.

* `memorm.search.text`: full-text search (FTS5 on SQLite, `tsvector` +
  GIN on Postgres), with user text turned into safe query terms.
* `memorm.search.fts_ddl`: the full-text indexes' DDL for `create_all`.
"""
