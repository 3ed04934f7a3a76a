"""`Database.scrub`: clear what the database files still hold of deleted rows, and say what it could not.

On Postgres only a table's owner (a superuser, the database's owner; from
Postgres 17 a role granted `MAINTAIN`) may `VACUUM` it or rebuild its
indexes: for any other role, such as the application role, `VACUUM`
skips the table with a warning in the server's log and succeeds.  So
`scrub` asks first which tables the role may clean, cleans those, and
names the others in [`Scrubbed.skipped`][memorm.scrub.Scrubbed] and in a
[`ScrubWarning`][memorm.scrub.ScrubWarning], never reporting work not done.
"""

from __future__ import annotations

import warnings

import anyio
import sqlalchemy as sa

from memorm.removal import Scrubbed
from memorm.rls import TENANT_TABLES
from memorm.search.fts_ddl import FTS_INDEXES
from memorm.search.text import merge_deleted
from memorm.translate import READ_ONLY, translating
from memorm.uow import UnitsOfWork

__all__ = ["ScrubWarning", "Scrubbed", "scrub"]

# Every table that holds a tenant's rows: those purges, `forget` and `delete_tenant` delete from
# (the agents' names, the sessions' LangGraph checkpoints and the agents' stores included).
_TABLES = TENANT_TABLES
_CHECKPOINT_TRIES = 40
WAL = "write-ahead log"  # SQLite's, in `Scrubbed.skipped` when a reader kept it from being truncated

# Per table (in search_path order, as VACUUM finds it): whether the role may VACUUM it, and
# whether it may REINDEX its indexes.  Postgres' own rules: the owner (or a role with its
# privileges; a superuser has every role's) may do both, the database's owner may VACUUM.
_ALLOWED = """
SELECT t.name, pg_has_role(c.relowner, 'USAGE') OR pg_has_role(d.datdba, 'USAGE'){maintain},
    pg_has_role(c.relowner, 'USAGE'){maintain}
FROM unnest(CAST(:names AS text[])) WITH ORDINALITY AS t(name, n)
JOIN pg_class c ON c.oid = to_regclass(quote_ident(t.name))
JOIN pg_database d ON d.datname = current_database()
ORDER BY t.n
"""
_MAINTAIN = " OR has_table_privilege(c.oid, 'MAINTAIN')"  # Postgres 17 and later


class ScrubWarning(UserWarning):
    """[`Database.scrub`][memorm.db.Database.scrub] left something uncleared (`Scrubbed.skipped`).

    Warned once per scrub that skipped anything; the message says what and
    why (on Postgres: run the scrub as the tables' owner).
    """


async def scrub(db: UnitsOfWork, *, reindex: bool = False) -> Scrubbed:
    """Clear what the files still hold of deleted rows; see [`Database.scrub`][memorm.db.Database.scrub]."""
    await db.check_schema()
    if db.dialect == "sqlite":
        done = await _scrub_sqlite(db)
        if done.skipped:
            _warn(
                "scrub could not truncate SQLite's write-ahead log: a reader still uses the old pages, which "
                "may hold deleted rows; run the scrub again when no reader is open"
            )
        return done
    done = await _scrub_postgres(db, reindex)
    if done.skipped:
        _warn(
            f"scrub skipped {', '.join(done.skipped)}: only their owner (or a superuser) may VACUUM a table "
            "or rebuild its indexes, so deleted rows' old versions stay in the files until a scrub runs as "
            "the owner (`memorm db scrub --url OWNER_URL`, or `await db.scrub()`)"
        )
    return done


def _warn(message: str) -> None:
    # stacklevel: past this module and Database.scrub, to the caller's line.
    warnings.warn(message, ScrubWarning, stacklevel=4)


async def _scrub_sqlite(db: UnitsOfWork) -> Scrubbed:
    async with db.unit_of_work() as uow:
        for index in FTS_INDEXES:
            await merge_deleted(uow.link, index)
    merged = tuple(index.fts_table for index in FTS_INDEXES)
    with translating():
        async with db.engine.connect() as connection:
            outside = await connection.execution_options(**{READ_ONLY: True})  # no BEGIN
            for _ in range(_CHECKPOINT_TRIES):
                busy = (await outside.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")).scalar()
                if not busy:
                    return Scrubbed(merged=merged)
                await anyio.sleep(0.05)  # a reader from another process is still on the old pages
    return Scrubbed(merged=merged, skipped=(WAL,))


async def _scrub_postgres(db: UnitsOfWork, reindex: bool) -> Scrubbed:
    with translating():
        async with db.engine.connect() as connection:
            outside = await connection.execution_options(isolation_level="AUTOCOMMIT")
            newer = (connection.dialect.server_version_info or (0,)) >= (17,)
            query = _ALLOWED.format(maintain=_MAINTAIN if newer else "")
            allowed = (await outside.execute(sa.text(query), {"names": [t.name for t in _TABLES]})).all()
            vacuumed = tuple(name for name, may_vacuum, _ in allowed if may_vacuum)
            skipped = [name for name, may_vacuum, _ in allowed if not may_vacuum]
            if vacuumed:  # only those: VACUUM would skip the others, saying so in the server's log only
                await outside.exec_driver_sql(f"VACUUM (ANALYZE, INDEX_CLEANUP ON) {', '.join(vacuumed)}")
            reindexed = []
            may_reindex = {name for name, _, may in allowed if may}
            for index in FTS_INDEXES if reindex else ():
                if index.table.name in may_reindex:
                    await outside.exec_driver_sql(f"REINDEX INDEX CONCURRENTLY {index.gin_index}")
                    reindexed.append(index.gin_index)
                else:
                    skipped.append(index.gin_index)
    return Scrubbed(vacuumed=vacuumed, reindexed=tuple(reindexed), skipped=tuple(skipped))
