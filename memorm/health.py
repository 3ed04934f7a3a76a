"""`Database.health()`: what a readiness probe asks of memorm's database.

One probe takes a turn at the pool as a read-only unit of work does (so a
probe never jumps the queue of a saturated pool, and reports it), reads the
schema's alembic revision on that connection, and gives the connection back.
It never raises for the database: an unreachable server, a refused login, a
pool that stays full or a probe that takes longer than `timeout` come back as
`reachable=False` with the `memorm.errors` class and message in `error`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import anyio

from memorm.backend import Backend
from memorm.errors import DatabaseError
from memorm.pool_figures import PoolFigures, pool_figures
from memorm.schema_state import head_revision, revision_on
from memorm.translate import translate
from memorm.uow import UnitOfWork
from memorm.validation import check_duration

__all__ = ["Health", "PoolFigures", "probe"]


@dataclass(frozen=True)
class Health:
    """What [`Database.health`][memorm.db.Database.health] found.

    Attributes:
        reachable: the probe checked out a connection and read the schema's revision.
        latency: seconds the probe took (its turn at the pool, a connection if one
            had to be opened, and the revision read); None when it failed.
        revision: the schema's alembic revision (None: not read, or no memorm schema).
        head: the revision this memorm needs.
        pool: the connection pools' figures, read after the probe.
        error: why the probe failed (`"DatabaseError: cannot reach the database: …"`).
    """

    reachable: bool
    latency: float | None
    revision: str | None
    head: str
    pool: PoolFigures
    error: str | None = None

    @property
    def schema_current(self) -> bool:
        """Whether the schema is at the revision this memorm needs."""
        return self.revision == self.head

    @property
    def ok(self) -> bool:
        """Ready to serve: reachable, and the schema current."""
        return self.reachable and self.schema_current

    def as_dict(self) -> dict[str, Any]:
        """The figures as JSON-ready values, with `ok` and `schema_current` (a probe's response body)."""
        return {**asdict(self), "ok": self.ok, "schema_current": self.schema_current}


async def probe(backend: Backend, tenant: str, *, timeout: float) -> Health:  # noqa: ASYNC109 (answers, never raises)
    """Check out a connection of `backend` as `tenant`'s read-only unit of work and read the revision."""
    seconds = check_duration(timeout, "timeout").total_seconds()
    head = head_revision()
    started = time.perf_counter()
    try:
        with anyio.fail_after(seconds):
            async with UnitOfWork(backend, tenant=tenant, read_only=True, schema_checked=False) as uow:
                revision = await uow.session.run_sync(lambda session: revision_on(session.connection()))
    except TimeoutError:
        failure = f"TimeoutError: no answer within {seconds:g} s"
    except Exception as error:
        found = translate(error) or DatabaseError(str(error))
        failure = f"{type(found).__name__}: {found}"
    else:
        latency = time.perf_counter() - started
        return Health(True, latency, revision, head, pool_figures(backend.engines))
    return Health(False, None, None, head, pool_figures(backend.engines), failure)
