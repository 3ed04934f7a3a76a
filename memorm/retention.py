"""Retention and forgetting, run in batches: expired sessions, old history, a person's data.

The repository operations (`uow.sessions.purge_expired`,
`uow.messages.delete_before`, `uow.passages.delete_before`,
`uow.agents.forget`) each run in the caller's unit of work: all or nothing,
and for as long as they take, one transaction.  The functions here run the
same deletions for maintenance jobs and the `memorm purge` / `memorm
forget` commands, committing every batch, so a purge of millions of rows
never holds a lock (SQLite's one writer lock, Postgres row locks and an old
snapshot) for longer than one batch:

```python
removed = await purge_expired(db)                         # sessions past expires_at
removed = await purge_older_than(db, utcnow() - timedelta(days=30))
removed = await forget(db, {"user_id": "u42"})            # then scrubs the files
```

Each returns [`Removed`][memorm.retention.Removed], the counts of deleted rows; `dry_run=True`
counts what would go and deletes nothing.  See `docs/retention.md`.

Each runs in `db`'s tenant (`"default"`, or the tenant of a
[`for_tenant`][memorm.db.Database.for_tenant] view), or with `all_tenants=True` in every tenant
(maintenance; on Postgres the role must bypass row-level security):

```python
removed = await purge_expired(db.for_tenant("acme"))     # acme's expired sessions
removed = await purge_expired(db, all_tenants=True)      # every tenant's
```
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from itertools import groupby
from typing import Any

import sqlalchemy as sa

from memorm.errors import NotFoundError
from memorm.models import AGENTS
from memorm.progress import Reporter, Silent
from memorm.removal import DEFAULT_BATCH, Removed, check_batch
from memorm.repositories.checkpoint_retention import check_retention
from memorm.scrub import scrub as scrub_database
from memorm.translate import translating
from memorm.types import utcnow
from memorm.uow import UnitOfWork, UnitsOfWork
from memorm.validation import check_aware, check_flag, check_text

__all__ = ["DEFAULT_BATCH", "Removed", "forget", "purge_checkpoints", "purge_expired", "purge_older_than"]

_AGENT_PAGE = 1000


class _Tally:
    """The running total of a batched purge, reported as it grows."""

    def __init__(self, reporter: Reporter | None, expected: Removed, kinds: tuple[str, ...]) -> None:
        self.reporter = reporter or Silent()
        self.kinds = kinds
        self.total = Removed()
        for kind in kinds:
            self.reporter.start(kind, getattr(expected, kind))

    def add(self, removed: Removed) -> Removed:
        for kind in self.kinds:
            self.reporter.advance(kind, getattr(removed, kind))
        self.total += removed
        return removed


def _unit_of_work(db: UnitsOfWork, all_tenants: bool, *, read_only: bool = False) -> UnitOfWork:
    """A unit of work in `db`'s tenant, or across every tenant."""
    if all_tenants:
        return db.unit_of_work(read_only=read_only, all_tenants=True)
    return db.unit_of_work(read_only=read_only)


async def purge_expired(
    db: UnitsOfWork,
    *,
    now: datetime | None = None,
    batch: int = DEFAULT_BATCH,
    dry_run: bool = False,
    reporter: Reporter | None = None,
    all_tenants: bool = False,
) -> Removed:
    """Delete every session whose `expires_at` is at or before `now`, with its messages.

    One unit of work per `batch` sessions.  Sessions a concurrent unit of
    work holds locked (Postgres) are skipped and left for the next purge.
    The sessions of `db`'s tenant; with `all_tenants=True`, of every tenant
    (on Postgres the role must bypass row-level security, else `ValidationError`).
    """
    instant = utcnow() if now is None else check_aware(now, "now")
    size = check_batch(batch)
    check_flag(dry_run, "dry_run")
    every = check_flag(all_tenants, "all_tenants")
    async with _unit_of_work(db, every, read_only=True) as uow:
        expected = await uow.sessions.purge_expired(now=instant, dry_run=True)
    if dry_run:
        return expected
    tally = _Tally(reporter, expected, ("sessions", "messages"))
    while True:
        async with _unit_of_work(db, every) as uow:
            removed = await uow.sessions._purge_batch(instant, size)
        tally.add(removed)  # reported once committed
        if removed.sessions == 0:
            return tally.total


