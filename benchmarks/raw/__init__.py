"""The raw-driver baselines: memorm's work done by hand on aiosqlite and asyncpg.

What a careful developer would write on the drivers for the same essential
work, storing values exactly as memorm stores them (:mod:`.encoding`):

* :mod:`.chat`: appends, windows and contexts of a session's messages;
* :mod:`.passages`: archival passages' writes, nearest-neighbour searches
  (pgvector, or numpy on SQLite);
* :mod:`.retention`: loading rows of every table, purges, deletion by age,
  forgetting a person;
* :mod:`.pooled`: the chat path and a vector search behind a transaction
  pooler (PgBouncer), sent as memorm sends them there.

The benchmark modules time memorm against these.
"""
