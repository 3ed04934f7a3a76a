"""Retention: purging expired sessions, deleting by age, forgetting a person.

Each scenario works in its own store.  The data is written by the raw driver
with memorm's encodings (SQLite: 32-hex uuids, ``YYYY-MM-DD HH:MM:SS.ffffff``
text, JSON text, little-endian float32 bytes; Postgres: native types, jsonb as
text, pgvector's binary codec), then checked through memorm: its dry-run
counts must match what was built.  The rows a timed run deletes are also kept
in ``stage_*`` copies of the tables; before every sample, outside the timing,
they go back with one ``INSERT … SELECT`` per table (through the full-text
triggers and GIN indexes, like any insert), and the store is settled as
``db.scrub()`` would: SQLite merges both FTS5 indexes (``'optimize'``) and
checkpoints the WAL (``wal_checkpoint(TRUNCATE)``); Postgres runs
``VACUUM (ANALYZE, INDEX_CLEANUP ON)`` on memorm's tables, whose autovacuum is
off so that it never runs inside a timing.  memorm and the raw side alternate on the same
data, in an order rotated every round, and every run's result is checked (the
counts, and what is left).

1. ``memorm.retention.purge_expired(db, batch=100)`` (one unit of work per
   100 sessions) of 500 expired sessions x 100 messages among 500 live
   sessions of 100 messages, against the raw driver doing the same: per
   transaction (``BEGIN IMMEDIATE`` on SQLite), select up to 100 expired ids
   (``ORDER BY expires_at``, ``FOR UPDATE SKIP LOCKED`` on Postgres),
   ``DELETE FROM messages WHERE session_id IN …``, ``DELETE FROM sessions
   WHERE id IN …``, until a batch comes back short.  memorm also runs a
   dry-run count first (the totals it reports progress against).  Then
   ``db.scrub()`` after memorm's purge.
2. ``uow.messages.delete_before(agent_id, cutoff)`` of the older half of one
   agent's 20,000 messages (20 sessions interleaved in time, a tool call and
   its two answers every 25 messages, and in each session a call just before
   the cutoff whose two answers are newer, so they go too), against the raw
   driver in one transaction: a ``DELETE`` of the agent's newer ``tool``
   messages whose nearest earlier non-tool message is older than the cutoff
   (one index probe each), then the plain ``DELETE FROM messages WHERE
   agent_id = ? AND created_at < ?`` (timed on its own too).
3. ``uow.agents.forget({"user_id": …})`` of one person among 200, each with an
   agent (``meta.user_id``) holding 10 sessions x 200 messages and 500
   passages of 384-d, and, in one shared agent, two tagged sessions of 20
   messages, 20 tagged passages and 5 tagged messages in a group session
   (409,000 messages and 104,000 passages in all).  The raw side runs
   memorm's statements in one transaction (the ``archive_version`` bump, on
   Postgres the ``FOR UPDATE`` of the sessions, then the deletes of messages,
   passages, sessions and agents) without memorm's counts and id look-ups,
   matching ``json_extract(meta, '$.user_id') = ?`` / ``meta @> $1``; on
   SQLite it then runs FTS5 ``'optimize'`` of both indexes as memorm does,
   each timed on its own.  ``db.scrub()`` is timed after memorm's forget, and
   memorm's statements are timed through SQLAlchemy's cursor events to show
   where its time goes.
4. SQLite only: the raw purge of (1) with ``PRAGMA secure_delete = ON`` (as
   memorm sets on every connection, and as the raw side of (1) runs) against
   ``OFF``.

``--quick`` shrinks every scenario (20 people, 2,000 messages, 100 expired
sessions of 50) and takes two samples of each.  There are no targets: the rows
report times, ratios and rows/s.

The scenarios are :mod:`benchmarks.retention_purge` (1 and 4),
:mod:`benchmarks.retention_delete_before` (2) and
:mod:`benchmarks.retention_forget` (3); their data is
:mod:`benchmarks.retention_data`, the raw side :mod:`benchmarks.raw.retention`.
"""

from __future__ import annotations

from collections.abc import Sequence

from benchmarks.report import Row
from benchmarks.retention_data import FULL, QUICK
from benchmarks.retention_delete_before import bench_delete_before
from benchmarks.retention_forget import bench_forget
from benchmarks.retention_purge import bench_purge


async def run(engines: Sequence[str], *, quick: bool = False) -> list[Row]:
    size = QUICK if quick else FULL
    rows: list[Row] = []
    for engine in engines:
        rows += await bench_purge(engine, size)
        rows += await bench_delete_before(engine, size)
        rows += await bench_forget(engine, size)
    return rows
