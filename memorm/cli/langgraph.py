"""`memorm import-langgraph SOURCE --agent NAME`: a LangGraph checkpoint database into memorm.

SOURCE is what langgraph-checkpoint-sqlite (a file) or -postgres (a URL)
wrote; `memorm.cli.langgraph_source` checks and opens it read-only, and
[`copy_checkpoints`][memorm.compat.langgraph.copy_checkpoints] stores each
thread as a session of the agent, in the tenant given, with a progress bar
per kind of row.  Everything that can be refused (the source, a value in
it naming a callable not allowed, the target's schema, the agent) is,
before the first write.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from memorm.cli.graph_types import add_allow_type_option
from memorm.cli.tenant_option import tenant_name

if TYPE_CHECKING:
    from memorm.db import Database
    from memorm.models import Agent

__all__ = ["register"]


def _plural(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"


async def _agent(db: Database, name_or_id: str, tenant: str, *, create: bool) -> Agent:
    """The agent called (or with the id) `name_or_id` in `tenant`; made when `create` and missing."""
    import uuid

    from memorm.errors import NotFoundError

    try:
        agent_id: uuid.UUID | None = uuid.UUID(name_or_id)
    except ValueError:
        agent_id = None
    async with db.unit_of_work() as uow:
        if agent_id is not None:
            try:
                return await uow.agents.get(agent_id)
            except NotFoundError:
                raise NotFoundError(f"no agent with id {agent_id} in tenant {tenant!r}") from None
        found = await uow.agents.get_by_name(name_or_id)
        if found is not None:
            return found
        if not create:
            raise NotFoundError(
                f"no agent named {name_or_id!r} in tenant {tenant!r} (give --create to make it)"
            )
        return await uow.agents.create(name_or_id)


async def _import_langgraph(args: argparse.Namespace) -> int:
    from memorm.cli.langgraph_source import open_source
    from memorm.cli.open_database import open_database
    from memorm.cli.progress import Bars, progress_bar
    from memorm.compat.langgraph import MemormSaver, copy_checkpoints

    tenant = args.tenant or "default"
    # The source first: a file that is not LangGraph's touches no memorm database.
    async with (
        open_source(args.source, allowed_types=args.allow_type) as (source, counts),
        open_database(args.url) as db,
    ):
        await db.check_schema()
        view = db.for_tenant(tenant)
        agent = await _agent(view, args.agent, tenant, create=args.create)
        with progress_bar() as progress:
            bars = Bars(progress)
            bars.start("checkpoints", counts.checkpoints)
            bars.start("writes", counts.writes)
            copied = await copy_checkpoints(source, MemormSaver(view, agent=agent.id), reporter=bars)
    writes = bars.done.get("writes", 0)
    print(
        f"copied {_plural(copied, 'checkpoint')} ({_plural(writes, 'pending write')}) "
        f"of {_plural(counts.threads, 'thread')} into agent {agent.name!r} of tenant {tenant!r}"
    )
    return 0


def register(commands: Any) -> None:
    command = commands.add_parser(
        "import-langgraph",
        help="copy a langgraph-checkpoint-sqlite/-postgres database into memorm (re-runnable)",
        description="Copy every thread of a LangGraph checkpoint database (checkpoints, their channel "
        "values and pending writes) into memorm: each thread becomes a session of the agent, keyed "
        "by its thread id, read by memorm.compat.langgraph.MemormSaver. The source is opened "
        "read-only; copying again stores nothing new.",
    )
    command.add_argument(
        "source",
        metavar="SOURCE",
        help="a langgraph-checkpoint-sqlite file (path or sqlite:/// URL), or a "
        "langgraph-checkpoint-postgres database (postgresql:// URL; needs that package and psycopg)",
    )
    command.add_argument("--agent", required=True, metavar="NAME_OR_ID", help="the memorm agent (name or id)")
    command.add_argument("--create", action="store_true", help="create the agent if none has that name")
    command.add_argument(
        "--tenant", type=tenant_name, metavar="NAME", help="the agent's tenant (default: 'default')"
    )
    command.add_argument("--url", help="memorm's database URL")
    add_allow_type_option(command)
    command.set_defaults(handler=_import_langgraph)