async def purge_older_than(
    db: UnitsOfWork,
    cutoff: datetime,
    *,
    agent: str | uuid.UUID | None = None,
    batch: int = 10 * DEFAULT_BATCH,
    dry_run: bool = False,
    reporter: Reporter | None = None,
    after_expired: datetime | None = None,
    all_tenants: bool = False,
) -> Removed:
    """Delete messages and archival passages created before `cutoff`.

    Of one agent (its name or id) or of every agent; sessions stay, even when
    emptied (use session expiry to drop sessions).  One unit of work per
    `batch` rows.  `after_expired`: the `now` of a [`purge_expired`][memorm.retention.purge_expired]
    run just before, whose dry run already counted the messages of sessions
    expired then; this dry run leaves them out, so the two add up.

    The agents of `db`'s tenant; with `all_tenants=True`, of every tenant
    (on Postgres the role must bypass row-level security, else
    `ValidationError`), and then `agent` names the agent of that name (or
    id) in every tenant that has one.  The agents are listed across
    tenants; each agent's deletions run in units of work of its own tenant.
    """
    instant = check_aware(cutoff, "cutoff")
    size = check_batch(batch)
    expired_at = None if after_expired is None else check_aware(after_expired, "after_expired")
    check_flag(dry_run, "dry_run")
    owners = await _owners(db, agent, check_flag(all_tenants, "all_tenants"))
    expected = Removed()
    for tenant, agents in groupby(owners, key=lambda owner: owner[0]):
        async with db.unit_of_work(tenant, read_only=True) as uow:
            for _, key in agents:
                messages = await uow.messages._count_old(key, instant, None, expired_at)
                passages = await uow.passages.delete_before(key, instant, dry_run=True)
                expected += Removed(messages=messages, passages=passages)
    if dry_run:
        return expected
    tally = _Tally(reporter, expected, ("messages", "passages"))
    for tenant, key in owners:
        async with db.unit_of_work(tenant) as uow:
            count = await uow.messages._delete_answers(key, instant, None)
        tally.add(Removed(messages=count))
        while True:
            async with db.unit_of_work(tenant) as uow:
                count = await uow.messages._delete_old_batch(key, instant, None, size)
            if not tally.add(Removed(messages=count)).messages:
                break
        while True:
            async with db.unit_of_work(tenant) as uow:
                count = await uow.passages._delete_old_batch(key, instant, size)
            if tally.add(Removed(passages=count)).passages < size:
                break
    return tally.total


async def purge_checkpoints(
    db: UnitsOfWork,
    *,
    keep_last: int | None = None,
    before: datetime | None = None,
    agent: str | uuid.UUID | None = None,
    dry_run: bool = False,
    reporter: Reporter | None = None,
    all_tenants: bool = False,
) -> Removed:
    """Delete old graph checkpoints (LangGraph's) of every thread, or of one agent's threads.

    In each (sub)graph namespace of a thread the newest checkpoint stays,
    with the newest `keep_last` and those made at or after `before`, and
    what a kept checkpoint needs (the parents its `DeltaChannel`s are rebuilt
    from); the writes and channel values of the deleted ones go with them
    (see [`uow.checkpoints.purge`][memorm.repositories.checkpoints.CheckpointRepository.purge]).
    One unit of work per thread; the result's `checkpoints` counts them.
    The reporter's task is `"threads"`.  Agents as for
    [`purge_older_than`][memorm.retention.purge_older_than].
    """
    last, cutoff = check_retention(keep_last, before)
    check_flag(dry_run, "dry_run")
    owners = await _owners(db, agent, check_flag(all_tenants, "all_tenants"))
    threads: list[tuple[str, uuid.UUID, uuid.UUID]] = []
    for tenant, agents in groupby(owners, key=lambda owner: owner[0]):
        async with db.unit_of_work(tenant, read_only=True) as uow:
            for _, key in agents:
                threads += [
                    (tenant, key, thread) for thread in await uow.checkpoints.sessions_with_state(key)
                ]
    progress = reporter or Silent()
    progress.start("threads", len(threads))
    removed = 0
    for tenant, key, thread in threads:
        async with db.unit_of_work(tenant, read_only=dry_run) as uow:
            removed += await uow.checkpoints.purge(
                key, thread, keep_last=last, before=cutoff, dry_run=dry_run
            )
        progress.advance("threads", 1)
    return Removed(checkpoints=removed)


