"""Search behind one interface per kind; the dialect is chosen here, not in repositories.

* `memorm.search.text`: full-text search (FTS5 on SQLite, `tsvector` +
  GIN on Postgres), with user text turned into safe query terms.
* `memorm.search.fts_ddl`: the full-text indexes' DDL for `create_all`.
* `memorm.search.vector`: archival memory's similarity search (`nearest`),
  over `vector_index` (HNSW indexes and their settings), `vector_pg`
  (Postgres' search), `vector_scan` (SQLite's numpy scan and its cache) and
  `vector_rows` (what both share).
* `memorm.search.store_vectors`: the LangGraph store's similarity search,
  over `store_index`, `store_scan` and `store_shapes`.
"""
