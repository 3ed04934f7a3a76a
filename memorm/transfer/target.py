"""Where `copy` and `import` write: an empty database is set up, one at another revision refused.

A destination is checked first, writing nothing (`check_destination`), and
set up only once everything else a copy or import checks has passed
(`prepare_destination`): one refused stays as it was, a SQLite file not
even made.  After the rows are in, Postgres's planner statistics are
refreshed for the tables that received them (`refresh_statistics`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import sqlalchemy as sa

from memorm.config import sqlite_file
from memorm.db import Database
from memorm.progress import Reporter
from memorm.schema_state import role_bypasses_rls
from memorm.transfer.scope import Scope, check_reach
from memorm.translate import translating

__all__ = ["check_destination", "prepare_destination", "refresh_statistics", "written"]

# The tables among those named that this role may ANALYZE (it owns them, or is a member of
# their owner's role, or a superuser): others would be skipped with a WARNING.
_MAY_ANALYZE = sa.text(
    "SELECT name FROM unnest(CAST(:names AS text[])) WITH ORDINALITY AS named (name, position)"
    " WHERE EXISTS (SELECT 1 FROM pg_class WHERE oid = to_regclass(quote_ident(name))"
    " AND pg_has_role(relowner, 'USAGE')) ORDER BY position"
)


async def check_destination(db: Database, tenant: Scope = None) -> bool:
    """Check that `db` may receive rows of the scope `tenant`, writing nothing; whether it is empty.

    An empty destination (a SQLite file not there yet, which is not opened
    and so not made; a new Postgres database, or one `memorm db downgrade
    base` emptied) has no memorm schema: `prepare_destination` migrates it.
    A destination that has a memorm schema must already be at head:
    migrating a database that holds data is its owner's decision, not a
    side effect of a copy.

    Raises:
        SchemaError: `db` has a memorm schema at another revision (naming
            `memorm db upgrade`).
        ValidationError: `tenant` is None and `db`'s role is subject to
            row-level security (`memorm.transfer.scope.check_reach`).
    """
    path = sqlite_file(db.url)
    if path is not None and not path.exists():
        return True
    if await db.current_revision() is not None:
        await db.check_schema()
        check_reach(db, tenant)
        return False
    if db.dialect == "postgresql" and tenant is None:
        # The role, looked up as the schema check does (which needs no schema).
        check_reach(db, tenant, bypasses=await role_bypasses_rls(db))
    return True


async def prepare_destination(db: Database, empty: bool | None = None) -> None:
    """Make `db` ready to receive rows: migrated to head if memorm never set it up, else checked.

    `empty`: what `check_destination` found (None: look now).  An empty
    destination is migrated to head, as `memorm db upgrade` would.

    Raises:
        SchemaError: `db` has a memorm schema at another revision (naming
            `memorm db upgrade`).
    """
    if empty is None:
        empty = await db.current_revision() is None
    if empty:
        await db.upgrade()
    await db.check_schema()


async def refresh_statistics(db: Database, tables: Sequence[str], reporter: Reporter) -> list[str]:
    """`ANALYZE` the memorm `tables` a copy or import wrote rows to, on Postgres; those analyzed.

    A bulk load leaves the planner with the statistics of the tables before
    it (none, for new ones) until autovacuum analyzes them, a minute or more
    later: reads planned meanwhile may take the wrong index (a window of 50
    messages, among 20,000 just loaded, took ten times as long before
    `ANALYZE` as after: docs/cli.md).  Only tables this role may analyze
    (their owner's) are: an application role under row-level security
    copying its tenant leaves them to autovacuum.  SQLite keeps no
    statistics unless told to (memorm never runs its `ANALYZE`): nothing to
    refresh there.
    """
    if db.dialect != "postgresql" or not tables:
        return []
    quote = db.engine.dialect.identifier_preparer.quote
    with translating():
        async with db.engine.connect() as connection:
            outside = await connection.execution_options(isolation_level="AUTOCOMMIT")
            owned = list((await outside.execute(_MAY_ANALYZE, {"names": list(tables)})).scalars())
            if owned:
                reporter.start("analyze", len(owned))
            for name in owned:  # memorm's own table names, quoted: no user text
                await outside.exec_driver_sql(f"ANALYZE {quote(name)}")
                reporter.advance("analyze", 1)
    return owned


def written(inserted: Mapping[str, int]) -> list[str]:
    """The tables of a report's `inserted` counts that received rows."""
    return [name for name, count in inserted.items() if count]
