"""Tenants against a model: random interleavings of three tenants' calls keep each tenant's view its own.

Each example gives three fresh tenants random operations (create an agent
with a name from a small pool, create a keyed session, append, trim, delete an
agent, add a passage, search passages by text), each aimed at ids taken from
the model of a random tenant: the caller's own ids work, another tenant's
(under the same names and keys) fail as unknown ids do.  After every step,
each tenant's view through the repositories (agents by name, sessions per
agent, message contents per session, passage texts per agent) equals its
own plain-Python model.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memorm import ConflictError, Database, NotFoundError
from memorm.uow import UnitOfWork

pytestmark = pytest.mark.anyio

NAMES = ("sam", "sam", "max")  # repeats weigh the draw toward rows that exist
KEYS = ("k1", "k1", "k2")
WORDS = ("apple", "pear")
TENANT = st.integers(0, 2)
# Whose ids an operation uses: the caller's own (0), or the next tenant's, or the one after.
SOURCE = st.sampled_from([0, 0, 0, 1, 2])


def _operation(kind: str, arg: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[Any, ...]]:
    return st.tuples(st.just(kind), TENANT, SOURCE, st.sampled_from(NAMES), arg)


OPERATION = st.one_of(
    _operation("create_agent", st.none()),
    _operation("create_session", st.sampled_from(KEYS)),
    _operation("append", st.sampled_from(KEYS)),
    _operation("trim", st.sampled_from(KEYS)),
    _operation("delete_agent", st.none()),
    _operation("add_passage", st.sampled_from(WORDS)),
    _operation("search_text", st.sampled_from(WORDS)),
)

View = dict[str, tuple[uuid.UUID, dict[str, list[str | None]], list[str]]]


@dataclass
class Tenant:
    """One tenant's data as plain Python: what its view must show."""

    name: str
    agents: dict[str, uuid.UUID] = field(default_factory=dict)
    sessions: dict[tuple[str, str], uuid.UUID] = field(default_factory=dict)  # (agent name, key)
    messages: dict[uuid.UUID, list[str | None]] = field(default_factory=dict)  # per session
    passages: dict[str, list[str]] = field(default_factory=dict)  # per agent name

    def view(self) -> View:
        return {
            name: (
                agent,
                {key: self.messages[chat] for (owner, key), chat in self.sessions.items() if owner == name},
                sorted(self.passages[name]),
            )
            for name, agent in self.agents.items()
        }

    def drop(self, name: str) -> None:
        del self.agents[name]
        del self.passages[name]
        for pair in [pair for pair in self.sessions if pair[0] == name]:
            del self.messages[self.sessions.pop(pair)]


async def view_of(db: Database, tenant: str) -> View:
    """The tenant's view through the repositories."""
    found: View = {}
    async with db.unit_of_work(tenant, read_only=True) as uow:
        for agent in (await uow.agents.list(limit=100)).items:
            chats = {
                str(chat.key): [m.content for m in await uow.messages.window(chat.id, limit=100)]
                for chat in (await uow.sessions.list(agent.id, limit=100)).items
            }
            texts = sorted(p.text for p in (await uow.passages.list(agent.id, limit=100)).items)
            found[agent.name] = (agent.id, chats, texts)
    return found


def refusal(kind: str, name: str, key: str | None, mine: Tenant, own: bool) -> tuple[type, str] | None:
    """The error the operation must raise (class, message pattern), if any: others' ids are unknown ones."""
    if kind == "create_agent":
        return (ConflictError, f"an agent named '{name}' exists") if name in mine.agents else None
    if kind in ("append", "trim"):
        return None if own and (name, key) in mine.sessions else (NotFoundError, "^no session ")
    if not (own and name in mine.agents):
        return NotFoundError, "^no agent "
    if kind == "create_session" and (name, key) in mine.sessions:
        return ConflictError, "key"
    return None


async def run(db: Database, step: tuple[Any, ...], mine: Tenant, theirs: Tenant, text: str) -> None:
    """One operation in a unit of work of `mine`, on ids from `theirs`' model; `mine` follows it."""
    async with db.for_tenant(mine.name).unit_of_work() as uow:
        await _run(uow, step, mine, theirs, text)


async def _run(uow: UnitOfWork, step: tuple[Any, ...], mine: Tenant, theirs: Tenant, text: str) -> None:
    kind, _, _, name, arg = step
    agent = theirs.agents.get(name, uuid.uuid4())  # another tenant's id, or an unknown one
    chat = theirs.sessions.get((name, arg), uuid.uuid4())
    calls = {
        "create_agent": lambda: uow.agents.create(name),
        "create_session": lambda: uow.sessions.create(agent, key=arg),
        "append": lambda: uow.messages.append(chat, {"role": "user", "content": text}),
        "trim": lambda: uow.messages.trim(chat, keep_last=1),
        "delete_agent": lambda: uow.agents.delete(agent),
        "add_passage": lambda: uow.passages.add(agent, f"{arg} {text}", [1.0, 0.0]),
        "search_text": lambda: uow.passages.search_text(agent, arg, limit=100),
    }
    refused = refusal(kind, name, arg, mine, mine is theirs)
    if refused is not None:
        error, pattern = refused
        with pytest.raises(error, match=pattern) as raised:
            await calls[kind]()
        if error is NotFoundError:  # exactly as for an unknown id
            assert str(raised.value) in (f"no agent {agent}", f"no session {chat}")
        return
    done = await calls[kind]()
    if kind == "create_agent":
        mine.agents[name] = done.id
        mine.passages[name] = []
    elif kind == "create_session":
        mine.sessions[(name, arg)] = done.id
        mine.messages[done.id] = []
    elif kind == "append":
        mine.messages[chat].append(text)
    elif kind == "trim":
        log = mine.messages[chat]
        assert done == max(0, len(log) - 1)
        del log[:-1]
    elif kind == "delete_agent":
        mine.drop(name)
    elif kind == "add_passage":
        mine.passages[name].append(f"{arg} {text}")
    else:
        assert sorted(p.text for p in done.items) == sorted(t for t in mine.passages[name] if arg in t)


@given(steps=st.lists(OPERATION, min_size=1, max_size=12))
async def test_each_tenants_view_follows_its_own_model(db: Database, steps: list[tuple[Any, ...]]) -> None:
    run_id = uuid.uuid4().hex[:8]  # the examples share the database: fresh tenants each time
    tenants = [Tenant(f"t{index}-{run_id}") for index in range(3)]
    for tenant in tenants:  # each starts with the same names and keys: "sam" with a session "k1"
        await run(db, ("create_agent", 0, 0, "sam", None), tenant, tenant, "")
        await run(db, ("create_session", 0, 0, "sam", "k1"), tenant, tenant, "")
    for number, step in enumerate(steps):
        mine, theirs = tenants[step[1]], tenants[(step[1] + step[2]) % 3]
        await run(db, step, mine, theirs, f"m{number}")
        for tenant in tenants:
            assert await view_of(db, tenant.name) == tenant.view(), (
                f"{tenant.name} after step {number}: {step}"
            )
