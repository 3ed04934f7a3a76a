"""What a live database is, as memorm needs to know before it runs a unit of work.

* its schema's alembic revision, against the head this memorm ships
  (`head_revision`, `current_revision`);
* whether memorm's tables are distributed on a Citus cluster
  (`is_distributed`, by the tables of `DISTRIBUTION`);
* whether the role connecting is exempt from row-level security
  (`role_bypasses_rls`).

Each is read on a connection of its own, in one statement or a few; a
[`Backend`][memorm.backend.Backend] reads them once (`Backend.check_schema`).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import sqlalchemy as sa
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

from memorm.engines import Reachable
from memorm.models import AGENT_NAMES, AGENTS, TABLES
from memorm.translate import READ_ONLY, translating

__all__ = [
    "DISTRIBUTION",
    "alembic_config",
    "current_revision",
    "head_revision",
    "is_distributed",
    "revision_on",
    "role_bypasses_rls",
    "script_location",
    "scripts",
    "unshardable_indexes",
]

# (table, distribution column or None for a reference table), parents before children
# (`memorm.distribute` distributes them in this order): agents by their id, the names
# copied to every node, every other table by its agent.
DISTRIBUTION: tuple[tuple[sa.Table, str | None], ...] = tuple(
    (table, None if table is AGENT_NAMES else "id" if table is AGENTS else "agent_id") for table in TABLES
)
CITUS_VERSION = sa.text("SELECT extversion FROM pg_extension WHERE extname = 'citus'")
DISTRIBUTED_TABLES = sa.text("SELECT logicalrelid::regclass::text FROM pg_dist_partition")
_PRESENT = sa.text(
    "SELECT name FROM unnest(CAST(:names AS text[])) AS name WHERE to_regclass(name) IS NOT NULL"
)
_BYPASSES_RLS = sa.text("SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user")


def unshardable_indexes(table: sa.Table, column: str | None) -> list[str]:
    """The unique indexes of `table` that lack its distribution `column` (Citus refuses those)."""
    if column is None:  # a reference table keeps every index
        return []
    return sorted(str(index.name) for index in table.indexes if index.unique and column not in index.columns)


def script_location() -> Path:
    """The `migrations` folder: inside the installed package, or beside it in a checkout."""
    package = Path(__file__).resolve().parent
    for candidate in (package / "migrations", package.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError("memorm's migrations folder is missing from this installation")


def alembic_config(url: str | None = None, *, connection: Connection | None = None) -> Config:
    """An alembic `Config` for memorm's migrations (no ini file needed)."""
    config = Config()
    config.set_main_option("script_location", str(script_location()))
    if url is not None:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@cache
def scripts() -> ScriptDirectory:
    """memorm's migration scripts, read once per process (a read imports every revision's file)."""
    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    """The newest revision this memorm ships."""
    head = scripts().get_current_head()
    if head is None:  # pragma: no cover - the package always ships revisions
        raise RuntimeError("memorm ships no migrations")
    return head


def revision_on(connection: Connection) -> str | None:
    """The schema's revision, read on `connection`; None where memorm never migrated."""
    revision: str | None = MigrationContext.configure(connection).get_current_revision()
    return revision


async def current_revision(db: Reachable) -> str | None:
    """The schema's current revision, or None where memorm never migrated."""
    engine = db.engine.execution_options(**{READ_ONLY: True})
    async with engine.connect() as connection:
        return await connection.run_sync(revision_on)


async def is_distributed(db: Reachable) -> bool:
    """Whether `db` is a Citus database whose memorm tables (those its schema has) are distributed."""
    if db.dialect != "postgresql":
        return False
    with translating():
        async with db.engine.connect() as connection:
            if await connection.scalar(CITUS_VERSION) is None:
                return False
            done = set((await connection.execute(DISTRIBUTED_TABLES)).scalars())
            names = [table.name for table, _ in DISTRIBUTION]
            present = set((await connection.execute(_PRESENT, {"names": names})).scalars())
            await connection.rollback()
    # A schema below head (downgraded past the revision that made a table) lacks some tables.
    return AGENTS.name in done and present <= done


async def role_bypasses_rls(db: Reachable) -> bool:
    """Whether `db`'s role is exempt from row-level security (superuser or BYPASSRLS; Postgres only)."""
    with translating():
        async with db.engine.connect() as connection:
            found = await connection.scalar(_BYPASSES_RLS)
            await connection.rollback()
    return bool(found)
