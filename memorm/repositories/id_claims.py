"""Ids a caller chooses: each names one message (or archival passage) of its tenant, whoever holds it.

Messages and archival passages are keyed `(tenant, id, agent_id)`, so that a
distributed database can shard them by agent; beside that key a unique index
on `(tenant, id)` keeps an id to one row of the tenant.  On SQLite and on one
Postgres server the index does it all: it rides on the INSERT, so a write
pays nothing more, and two writers of one id meet on it.

A distributed table (Citus) cannot hold that index: its unique indexes must
hold the distribution column (`memorm.distribute` drops it).  There a write
whose ids the caller chose first takes transaction-scoped advisory locks on
the coordinator, keyed on the table, the tenant and each id (`claim`), and
then looks the ids up on every shard: two writers of one id queue on its
lock, and the second, once the first has committed, finds the first's row.
Ids memorm makes need neither the lock nor that read (the chat path stays on
its agent's shard): they are new by construction (`chose_id`).

Many ids at once (bulk copies and imports, large batches) take one lock per
table and tenant instead (`CLAIM_ONE_BY_ONE`), which the smaller writes hold
shared: a transaction never holds thousands of locks.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Collection, Mapping
from functools import cache
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from memorm.conflicts import conflict_message
from memorm.driver import fetch
from memorm.errors import ConflictError
from memorm.translate import guarded
from memorm.types.lists import UUIDList, in_list

if TYPE_CHECKING:
    from memorm.link import Link

__all__ = ["CLAIM_ONE_BY_ONE", "chose_id", "claim", "claim_all", "refuse_held"]

CLAIM_ONE_BY_ONE = 64  # ids a write locks one by one; more take the table's lock for the tenant

# The first key is the table's for the tenant: shared by writes that lock their ids one by
# one, exclusive for one that locks them all.  unnest yields the keys in order, so ids
# are locked in the order given (sorted: two writers of overlapping ids never deadlock).
_LOCK = sa.text(
    "SELECT CASE WHEN k.n = 1 AND :shared THEN pg_advisory_xact_lock_shared(k.key) "
    "ELSE pg_advisory_xact_lock(k.key) END "
    "FROM unnest(CAST(:keys AS bigint[])) WITH ORDINALITY AS k (key, n)"
)


def chose_id(item: object) -> bool:
    """Whether the caller chose the id of `item`, a message or passage to store (a dict or a row object).

    A dict chose it when it gives one (else memorm makes one as it stores
    the dict).  A `Message` or `ArchivalPassage` built without an `id` holds
    one memorm made, which is new unless the object was stored before (read
    back or appended: its `agent_id` is set) or copied (`copy.copy`,
    `model_copy`: both objects are marked then).  Its first use marks it,
    so sending the same object again (a retry) is checked as a chosen id is.
    """
    if isinstance(item, Mapping):
        return item.get("id") is not None
    given: set[str] = item.__pydantic_fields_set__  # type: ignore[attr-defined]
    if "id" in given or item.__dict__.get("agent_id") is not None:
        return True
    given.add("id")  # in use from now on: the object sent again is checked
    return False


def _key(table: str, tenant: str, row_id: uuid.UUID | None) -> int:
    """A signed 64-bit advisory lock key: an id of `table` in `tenant` (None: the table's, for the tenant)."""
    named = f"{table}\x00{tenant}".encode()  # tenants hold no NUL: the parts never run together
    digest = hashlib.blake2b(named + (b"" if row_id is None else row_id.bytes), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


async def claim(link: Link, table: sa.Table, tenant: str, ids: Collection[uuid.UUID]) -> None:
    """Lock the `ids` of `table` in `tenant` until the transaction ends, on a distributed database.

    A no-op elsewhere (the unique index on `(tenant, id)` holds there).  Call
    it before looking the ids up: a writer of the same id waits here until
    this transaction ends, and then finds its row.  More than
    `CLAIM_ONE_BY_ONE` ids take the table's lock for the tenant instead.
    """
    if not link.state.distributed or not ids:
        return
    if len(ids) > CLAIM_ONE_BY_ONE:
        await claim_all(link, table, tenant)
        return
    keys = [_key(table.name, tenant, None), *sorted({_key(table.name, tenant, row_id) for row_id in ids})]
    await _lock(link, keys, shared=True)


async def claim_all(link: Link, table: sa.Table, tenant: str) -> None:
    """Lock every id of `table` in `tenant` (bulk writes), on a distributed database; a no-op elsewhere."""
    if link.state.distributed:
        await _lock(link, [_key(table.name, tenant, None)], shared=False)


async def _lock(link: Link, keys: list[int], *, shared: bool) -> None:
    async with guarded(link):
        await link.execute(_LOCK, {"keys": keys, "shared": shared})


@cache
def _held(table: sa.Table) -> sa.Select[Any]:
    """A row of `table` in the tenant with one of the `ids`, any agent's (one statement per table)."""
    ids = in_list(table.c.id, sa.bindparam("ids", type_=UUIDList()))
    return sa.select(table.c.id).where(table.c.tenant == sa.bindparam("of_tenant"), ids).limit(1)


async def refuse_held(link: Link, table: sa.Table, tenant: str, ids: Collection[uuid.UUID]) -> None:
    """`ConflictError` if a row of `table` in `tenant`, any agent's, has one of the `ids` the caller chose.

    Run before the write, so nothing is written and the unit of work can go
    on.  On a distributed database the ids are locked first (`claim`) and
    the look-up asks every shard; elsewhere it is one probe of the unique
    index, which also stops a writer racing this one.
    """
    if not ids:
        return
    await claim(link, table, tenant, ids)
    async with guarded(link):
        found = await fetch(link, _held(table), {"of_tenant": tenant, "ids": list(ids)})
    if found:
        raise ConflictError(conflict_message((table.name, ("id",)), {"id": found[0][0]}))
