"""What every repository shares: its connection (`Link`), error translation, paging."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Result
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql import ColumnElement, Executable, Select

from memorm.conflicts import conflict_message, unique_key_of
from memorm.errors import ConflictError, NotFoundError, ValidationError
from memorm.link import Link
from memorm.models import AGENTS, MESSAGES, SESSIONS
from memorm.page import Page
from memorm.routing import SessionAgents
from memorm.tenancy import DEFAULT_TENANT
from memorm.translate import check_writable, guarded
from memorm.validation import check_limit

__all__ = ["Repository"]

T = TypeVar("T")


class Repository:
    """Base of the repositories: runs statements on the unit of work's connection (`Link`).

    `tenant` is the unit of work's tenant, whose rows alone every statement
    reads and writes; None in an all-tenants unit of work, where only the
    maintenance operations (purges, `forget`) run, across every tenant.
    """

    def __init__(self, link: Link, tenant: str | None = DEFAULT_TENANT) -> None:
        self.link = link
        self.tenant = tenant

    @property
    def session(self) -> AsyncSession:
        """The unit of work's ORM session (made on first use: prefer `link`'s Core paths)."""
        return self.link.session

    def _tenant_filter(self, *tables: sa.Table) -> list[ColumnElement[bool]]:
        """Conditions keeping `tables` to the unit of work's tenant.

        An all-tenants unit of work cannot run the operation: ids are
        unique only within a tenant, and a new row needs an owner.
        """
        if self.tenant is None:
            raise ValidationError(
                "an all-tenants unit of work only runs maintenance (purges, forget); "
                "open db.unit_of_work(tenant=...) for this"
            )
        return [table.c.tenant == self.tenant for table in tables]

    def _tenant_filter_if_any(self, *tables: sa.Table) -> list[ColumnElement[bool]]:
        """Like `_tenant_filter`, but none in an all-tenants unit of work: for maintenance across tenants."""
        return [] if self.tenant is None else [table.c.tenant == self.tenant for table in tables]

    async def _agent_of(self, session_id: uuid.UUID) -> uuid.UUID:
        """The session's agent, to narrow the statements on its messages by (`memorm.routing`).

        Known if this database created or read the session before; else looked
        up once by the session's key (NotFoundError if there is none) and
        remembered.  The messages' indexes lead with `(tenant, agent_id)`: a
        statement on a session's messages without its agent would read all of
        the tenant's.
        """
        agent = self._session_agents.get(self._required_tenant, session_id)
        return agent if agent is not None else await self._look_up_agent(session_id)

    async def _row_agent(self, session_id: uuid.UUID) -> uuid.UUID | None:
        """The session's agent, for a statement on the session's own row (its primary key finds it).

        Left out (None) if unknown, except on a distributed database, where it
        also picks the shard and so is looked up like `_agent_of`.
        """
        agent = self._session_agents.get(self._required_tenant, session_id)
        if agent is None and self._distributed:
            return await self._look_up_agent(session_id)
        return agent

    async def _look_up_agent(self, session_id: uuid.UUID) -> uuid.UUID:
        agent: uuid.UUID | None = await self._scalar(
            sa.select(SESSIONS.c.agent_id).where(*self._tenant_filter(SESSIONS), SESSIONS.c.id == session_id)
        )
        if agent is None:
            raise NotFoundError(f"no session {session_id}")
        self._session_agents.put(self._required_tenant, session_id, agent)
        return agent

    @property
    def _session_agents(self) -> SessionAgents:
        """The database's cache of sessions' agents (every unit of work's link holds it)."""
        routes = self.link.state.routes
        return routes

    def _remember_agent(self, session_id: uuid.UUID, agent_id: uuid.UUID) -> None:
        """Remember a session's agent (sessions created or read)."""
        if self.tenant is not None:
            self._session_agents.put(self.tenant, session_id, agent_id)

    async def _session_messages(self, session_id: uuid.UUID) -> list[ColumnElement[bool]]:
        """The conditions for the session's messages: its tenant, the session and its agent."""
        agent = await self._agent_of(session_id)
        return [
            *self._tenant_filter(MESSAGES),
            MESSAGES.c.session_id == session_id,
            MESSAGES.c.agent_id == agent,
        ]

    async def _session_row(self, session_id: uuid.UUID) -> list[ColumnElement[bool]]:
        """The conditions for the session's own row: its tenant, its id and (if known) its agent."""
        agent = await self._row_agent(session_id)
        return [
            *self._tenant_filter(SESSIONS),
            SESSIONS.c.id == session_id,
            *self._agent_filter_if_known(SESSIONS, agent),
        ]

    def _forget_agent(self, session_id: uuid.UUID) -> None:
        """Forget a deleted session's agent."""
        if self.tenant is not None:
            self._session_agents.drop(self.tenant, session_id)

    @property
    def _distributed(self) -> bool:
        """Whether the tables are sharded by agent (Citus): a few statements must then stay on one shard."""
        return self.link.state.distributed

    @staticmethod
    def _agent_filter_if_known(table: sa.Table, agent: uuid.UUID | None) -> list[ColumnElement[bool]]:
        """A condition on `table`'s agent when it is known (it routes to one shard)."""
        return [] if agent is None else [table.c.agent_id == agent]

    @property
    def _required_tenant(self) -> str:
        """The tenant new rows get (`ValidationError` in an all-tenants unit of work)."""
        self._tenant_filter()
        assert self.tenant is not None
        return self.tenant

    async def _execute(self, statement: Executable, params: Any = None) -> Result[Any]:
        if getattr(statement, "is_dml", False):
            check_writable(self.link)
        async with guarded(self.link):
            return await self.link.execute(statement, params)

    async def _two_column_rows(self, statement: Executable) -> list[tuple[Any, Any]]:
        """The rows of a two-column query, as tuples (`(tenant, id)`, say)."""
        return [(row[0], row[1]) for row in (tuple(found) for found in await self._execute(statement))]

    async def _scalar(self, statement: Executable) -> Any:
        async with guarded(self.link):
            return (await self.link.execute(statement)).scalar()

    async def _rowcount(self, statement: Executable) -> int:
        """Run an INSERT, UPDATE or DELETE; how many rows it changed."""
        result = await self._execute(statement)
        return int(result.rowcount)  # type: ignore[attr-defined]

    async def _count(self, query: Select[Any]) -> int:
        """How many rows `query` returns."""
        counted = query.order_by(None).subquery()
        return int(await self._scalar(sa.select(sa.func.count()).select_from(counted)) or 0)

    async def _require_agent(self, key: uuid.UUID) -> None:
        """`NotFoundError` unless the agent exists."""
        if (
            await self._scalar(sa.select(AGENTS.c.id).where(AGENTS.c.id == key, *self._tenant_filter(AGENTS)))
            is None
        ):
            raise NotFoundError(f"no agent {key}")

    def _archive_changed(self, *agent_ids: uuid.UUID) -> None:
        """Note agents of this tenant whose archival passages this unit of work changed (or deleted).

        Vector caches bypass them until the commit, which then evicts them.
        """
        self._archives_changed((self._required_tenant, agent_id) for agent_id in agent_ids)

    def _archives_changed(self, agents: Iterable[tuple[str, uuid.UUID]]) -> None:
        """`_archive_changed` for `(tenant, agent id)`s, of any tenant."""
        self.link.state.archive_writes.update(agents)

    @asynccontextmanager
    async def _savepoint(self, written: Mapping[str, Any] | None = None) -> AsyncIterator[None]:
        """Run a write that may break a constraint without poisoning the transaction.

        On Postgres a failed statement aborts the whole transaction; inside a
        SAVEPOINT only the savepoint is lost, so a caller that catches the
        `ConflictError` can carry on with the unit of work.  `written`: the
        row's values, which a `ConflictError` then names (`an agent named 'sam' exists`).
        """
        check_writable(self.link)
        async with guarded(self.link):
            await self.link.ready()  # on the driver, where a dead connection can still be swapped
        try:
            async with guarded(self.link, recoverable=True), self.session.begin_nested():
                yield
        except ConflictError as error:
            key = unique_key_of(error)
            if key is None or written is None or not set(key[1]) <= set(written):
                raise
            values = {column: written[column] for column in key[1]}
            raise ConflictError(conflict_message(key, values)) from error.__cause__

    async def _page(self, query: Select[Any], *, limit: int, offset: int) -> Page[Any]:
        """One page of `query` (already ordered) with its true total."""
        check_limit(limit, offset)
        total = await self._count(query)
        items = list((await self._execute(query.limit(limit).offset(offset))).scalars())
        return Page(items=items, total=total, limit=limit, offset=offset)
