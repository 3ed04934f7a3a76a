"""Locking sessions before their rows change, as each engine allows.

Writers (appends, trims) lock a session before its messages; deleting in the
same order makes a concurrent writer queue instead of deadlock.  On one
Postgres server that is one `SELECT … FOR UPDATE` in id order.  Citus takes
row locks only in a statement that stays on one shard, so on a distributed
database the sessions are read first and locked agent by agent.  SQLite
ignores `FOR UPDATE`: its writers queue for the one write lock anyway.

Also where writes choose between one statement and several by engine
(`writes_in_one_statement`), so repositories never ask which database they
are on.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from itertools import groupby
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql import ColumnElement

from memorm.link import Link
from memorm.models import SESSIONS
from memorm.translate import guarded

__all__ = ["lock_expired_sessions", "lock_sessions", "writes_in_one_statement"]


def writes_in_one_statement(link: Link) -> bool:
    """Whether a write of data-modifying CTEs runs as one statement here: Postgres on one server.

    SQLite has no data-modifying CTEs; Citus runs an `INSERT … SELECT` from
    one through the coordinator (4.5x slower than two routed statements).
    """
    return not link.sqlite and not link.state.distributed


async def lock_sessions(link: Link, *where: ColumnElement[bool]) -> None:
    """Lock the sessions matching `where`, in id order, before deleting their rows."""
    if not link.state.distributed:
        await _rows(link, sa.select(SESSIONS.c.id).where(*where).order_by(SESSIONS.c.id).with_for_update())
        return
    found = sa.select(SESSIONS.c.tenant, SESSIONS.c.agent_id, SESSIONS.c.id).where(*where)
    await _lock_by_agent(link, [(tenant, agent, key) for tenant, agent, key in await _rows(link, found)])


async def lock_expired_sessions(
    link: Link, expired: sa.Select[Any], still: ColumnElement[bool]
) -> Sequence[tuple[str, uuid.UUID]]:
    """`expired … FOR UPDATE SKIP LOCKED`: the `(tenant, id)` of the first sessions no one holds.

    `expired` selects `(tenant, id)`; `still` is what a locked session must
    still match (a row lock rereads a row a writer changed meanwhile).  On a
    distributed database the candidates are read first and locked agent by
    agent; when every candidate is held, the next ones are tried, as
    `SKIP LOCKED` with a `LIMIT` would.
    """
    if not link.state.distributed:
        return [(row[0], row[1]) for row in await _rows(link, expired.with_for_update(skip_locked=True))]
    passed: set[tuple[str, uuid.UUID]] = set()
    while True:
        query = expired.add_columns(SESSIONS.c.agent_id)
        if passed:
            query = query.where(sa.tuple_(SESSIONS.c.tenant, SESSIONS.c.id).not_in(sorted(passed)))
        found = [(tenant, agent, key) for tenant, key, agent in await _rows(link, query)]
        if not found:
            return []
        locked = await _lock_by_agent(link, found, still, skip_locked=True)
        if locked:
            return locked
        passed.update((tenant, key) for tenant, _, key in found)


async def _lock_by_agent(
    link: Link,
    sessions: Iterable[tuple[str, uuid.UUID, uuid.UUID]],
    *still: ColumnElement[bool],
    skip_locked: bool = False,
) -> list[tuple[str, uuid.UUID]]:
    """Lock `sessions` (`(tenant, agent_id, id)`s, read beforehand), one agent at a time.

    Returns the `(tenant, id)` of the sessions locked (with `skip_locked`,
    those no other transaction held; without, it waits for them), of those
    that `still` match once locked.
    """
    locked: list[tuple[str, uuid.UUID]] = []
    for (tenant, agent), group in groupby(sorted(sessions), key=lambda row: (row[0], row[1])):
        rows = await _rows(
            link,
            sa.select(SESSIONS.c.tenant, SESSIONS.c.id)
            .where(
                SESSIONS.c.tenant == tenant,
                SESSIONS.c.agent_id == agent,
                SESSIONS.c.id.in_([row[2] for row in group]),
                *still,
            )
            .order_by(SESSIONS.c.id)
            .with_for_update(skip_locked=skip_locked),
        )
        locked += [(row[0], row[1]) for row in rows]
    return locked


async def _rows(link: Link, statement: sa.Select[Any]) -> list[tuple[Any, ...]]:
    """The rows of a locking read, as tuples, guarded as every repository statement is."""
    async with guarded(link):
        return [tuple(row) for row in await link.execute(statement)]
