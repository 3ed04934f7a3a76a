"""`uow.agents`: agents, their core memory, optimistic versioning."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from memorm.errors import ConflictError, NotFoundError, ValidationError
from memorm.models import AGENT_NAMES, AGENTS, MESSAGES, PASSAGES, SESSIONS, Agent, AgentName
from memorm.page import Page
from memorm.removal import Removed
from memorm.repositories.base import Repository
from memorm.repositories.message_retention import with_answers
from memorm.repositories.session_locks import lock_sessions
from memorm.search.filters import Filter, filter_conditions
from memorm.search.fts_ddl import MESSAGES_FTS, PASSAGES_FTS
from memorm.search.text import merge_deleted
from memorm.types import utcnow
from memorm.validation import (
    as_uuid,
    check_duration,
    check_flag,
    check_int,
    check_json_object,
    check_name,
    check_text,
)

__all__ = ["AgentRepository"]

_UPDATABLE = ("name", "system", "core_memory", "llm_config", "meta", "retention")


def _check_core_memory(value: object) -> dict[str, str]:
    memory = check_json_object(value, "core_memory")
    for label, text in memory.items():
        check_text(text, f"core_memory.{label}")
    return memory


def _check_changes(changes: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(changes) - set(_UPDATABLE))
    if unknown:
        raise ValidationError(f"cannot update {', '.join(unknown)}; updatable: {', '.join(_UPDATABLE)}")
    checked: dict[str, Any] = {}
    for key, value in changes.items():
        if key == "name":
            checked[key] = check_name(value, "name")
        elif key == "system":
            checked[key] = check_text(value, "system")
        elif key == "core_memory":
            checked[key] = _check_core_memory(value)
        elif key == "retention":
            checked[key] = _check_retention(value)
        else:
            checked[key] = check_json_object(value, key)
    return checked


def _check_retention(value: object) -> int | None:
    """A retention as whole seconds (a `timedelta` or a number), or None."""
    if value is None:
        return None
    span = check_duration(value, "retention")
    if span % timedelta(seconds=1):
        raise ValidationError(f"retention: expected whole seconds, got {span}")
    return int(span.total_seconds())


def _check_version(expected_version: object) -> int | None:
    # ``version`` is a 32-bit column: a larger number could only fail in the database.
    return None if expected_version is None else check_int(expected_version, "expected_version")


class AgentRepository(Repository):
    """Agents: create, read, page, update (optimistically versioned), delete."""

    async def create(
        self,
        name: str,
        *,
        system: str = "",
        core_memory: Mapping[str, str] | None = None,
        llm_config: Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
        retention: timedelta | int | None = None,
    ) -> Agent:
        """Create an agent; its `name` must be unique (`ConflictError` otherwise).

        `system` is the agent's prompt, kept on the agent: no session gets it
        as a message (write it into one with
        [`replace_system`][memorm.repositories.MessageRepository.replace_system]).
        `retention` (a `timedelta` or whole seconds) is how long the
        agent's new sessions live unless created with their own `ttl`.
        """
        agent = Agent(
            tenant=self._required_tenant,
            name=check_name(name, "name"),
            system=check_text(system, "system"),
            core_memory=_check_core_memory(core_memory),
            llm_config=check_json_object(llm_config, "llm_config"),
            meta=check_json_object(meta, "meta"),
            retention=_check_retention(retention),
        )
        async with self._savepoint({"name": agent.name}):
            self.session.add(agent)
            self.session.add(AgentName(tenant=agent.tenant, name=agent.name, agent_id=agent.id))
            await self.session.flush()
        return agent

    async def get(self, agent_id: uuid.UUID | str) -> Agent:
        """The agent with this id; `NotFoundError` if there is none."""
        key = as_uuid(agent_id, "agent_id")
        agent = await self._scalar(sa.select(Agent).where(AGENTS.c.id == key, *self._tenant_filter(AGENTS)))
        if agent is None:
            raise NotFoundError(f"no agent {key}")
        result: Agent = agent
        return result

    async def get_by_name(self, name: str) -> Agent | None:
        """The agent called `name`, or None."""
        # The name's row first: on a distributed database it is one lookup, and the
        # agent is then read on its own shard.
        named = sa.select(AGENT_NAMES.c.agent_id).where(
            *self._tenant_filter(AGENT_NAMES), AGENT_NAMES.c.name == check_text(name, "name")
        )
        agent_id = await self._scalar(named)
        if agent_id is None:
            return None
        agent: Agent | None = await self._scalar(
            sa.select(Agent).where(AGENTS.c.id == agent_id, *self._tenant_filter(AGENTS))
        )
        return agent

    async def list(self, *, limit: int = 50, offset: int = 0) -> Page[Agent]:
        """Agents, oldest first."""
        query = sa.select(Agent).where(*self._tenant_filter(AGENTS)).order_by(AGENTS.c.id)
        return await self._page(query, limit=limit, offset=offset)

    async def update(
        self,
        agent_id: uuid.UUID | str,
        *,
        expected_version: int | None = None,
        **changes: Any,
    ) -> Agent:
        """Change `name`, `system`, `core_memory`, `llm_config`, `meta` or `retention`.

        Every update bumps `version`.  With `expected_version`, the update
        happens only if the agent is still at that version, else `ConflictError`.
        """
        key = as_uuid(agent_id, "agent_id")
        version = _check_version(expected_version)
        return await self._write(key, version, _check_changes(changes))

    async def update_core_memory(
        self,
        agent_id: uuid.UUID | str,
        label: str,
        value: str,
        *,
        expected_version: int | None = None,
    ) -> Agent:
        """Set one block of core memory (`label` -> `value`), bumping `version`."""
        key = as_uuid(agent_id, "agent_id")
        version = _check_version(expected_version)
        label = check_text(label, "label") or ""
        if not label:
            raise ValidationError("label: a core memory block needs a name")
        text = check_text(value, f"core_memory.{label}")
        current = await self._scalar(
            sa.select(Agent)
            .where(AGENTS.c.id == key, *self._tenant_filter(AGENTS))
            .with_for_update()
            .execution_options(populate_existing=True)
        )
        if current is None:
            raise NotFoundError(f"no agent {key}")
        if version is not None and current.version != version:
            raise ConflictError(f"agent {key} is at version {current.version}, not {version}")
        memory = {**current.core_memory, label: text}
        return await self._write(key, current.version, {"core_memory": memory})

    async def _write(self, key: uuid.UUID, version: int | None, values: dict[str, Any]) -> Agent:
        statement = (
            sa.update(Agent)
            .where(AGENTS.c.id == key, *self._tenant_filter(AGENTS))
            .values(**values, version=AGENTS.c.version + 1, updated_at=utcnow())
            .returning(Agent)
            .execution_options(populate_existing=True, synchronize_session=False)
        )
        if version is not None:
            statement = statement.where(AGENTS.c.version == version)
        async with self._savepoint(values):  # a rename may take a name in use
            agent: Agent | None = (await self.session.execute(statement)).scalars().first()
            if agent is not None and "name" in values:
                await self.session.execute(
                    sa.update(AGENT_NAMES)
                    .where(*self._tenant_filter(AGENT_NAMES), AGENT_NAMES.c.agent_id == key)
                    .values(name=values["name"])
                )
        if agent is None:
            exists = await self._scalar(
                sa.select(AGENTS.c.version).where(AGENTS.c.id == key, *self._tenant_filter(AGENTS))
            )
            if exists is None:
                raise NotFoundError(f"no agent {key}")
            raise ConflictError(f"agent {key} is at version {exists}, not {version}")
        return agent

    async def delete(self, agent_id: uuid.UUID | str) -> None:
        """Delete the agent with its sessions, messages and passages."""
        key = as_uuid(agent_id, "agent_id")
        self._archive_changed(key)  # its cached vectors go too
        deleted = await self._rowcount(
            sa.delete(Agent)
            .where(AGENTS.c.id == key, *self._tenant_filter(AGENTS))
            .execution_options(synchronize_session=False)
        )
        if deleted == 0:
            raise NotFoundError(f"no agent {key}")
        await self._execute(
            sa.delete(AGENT_NAMES).where(*self._tenant_filter(AGENT_NAMES), AGENT_NAMES.c.agent_id == key)
        )

    async def forget(self, where: Filter, *, dry_run: bool = False) -> Removed:
        """Erase every agent, session, message and passage whose `meta` matches `where`.

        For a person's request to be forgotten: `forget({"user_id": "u42"})`.
        `where` is a filter as in archival search (at least one `meta` key;
        `$in` lists and a `created_at` range may narrow it).  A matching
        agent goes with all its sessions, messages and passages; a matching
        session with all its messages; a matching message with its tool
        answers (as in [`delete_before`][memorm.repositories.MessageRepository.delete_before]),
        whatever their own `meta`.  The full-text indexes lose the
        deleted text too (on SQLite the index is merged, so not even its
        segments hold it) and vector caches drop the deleted vectors.  Returns
        the counts removed (with `dry_run`, that would be; nothing changes).

        The rows are gone for every query once this unit of work commits; to
        clear what the files still hold (Postgres dead rows, the SQLite WAL),
        run [`memorm.Database.scrub`][memorm.db.Database.scrub] after it.
        """
        check_flag(dry_run, "dry_run")
        if not isinstance(where, Mapping) or not any(key != "created_at" for key in where):
            raise ValidationError("where: forget needs at least one meta key, such as {'user_id': 'u42'}")
        # Rows are matched by (tenant, id): in an all-tenants unit of work the
        # same id may name rows of two tenants.
        scope = self._tenant_filter_if_any
        agents = sa.select(AGENTS.c.tenant, AGENTS.c.id).where(
            *scope(AGENTS), *await filter_conditions(self.link, AGENTS, where)
        )
        tagged = {
            table.name: sa.and_(*scope(table), *await filter_conditions(self.link, table, where))
            for table in (SESSIONS, MESSAGES, PASSAGES)
        }
        # Sessions and messages are matched with their agent too: on Citus, a join on the shard key.
        sessions = sa.select(SESSIONS.c.tenant, SESSIONS.c.id, SESSIONS.c.agent_id).where(
            *scope(SESSIONS),
            sa.or_(sa.tuple_(SESSIONS.c.tenant, SESSIONS.c.agent_id).in_(agents), tagged["sessions"]),
        )
        # A deleted tool call takes its answers, which hold what the call fetched about the person.
        messages = sa.and_(
            *scope(MESSAGES),
            with_answers(
                sa.or_(
                    sa.tuple_(MESSAGES.c.tenant, MESSAGES.c.session_id, MESSAGES.c.agent_id).in_(sessions),
                    tagged["messages"],
                )
            ),
        )
        passages = sa.and_(
            *scope(PASSAGES),
            sa.or_(
                sa.tuple_(PASSAGES.c.tenant, PASSAGES.c.agent_id).in_(agents), tagged["archival_passages"]
            ),
        )
        if dry_run:
            return Removed(
                agents=await self._count(agents),
                sessions=await self._count(sessions),
                messages=await self._count(sa.select(MESSAGES.c.id).where(messages)),
                passages=await self._count(sa.select(PASSAGES.c.id).where(passages)),
            )
        # Every agent whose archive changes: bump its version and drop its cached vectors.
        changes = sa.select(PASSAGES.c.tenant, PASSAGES.c.agent_id).where(passages).distinct()
        owners = set(await self._two_column_rows(changes))
        doomed = await self._two_column_rows(agents)
        self._archives_changed([*owners, *doomed])
        # Lock as writers do, parents first (agents, then sessions, then their rows), so
        # a concurrent trim or delete_many queues behind this instead of deadlocking.
        changed = sorted(owners.union(doomed))
        if changed:
            await self._execute(
                sa.update(AGENTS)
                .where(*scope(AGENTS), sa.tuple_(AGENTS.c.tenant, AGENTS.c.id).in_(changed))
                .values(archive_version=AGENTS.c.archive_version + 1)
            )
        in_sessions = sa.tuple_(SESSIONS.c.tenant, SESSIONS.c.id, SESSIONS.c.agent_id).in_(sessions)
        await lock_sessions(self.link, *scope(SESSIONS), in_sessions)
        removed = Removed(
            messages=await self._rowcount(sa.delete(MESSAGES).where(messages)),
            passages=await self._rowcount(sa.delete(PASSAGES).where(passages)),
            sessions=await self._rowcount(sa.delete(SESSIONS).where(*scope(SESSIONS), in_sessions)),
            agents=await self._rowcount(
                sa.delete(AGENTS).where(*scope(AGENTS), sa.tuple_(AGENTS.c.tenant, AGENTS.c.id).in_(doomed))
            )
            if doomed
            else 0,
        )
        if doomed:
            names = sa.tuple_(AGENT_NAMES.c.tenant, AGENT_NAMES.c.agent_id).in_(doomed)
            await self._execute(sa.delete(AGENT_NAMES).where(*scope(AGENT_NAMES), names))
        for index, count in ((MESSAGES_FTS, removed.messages), (PASSAGES_FTS, removed.passages)):
            if count:
                await merge_deleted(self.link, index)
        return removed
