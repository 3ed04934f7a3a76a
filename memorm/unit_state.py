"""`UnitState`: what one open unit of work is, and what happened in it, in one typed place.

Made by the unit of work as it opens and held by its link (`link.state`),
where the repositories, the driver paths, the searches and the error
translation (`memorm.translate`) read and write it.  What the unit of work
is (its tenant, whether it reads only, whether the tables are distributed)
is set once; what happened (a failure, an interruption, archives written,
a search setting changed) accumulates until it commits or rolls back.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from memorm.errors import MemormError
from memorm.routing import SessionAgents

__all__ = ["UnitState"]


@dataclass(eq=False, slots=True)
class UnitState:
    """One unit of work's state (see the module's docstring).

    Attributes:
        tenant: the tenant whose rows alone it reads and writes (None: every
            tenant, for maintenance).
        read_only: it promised to read only (writes raise `ValidationError`).
        tenant_setting: Postgres under row-level security: the tenant each of
            its transactions sets, which the policies compare with (None:
            none set, the role bypasses row-level security or on SQLite).
        distributed: memorm's tables are sharded by agent (Citus).
        routes: the database's cache of sessions' agents (`memorm.routing`).
        failed: the database error that failed it; it can then only roll back.
        interrupted: a statement of it was cut short by cancellation: nobody
            knows what it left, and the connection is dropped, not pooled.
        archive_writes: the `(tenant, agent id)`s whose archival passages it
            wrote: their cached vectors are stale once it commits.
        ef_search_changed: a vector search set `hnsw.ef_search` in its
            transaction, which the next search resets (`memorm.search.vector_index`).
    """

    tenant: str | None
    read_only: bool
    routes: SessionAgents
    tenant_setting: str | None = None
    distributed: bool = False
    failed: MemormError | None = None
    interrupted: bool = False
    archive_writes: set[tuple[str, uuid.UUID]] = field(default_factory=set)
    ef_search_changed: bool = False

    def take_archive_writes(self) -> set[tuple[str, uuid.UUID]]:
        """The archives written since the last commit or rollback, forgotten here (the commit is through)."""
        written, self.archive_writes = self.archive_writes, set()
        return written

    def rolled_back(self) -> None:
        """Forget the rolled-back transaction's failure and archive writes."""
        self.failed = None
        self.archive_writes = set()
