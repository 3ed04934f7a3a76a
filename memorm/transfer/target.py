"""Where `copy` and `import` write: an empty database is set up, one at another revision refused."""

from __future__ import annotations

from memorm.db import Database

__all__ = ["prepare_destination"]


async def prepare_destination(db: Database) -> None:
    """Make `db` ready to receive rows: migrated to head if memorm never set it up, else checked.

    An empty destination (a new SQLite file, a new Postgres database, one
    `memorm db downgrade base` emptied) has no memorm schema and is migrated
    to head, as `memorm db upgrade` would.  A destination that has a memorm
    schema must already be at head: migrating a database that holds data is
    its owner's decision, not a side effect of a copy.

    Raises:
        SchemaError: `db` has a memorm schema at another revision (naming
            `memorm db upgrade`).
    """
    if await db.current_revision() is None:
        await db.upgrade()
    await db.check_schema()