async def forget(
    db: UnitsOfWork,
    where: Mapping[str, Any],
    *,
    dry_run: bool = False,
    scrub: bool = True,
    reindex: bool = False,
    reporter: Reporter | None = None,
    all_tenants: bool = False,
) -> Removed:
    """Erase every agent, session, message and passage whose `meta` matches `where`.

    The deletion is one unit of work (a person is forgotten entirely or not at
    all); then, unless `scrub=False`, [`Database.scrub`][memorm.db.Database.scrub] clears what the
    files still hold of the deleted rows (`reindex=True`: the words in
    Postgres' full-text index too), and the result's `scrubbed` says what it
    cleared and skipped: on Postgres a role that does not own the tables
    (the application role) may not `VACUUM` them, so `scrubbed.skipped`
    names them and a [`ScrubWarning`][memorm.scrub.ScrubWarning] is issued.

    The rows of `db`'s tenant; with `all_tenants=True`, of every tenant (on
    Postgres the role must bypass row-level security, else `ValidationError`).
    """
    for flag, field in ((dry_run, "dry_run"), (scrub, "scrub"), (reindex, "reindex")):
        check_flag(flag, field)
    every = check_flag(all_tenants, "all_tenants")
    async with _unit_of_work(db, every, read_only=True) as uow:
        expected = await uow.agents.forget(where, dry_run=True)
    if dry_run:
        return expected
    tally = _Tally(reporter, expected, ("agents", "sessions", "messages", "passages"))
    async with _unit_of_work(db, every) as uow:
        removed = await uow.agents.forget(where)
    tally.add(removed)
    if scrub and removed.total:
        return replace(tally.total, scrubbed=await scrub_database(db, reindex=reindex))
    return tally.total


async def _owners(db: UnitsOfWork, agent: str | uuid.UUID | None, every: bool) -> list[tuple[str, uuid.UUID]]:
    """The `(tenant, id)` of the named agent or of every agent, of `db`'s tenant or of every tenant."""
    if every:
        return await _agents_of_every_tenant(db, agent)
    return [(db.tenant, key) for key in await _agents(db, agent)]


async def _agents(db: UnitsOfWork, agent: str | uuid.UUID | None) -> list[uuid.UUID]:
    """The ids of the named agent (by name or id), or of every agent (read a page at a time)."""
    async with db.unit_of_work(read_only=True) as uow:
        if isinstance(agent, uuid.UUID):
            return [(await uow.agents.get(agent)).id]
        if agent is not None:
            found = await uow.agents.get_by_name(agent)
            if found is None:
                raise NotFoundError(f"no agent named {agent!r}")
            return [found.id]
        owners: list[uuid.UUID] = []
        while True:
            page = await uow.agents.list(limit=_AGENT_PAGE, offset=len(owners))
            owners += [found.id for found in page.items]
            if len(page.items) < _AGENT_PAGE:
                return owners


async def _agents_of_every_tenant(
    db: UnitsOfWork, agent: str | uuid.UUID | None
) -> list[tuple[str, uuid.UUID]]:
    """The `(tenant, id)` of the named agent in every tenant (by name or id), or of every agent.

    In tenant order, so that the agents of one tenant come together.
    """
    query = sa.select(AGENTS.c.tenant, AGENTS.c.id).order_by(AGENTS.c.tenant, AGENTS.c.id)
    if isinstance(agent, uuid.UUID):
        query = query.where(AGENTS.c.id == agent)
    elif agent is not None:
        query = query.where(AGENTS.c.name == check_text(agent, "agent"))
    async with db.unit_of_work(read_only=True, all_tenants=True) as uow:
        with translating():
            owners = [(tenant, key) for tenant, key in await uow.link.session.execute(query)]
    if not owners and isinstance(agent, uuid.UUID):
        raise NotFoundError(f"no agent {agent}")
    if not owners and agent is not None:
        raise NotFoundError(f"no agent named {agent!r}")
    return owners
