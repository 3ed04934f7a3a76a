"""The agent a LangGraph saver or store keeps its rows in: the one given, or a default one.

`MemormSaver(db)` and `MemormStore(db)` without `agent=` use the agent named
`DEFAULT_AGENT` of the database (or of the view's tenant), looked up by the
first call that needs it and made by the first write; reads before then find
nothing and make nothing.
"""

from __future__ import annotations

import uuid

from memorm.db import Database
from memorm.errors import ConflictError, NotFoundError
from memorm.models import Agent
from memorm.validation import as_uuid

__all__ = ["DEFAULT_AGENT", "AgentRef"]

DEFAULT_AGENT = "langgraph"
"""The agent whose rows a saver or store keeps when it is given none (made by its first write)."""


class AgentRef:
    """A saver's or store's agent: its id once given or found.

    Args:
        agent: the agent (or its id); None for the default one.
        owner: what holds it, as errors name it ("saver", "store").
    """

    def __init__(self, agent: Agent | uuid.UUID | str | None, owner: str) -> None:
        self.known = (
            None if agent is None else as_uuid(agent.id if isinstance(agent, Agent) else agent, "agent")
        )
        self._owner = owner

    def __str__(self) -> str:
        return str(self.known or DEFAULT_AGENT)

    @property
    def id(self) -> uuid.UUID:
        """The agent's id.

        Raises:
            NotFoundError: no agent was given, and no call has yet found or
                made the default one.
        """
        if self.known is None:
            raise NotFoundError(f"no agent {DEFAULT_AGENT!r} yet: this {self._owner}'s first write makes it")
        return self.known

    async def find(self, db: Database, *, make: bool = False) -> uuid.UUID | None:
        """The agent's id: the default one looked up in `db` (made if missing and `make`), or None."""
        if self.known is None:
            self.known = await _named(db, make=make)
        return self.known


async def _named(db: Database, *, make: bool) -> uuid.UUID | None:
    """The id of `db`'s agent named `DEFAULT_AGENT` (of its tenant); made if missing and `make`."""
    found = await _look_up(db)
    if found is not None or not make:
        return found
    try:
        async with db.unit_of_work() as uow:
            return (await uow.agents.create(DEFAULT_AGENT)).id
    except ConflictError:  # another saver or store made it meanwhile: that one
        found = await _look_up(db)
        if found is None:  # made and deleted again meanwhile
            raise
        return found


async def _look_up(db: Database) -> uuid.UUID | None:
    async with db.unit_of_work(read_only=True) as uow:
        agent = await uow.agents.get_by_name(DEFAULT_AGENT)
    return None if agent is None else agent.id
