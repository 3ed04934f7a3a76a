"""Tenant isolation through the whole public API: tenant B can neither see nor change tenant A.

Three scenes: SQLite, Postgres as a superuser (the repositories alone keep
tenants apart, as on SQLite) and Postgres as an application role made by
`memorm.tenants.create_role`, where row-level security runs under them too.

* Every public method of the four repositories (listed by introspection: a
  new method without a probe fails the suite) runs in a unit of work of
  tenant B, once with tenant A's ids, names and keys and once with fresh
  random ones: the outcomes must be the same (the same error and message,
  the id substituted, or equally empty results).  Writes that create rows
  under A's ids, names or keys succeed in B without a conflict, and B's
  maintenance (`purge_expired`, `forget`) does not reach A.  Every row of A
  hashes the same before and after, and A's searches (full-text index,
  vector cache) answer as before.
* Tenant B then holds copies of A's rows under the same ids: B's write paths
  change B's copies as expected and leave A's rows byte for byte, and so do
  maintenance across tenants (`forget`, `purge_expired`) and `delete_tenant`.

Counts of methods and calls go to `.bench/reliability-tenancy-<scene>.json`.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, fields, is_dataclass, replace
from datetime import date, datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import Store, app_role, usable_engine

from memorm import Database, MemormError
from memorm.models import AGENTS, EMBEDDING_MODELS, MESSAGES, PASSAGES, SESSIONS
from memorm.models import fields as model_fields
from memorm.page import Page
from memorm.repositories import AgentRepository, MessageRepository, PassageRepository, SessionRepository
from memorm.retention import Removed
from memorm.search.vector import ScoredPassage, index_name
from memorm.types import utcnow
from memorm.uow import UnitOfWork
from reliability.hostile_kit import BENCH

pytestmark = [pytest.mark.anyio, pytest.mark.reliability]

SCENES = [
    pytest.param("sqlite", marks=pytest.mark.sqlite),
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("postgres-app-role", marks=pytest.mark.postgres),
]
REPOSITORIES = {
    "agents": AgentRepository,
    "sessions": SessionRepository,
    "messages": MessageRepository,
    "passages": PassageRepository,
}
TABLES = (AGENTS, EMBEDDING_MODELS, SESSIONS, MESSAGES, PASSAGES)  # parents first
FUTURE = datetime(2200, 1, 1, tzinfo=timezone.utc)
SPAN = (date(2000, 1, 1), date(2199, 12, 31))
V3 = [1.0, 0.5, 0.25]
V2 = [0.5, 0.25]
VB = [0.1, 0.2, 0.9]
SYSTEM = "You are Sam."
CALL = [{"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]
SUMMARY: dict[str, dict[str, int]] = {}  # per scene: methods, probes, calls


# -- the scenes -------------------------------------------------------------------


@dataclass
class Scene:
    name: str
    owner: Database  # sees every tenant (SQLite, or a role bypassing row-level security): hashes, copies
    db: Database  # the application's database: every call under test goes through it


@pytest.fixture(params=SCENES)
def scene_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def engine(scene_name: str) -> str:
    """The engine conftest's `store` makes a database on."""
    return usable_engine("sqlite" if scene_name == "sqlite" else "postgres")


@pytest.fixture
async def scene(scene_name: str, store: Store) -> AsyncIterator[Scene]:
    if scene_name == "postgres-app-role":
        async with app_role(store) as (owner, app, _):
            yield Scene(scene_name, owner, app)
        return
    db = store.database()
    # Migrated, not create_all(): after create_all() a Postgres superuser is not known
    # to bypass row-level security, and all_tenants=True refuses it (see test_tenancy_rls).
    await db.upgrade()
    try:
        yield Scene(scene_name, db, db)
    finally:
        await db.dispose()


# -- tenant A's rows, and ids of the same kinds -----------------------------------


@dataclass(frozen=True)
class Ids:
    """Tenant A's ids, names and keys (or random ones of the same kinds)."""

    agent: uuid.UUID
    session: uuid.UUID
    old_session: uuid.UUID  # expired
    spare_session: uuid.UUID
    messages: tuple[uuid.UUID, ...]  # the keyed session's: system, user, tool call, tool answer, assistant
    passages: tuple[uuid.UUID, ...]  # two of `model` (3-d float32), two of `half_model` (2-d float16)
    agent_name: str = "sam"
    session_key: str = "chat-1"
    model: str = "minilm"
    half_model: str = "minilm-half"
    word: str = "zebra"
    user: str = "ada"  # meta["user_id"] of some of A's rows

    @property
    def meta(self) -> dict[str, str]:
        return {"user_id": self.user}

    def fresh(self) -> Ids:
        """Random ids, names and keys of the same kinds (and as many)."""
        token = uuid.uuid4().hex[:10]
        return replace(
            self,
            agent=uuid.uuid4(),
            session=uuid.uuid4(),
            old_session=uuid.uuid4(),
            spare_session=uuid.uuid4(),
            messages=tuple(uuid.uuid4() for _ in self.messages),
            passages=tuple(uuid.uuid4() for _ in self.passages),
            agent_name=f"name-{token}",
            session_key=f"key-{token}",
            model=f"model-{token}",
            half_model=f"half-{token}",
            word=f"word{token}",
            user=f"user-{token}",
        )

    def placeholders(self) -> dict[str, str]:
        """Each id, name and key as text, and the name it has in a normalised outcome."""
        found: dict[str, str] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            for index, each in enumerate(value if isinstance(value, tuple) else (value,)):
                found[str(each)] = f"<{item.name}{index if isinstance(value, tuple) else ''}>"
        return found


@dataclass(frozen=True)
class Own:
    """Tenant B's own rows, which probes use beside A's ids."""

    agent: uuid.UUID
    other: uuid.UUID
    session: uuid.UUID


async def fill_a(db: Database) -> Ids:
    """Tenant A: an agent with core memory, three sessions (one keyed with a tool call, one expired),
    passages of two embedding models (one float16), and meta that `forget` matches."""
    ada = {"user_id": "ada"}
    async with db.for_tenant("a").unit_of_work() as uow:
        agent = await uow.agents.create("sam", system=SYSTEM, core_memory={"human": "Ada", "persona": "Sam"})
        chat = await uow.sessions.create(agent.id, key="chat-1", title="first", meta=ada)
        log = await uow.messages.append(
            chat.id,
            [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": "my zebra is called Zed", "meta": ada},
                {"role": "assistant", "content": None, "tool_calls": CALL},
                {"role": "tool", "content": "zebra facts", "tool_call_id": "call_1"},
                {"role": "assistant", "content": "Zed is a fine zebra"},
            ],
        )
        old = await uow.sessions.create(agent.id, key="old", ttl=timedelta(seconds=1))
        await uow.messages.append(old.id, {"role": "user", "content": "an old zebra"})
        spare = await uow.sessions.create(agent.id, key="spare")
        await uow.messages.append(spare.id, {"role": "user", "content": "a spare zebra"})
        await uow.passages.define_model(agent.id, "minilm-half", 2, precision="float16")
        full = await uow.passages.add_many(
            agent.id,
            [
                {"text": "Ada keeps a zebra", "embedding": V3, "embedding_model": "minilm", "meta": ada},
                {"text": "Zed eats grass", "embedding": [0.2, 0.9, 0.1], "embedding_model": "minilm"},
            ],
        )
        half = await uow.passages.add_many(
            agent.id,
            [
                {"text": "zebra stripes", "embedding": V2, "embedding_model": "minilm-half"},
                {
                    "text": "a zebra in half",
                    "embedding": [0.125, 1.0],
                    "embedding_model": "minilm-half",
                    "meta": ada,
                },
            ],
        )
    return Ids(
        agent=agent.id,
        session=chat.id,
        old_session=old.id,
        spare_session=spare.id,
        messages=tuple(message.id for message in log),
        passages=tuple(passage.id for passage in [*full, *half]),
    )


async def fill_b(db: Database) -> Own:
    """Tenant B's own agents, session and passage, with nothing of A's names, keys or meta."""
    async with db.unit_of_work("b") as uow:
        agent = await uow.agents.create("b-own", core_memory={"human": "Bea"})
        other = await uow.agents.create("b-other")
        chat = await uow.sessions.create(agent.id, key="b-chat")
        await uow.messages.append(chat.id, {"role": "user", "content": "hello from b"})
        await uow.passages.add(
            agent.id, "b likes tea", V3, embedding_model="b-model", meta={"user_id": "bea"}
        )
    return Own(agent.id, other.id, chat.id)


async def tenant_hash(owner: Database, tenant: str) -> str:
    """A hash of every row of `tenant`: raw SELECTs of all five tables, ordered by id."""
    digest = hashlib.sha256()
    async with owner.unit_of_work(read_only=True, all_tenants=True) as uow:
        for table in TABLES:
            statement = sa.text(f"SELECT * FROM {table.name} WHERE tenant = :tenant ORDER BY id")
            rows = (await uow.session.execute(statement, {"tenant": tenant})).all()
            digest.update(repr(rows).encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


async def searches(db: Database, tenant: str, ids: Ids) -> list[Any]:
    """What the agent `ids.agent` of `tenant` finds: full-text and vector searches, and its log."""
    async with db.unit_of_work(tenant, read_only=True) as uow:
        messages = await uow.messages.search(ids.agent, "zebra", limit=100)
        passages = await uow.passages.search_text(ids.agent, "zebra", limit=100)
        near = await uow.passages.search(ids.agent, V3, embedding_model="minilm")
        half = await uow.passages.search(ids.agent, V2, embedding_model="minilm-half")
        log = await uow.messages.window(ids.session)
    return [
        [m.id for m in messages],
        [p.id for p in passages],
        [(hit.passage.id, hit.passage.text, round(hit.score, 3)) for hit in [*near, *half]],
        [(m.role, m.content) for m in log],
    ]


# -- probes: every public method, with A's ids and with random ones ---------------

READ, WRITE, UPKEEP, CREATE = range(4)  # the order probes run in: creations last
Call = Callable[[UnitOfWork, Ids, Own], Awaitable[Any]]


@dataclass(frozen=True)
class Probe:
    method: str  # "agents.get"
    call: Call
    phase: int
    empty: bool  # a result, if any, is empty (Page total 0, [], None, 0)


def _probe(phase: int, empty: bool = True) -> Callable[[str, Call], Probe]:
    return lambda method, call: Probe(method, call, phase, empty)


read, write, upkeep = _probe(READ), _probe(WRITE), _probe(UPKEEP)
told, create = _probe(READ, empty=False), _probe(CREATE, empty=False)


async def facts(made: Awaitable[Any], *names: str) -> list[tuple[Any, ...]]:
    """`(tenant, *names)` of each row made: what a creation's outcome is compared by."""
    found = await made
    rows = found if isinstance(found, list) else [found]
    return [(row.tenant, *(getattr(row, name) for name in names)) for row in rows]


async def rename_and_back(uow: UnitOfWork, x: Ids, own: Own) -> list[tuple[Any, ...]]:
    """B's agent may take A's agent's name (then gives it back)."""
    renamed = await facts(uow.agents.update(own.agent, name=x.agent_name), "name")
    await uow.agents.update(own.agent, name="b-own")
    return renamed


async def listed(uow: UnitOfWork, x: Ids, own: Own) -> tuple[int, list[tuple[Any, ...]]]:
    page = await uow.agents.list()
    return page.total, [(agent.tenant, agent.name) for agent in page.items]


async def indexed(uow: UnitOfWork, x: Ids, own: Own) -> bool:
    name = await uow.passages.ensure_index(x.model, 3)
    return name in ("", index_name(x.model, 3, "cosine"))  # SQLite builds nothing


def passages_of(x: Ids, model: str, dim: int, count: int) -> list[dict[str, Any]]:
    return [
        {"id": x.passages[i], "text": f"{x.word} {i}", "embedding": [1.0] * dim, "embedding_model": model}
        for i in range(count)
    ]


PROBES: list[Probe] = [
    # agents
    read("agents.get", lambda u, x, o: u.agents.get(x.agent)),
    read("agents.get_by_name", lambda u, x, o: u.agents.get_by_name(x.agent_name)),
    told("agents.list", listed),
    write("agents.update", lambda u, x, o: u.agents.update(x.agent, system="stolen")),
    write("agents.update", lambda u, x, o: u.agents.update(x.agent, expected_version=9, core_memory={})),
    Probe("agents.update", rename_and_back, WRITE, empty=False),
    write("agents.update_core_memory", lambda u, x, o: u.agents.update_core_memory(x.agent, "human", "Eve")),
    write(
        "agents.update_core_memory",
        lambda u, x, o: u.agents.update_core_memory(x.agent, "human", "Eve", expected_version=9),
    ),
    write("agents.delete", lambda u, x, o: u.agents.delete(x.agent)),
    upkeep("agents.forget", lambda u, x, o: u.agents.forget(x.meta, dry_run=True)),
    upkeep("agents.forget", lambda u, x, o: u.agents.forget(x.meta)),
    create("agents.create", lambda u, x, o: facts(u.agents.create(x.agent_name, meta=x.meta), "name")),
    # sessions
    read("sessions.get", lambda u, x, o: u.sessions.get(x.session)),
    read("sessions.get_by_key", lambda u, x, o: u.sessions.get_by_key(x.agent, x.session_key)),
    read("sessions.get_by_key", lambda u, x, o: u.sessions.get_by_key(o.agent, x.session_key)),
    read("sessions.list", lambda u, x, o: u.sessions.list(x.agent)),
    write("sessions.create", lambda u, x, o: u.sessions.create(x.agent, key=x.session_key)),
    write("sessions.get_or_create", lambda u, x, o: u.sessions.get_or_create(x.agent, x.session_key)),
    write("sessions.touch", lambda u, x, o: u.sessions.touch(x.session, ttl=60)),
    write("sessions.delete", lambda u, x, o: u.sessions.delete(x.session)),
    upkeep("sessions.purge_expired", lambda u, x, o: u.sessions.purge_expired(now=FUTURE, dry_run=True)),
    upkeep("sessions.purge_expired", lambda u, x, o: u.sessions.purge_expired(now=FUTURE)),
    create(
        "sessions.get_or_create",
        lambda u, x, o: facts(u.sessions.get_or_create(o.agent, x.session_key), "key", "agent_id"),
    ),
    create(
        "sessions.create",
        lambda u, x, o: facts(u.sessions.create(o.other, key=x.session_key), "key", "agent_id"),
    ),
    # messages
    read("messages.get", lambda u, x, o: u.messages.get(x.messages[1])),
    read("messages.window", lambda u, x, o: u.messages.window(x.session)),
    read("messages.window", lambda u, x, o: u.messages.window(x.session, roles=["user"], after_seq=0)),
    read("messages.context", lambda u, x, o: u.messages.context(x.session, max_tokens=1000)),
    read("messages.count", lambda u, x, o: u.messages.count(x.session)),
    read("messages.count", lambda u, x, o: u.messages.count(x.session, roles=["tool"])),
    read("messages.search", lambda u, x, o: u.messages.search(x.agent, x.word)),
    read("messages.search", lambda u, x, o: u.messages.search(o.agent, x.word)),
    read("messages.search", lambda u, x, o: u.messages.search(o.agent, "hello", session_id=x.session)),
    read("messages.between", lambda u, x, o: u.messages.between(x.agent, *SPAN)),
    read("messages.between", lambda u, x, o: u.messages.between(o.agent, *SPAN, session_id=x.session)),
    write("messages.append", lambda u, x, o: u.messages.append(x.session, {"role": "user", "content": "hi"})),
    write("messages.append", lambda u, x, o: u.messages.append(x.session, [])),
    write(
        "messages.prepend", lambda u, x, o: u.messages.prepend(x.session, {"role": "user", "content": "hi"})
    ),
    write("messages.replace_system", lambda u, x, o: u.messages.replace_system(x.session, "stolen")),
    write("messages.trim", lambda u, x, o: u.messages.trim(x.session, keep_last=0)),
    write("messages.delete", lambda u, x, o: u.messages.delete(x.messages[0])),
    write("messages.delete_after", lambda u, x, o: u.messages.delete_after(x.session, 0)),
    write("messages.clear", lambda u, x, o: u.messages.clear(x.session)),
    write("messages.pop", lambda u, x, o: u.messages.pop(x.session)),
    write("messages.delete_before", lambda u, x, o: u.messages.delete_before(x.agent, FUTURE, dry_run=True)),
    write("messages.delete_before", lambda u, x, o: u.messages.delete_before(x.agent, FUTURE)),
    write(
        "messages.delete_before",
        lambda u, x, o: u.messages.delete_before(o.agent, FUTURE, session_id=x.session),
    ),
    create(
        "messages.append",
        lambda u, x, o: facts(
            u.messages.append(
                o.session,
                [
                    {"id": x.messages[0], "role": "user", "content": x.word},
                    {"id": x.messages[1], "role": "assistant", "content": x.word},
                ],
            ),
            "id",
        ),
    ),
    create(
        "messages.prepend",
        lambda u, x, o: facts(
            u.messages.prepend(o.session, {"id": x.messages[2], "role": "user", "content": x.word}), "id"
        ),
    ),
    # passages
    read("passages.get", lambda u, x, o: u.passages.get(x.passages[0])),
    read("passages.get_many", lambda u, x, o: u.passages.get_many(x.passages)),
    read("passages.count", lambda u, x, o: u.passages.count(x.agent)),
    read("passages.count", lambda u, x, o: u.passages.count(o.agent, embedding_model=x.model)),
    read("passages.list", lambda u, x, o: u.passages.list(x.agent)),
    read("passages.get_model", lambda u, x, o: u.passages.get_model(x.agent, x.model)),
    read("passages.get_model", lambda u, x, o: u.passages.get_model(o.agent, x.half_model)),
    read("passages.search", lambda u, x, o: u.passages.search(x.agent, V3, embedding_model=x.model)),
    read("passages.search", lambda u, x, o: u.passages.search(o.agent, V2, embedding_model=x.half_model)),
    read(
        "passages.search",
        lambda u, x, o: u.passages.search(o.agent, V3, embedding_model="b-model", where=x.meta),
    ),
    read("passages.search_text", lambda u, x, o: u.passages.search_text(x.agent, x.word)),
    read("passages.search_text", lambda u, x, o: u.passages.search_text(o.agent, x.word)),
    read(
        "passages.hybrid_search",
        lambda u, x, o: u.passages.hybrid_search(x.agent, x.word, V3, embedding_model=x.model),
    ),
    read(
        "passages.hybrid_search",
        lambda u, x, o: u.passages.hybrid_search(o.agent, x.word, V3, embedding_model=x.model),
    ),
    write("passages.add", lambda u, x, o: u.passages.add(x.agent, x.word, V3, embedding_model=x.model)),
    write("passages.add_many", lambda u, x, o: u.passages.add_many(x.agent, passages_of(x, x.model, 3, 1))),
    write("passages.define_model", lambda u, x, o: u.passages.define_model(x.agent, x.model, 3)),
    write("passages.update_text", lambda u, x, o: u.passages.update_text(x.passages[0], "stolen", V3)),
    write("passages.delete", lambda u, x, o: u.passages.delete(x.passages[0])),
    write("passages.delete_many", lambda u, x, o: u.passages.delete_many(x.agent, x.passages)),
    write("passages.delete_many", lambda u, x, o: u.passages.delete_many(o.agent, x.passages)),
    write("passages.delete_where", lambda u, x, o: u.passages.delete_where(x.agent, x.meta)),
    write("passages.delete_where", lambda u, x, o: u.passages.delete_where(o.agent, x.meta)),
    write("passages.delete_before", lambda u, x, o: u.passages.delete_before(x.agent, FUTURE, dry_run=True)),
    write("passages.delete_before", lambda u, x, o: u.passages.delete_before(x.agent, FUTURE)),
    Probe("passages.ensure_index", indexed, WRITE, empty=False),
    # A's model names at other shapes: A's models must not constrain B's.
    create(
        "passages.add_many",
        lambda u, x, o: facts(
            u.passages.add_many(o.agent, passages_of(x, x.model, 4, 2)), "id", "embedding_dim"
        ),
    ),
    create(
        "passages.add",
        lambda u, x, o: facts(
            u.passages.add(o.agent, x.word, [1.0] * 5, embedding_model=x.half_model),
            "embedding_model",
            "embedding_dim",
        ),
    ),
    create(
        "passages.define_model",
        lambda u, x, o: facts(u.passages.define_model(o.other, x.half_model, 7), "name", "dim", "precision"),
    ),
]


def public_methods() -> set[str]:
    return {
        f"{prefix}.{name}"
        for prefix, cls in REPOSITORIES.items()
        for name, _ in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


def normalised(outcome: Any, ids: Ids) -> str:
    """`repr(outcome)` with each of `ids` (and the names and keys) replaced by its placeholder."""
    text = repr(outcome)
    for value, name in sorted(ids.placeholders().items(), key=lambda pair: -len(pair[0])):
        text = re.sub(rf"(?<![\w-]){re.escape(value)}(?![\w-])", name, text)
    return text


def is_empty(result: Any) -> bool:
    if isinstance(result, Page):
        return result.total == 0 and not result.items
    if isinstance(result, Removed):
        return result.total == 0
    return result is None or result == [] or (type(result) is int and result == 0)


def tenants_in(value: Any) -> Iterator[str]:
    """The tenant of every row in a result (pages, lists, scored passages)."""
    if isinstance(value, Page | list | tuple):
        for item in value:
            yield from tenants_in(item)
    elif isinstance(value, ScoredPassage):
        yield from tenants_in(value.passage)
    elif hasattr(value, "tenant") and not is_dataclass(value):
        yield value.tenant


async def outcome(db: Database, probe: Probe, ids: Ids, own: Own, *, via_view: bool) -> str:
    """What the probe does in tenant B with `ids`, normalised; its unit of work commits.

    Committing makes a write that reached A's rows show in A's hash; a call
    that raised commits too, as a caller that catches the error would
    (unless the database failed the unit of work).
    """
    opener = db.for_tenant("b").unit_of_work if via_view else functools.partial(db.unit_of_work, "b")
    async with opener(read_only=probe.phase == READ) as uow:
        try:
            result = await probe.call(uow, ids, own)
        except MemormError as error:
            if uow.link.state.failed is not None:
                await uow.rollback()
            return normalised((type(error).__name__, str(error)), ids)
    assert set(tenants_in(result)) <= {"b"}, f"{probe.method}: rows of another tenant in {result!r}"
    if probe.empty:
        assert is_empty(result), f"{probe.method}: {result!r}"
    return normalised(("returned", result), ids)


def test_every_public_repository_method_has_a_probe() -> None:
    assert public_methods() == {probe.method for probe in PROBES}


async def test_tenant_b_learns_nothing_of_tenant_a_and_changes_none_of_its_rows(scene: Scene) -> None:
    a = await fill_a(scene.db)
    own = await fill_b(scene.db)
    before = await tenant_hash(scene.owner, "a")
    found = await searches(scene.db, "a", a)  # on SQLite, also fills the vector cache with A's agent
    random = a.fresh()
    calls = 0
    for turn, probe in enumerate(sorted(PROBES, key=lambda probe: probe.phase)):
        via_view = turn % 2 == 1  # db.for_tenant("b") and db.unit_of_work("b") alike
        with_a = await outcome(scene.db, probe, a, own, via_view=via_view)
        with_random = await outcome(scene.db, probe, random, own, via_view=via_view)
        calls += 2
        assert with_a == with_random, f"{probe.method} tells A's ids from unknown ones"
        assert await tenant_hash(scene.owner, "a") == before, f"{probe.method} changed tenant A's rows"
    assert await searches(scene.db, "a", a) == found
    SUMMARY[scene.name] = {"methods": len(public_methods()), "probes": len(PROBES), "calls": calls}
    BENCH.mkdir(exist_ok=True)
    path = BENCH / f"reliability-tenancy-{scene.name}.json"
    path.write_text(json.dumps({"scene": scene.name, **SUMMARY[scene.name]}, indent=2) + "\n")
    assert calls == 2 * len(PROBES), SUMMARY


# -- tenant B holding the same ids as tenant A ---------------------------------


async def copy_tenant(owner: Database, source: str, target: str) -> None:
    """Every row of `source` again under `target`, same ids: raw Core inserts across tenants."""
    async with owner.unit_of_work(all_tenants=True) as uow:
        for table in TABLES:
            columns = model_fields(table)
            rows = (await uow.session.execute(sa.select(*columns).where(table.c.tenant == source))).mappings()
            copies = [{**row, "tenant": target} for row in rows]
            if copies:
                await uow.session.execute(sa.insert(table), copies)


async def log_of(db: Database, tenant: str, session: uuid.UUID) -> list[tuple[str, str | None]]:
    async with db.unit_of_work(tenant, read_only=True) as uow:
        return [(m.role, m.content) for m in await uow.messages.window(session, limit=100)]


async def test_tenant_b_with_tenant_as_ids_changes_only_its_own_copies(scene: Scene) -> None:
    db, owner = scene.db, scene.owner
    a = await fill_a(db)
    found = await searches(db, "a", a)
    await copy_tenant(owner, "a", "b")
    assert await searches(db, "b", a) == found  # B's copies answer as A's rows do
    b = db.for_tenant("b")
    # Both archives move to the same archive_version, B's with another text and vector,
    # so a vector cache that mixed the tenants up would give one the other's matrix.
    async with b.unit_of_work() as uow:
        await uow.passages.update_text(a.passages[0], "Bea keeps a horse", VB)
    async with db.unit_of_work("a") as uow:
        await uow.passages.update_text(a.passages[0], "Ada keeps a zebra", V3)  # the same again
    before = await tenant_hash(owner, "a")
    found = await searches(db, "a", a)
    async with db.unit_of_work("b", read_only=True) as uow:
        [best, *_] = await uow.passages.search(a.agent, VB, embedding_model="minilm")
        assert (best.passage.text, round(best.score, 3)) == ("Bea keeps a horse", 1.0)
        assert (await uow.passages.search_text(a.agent, "horse")).total == 1
    assert await searches(db, "a", a) == found
    a_log = await log_of(db, "a", a.session)
    steps = 0

    async def a_unchanged() -> None:
        nonlocal steps
        steps += 1
        assert await tenant_hash(owner, "a") == before, f"step {steps} changed tenant A's rows"

    # The chat log.
    async with b.unit_of_work() as uow:
        [new] = await uow.messages.append(a.session, {"role": "user", "content": "b says hi"})
    assert (new.tenant, new.seq) == ("b", 6)
    await a_unchanged()
    async with b.unit_of_work() as uow:
        await uow.messages.prepend(a.session, {"role": "user", "content": "b summary"})
        await uow.messages.replace_system(a.session, "You are B.")
    await a_unchanged()
    assert await log_of(db, "b", a.session) == [
        ("system", "You are B."),
        ("user", "b summary"),
        *a_log[1:],
        ("user", "b says hi"),
    ]
    async with b.unit_of_work() as uow:
        assert await uow.messages.trim(a.session, keep_last=2) == 4
    await a_unchanged()
    assert await log_of(db, "b", a.session) == [("system", "You are B."), a_log[-1], ("user", "b says hi")]
    async with b.unit_of_work() as uow:
        assert await uow.messages.delete_after(a.session, 5) == 1  # "b says hi" (seq 6)
        await uow.messages.append(
            a.session, [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}]
        )
        popped = await uow.messages.pop(a.session)
        assert popped is not None
        assert (popped.tenant, popped.content) == ("b", "two")
        await uow.messages.delete(a.messages[4])  # B's copy of "Zed is a fine zebra"
    await a_unchanged()
    assert await log_of(db, "b", a.session) == [("system", "You are B."), ("user", "one")]
    async with b.unit_of_work() as uow:
        assert await uow.messages.delete_before(a.agent, FUTURE, session_id=a.spare_session) == 1
        assert await uow.messages.count(a.spare_session) == 0
    await a_unchanged()
    # The agent.
    async with b.unit_of_work() as uow:
        await uow.agents.update_core_memory(a.agent, "human", "Bea")
        agent = await uow.agents.update(a.agent, system="You are B.", expected_version=2)
    assert (agent.tenant, agent.version, agent.core_memory) == ("b", 3, {"human": "Bea", "persona": "Sam"})
    await a_unchanged()
    # Archival memory.
    async with b.unit_of_work() as uow:
        assert await uow.passages.delete_many(a.agent, [a.passages[1]]) == 1
        assert await uow.passages.delete_where(a.agent, {"user_id": "ada"}) == 2  # passages 0 and 3
        assert await uow.passages.delete_before(a.agent, FUTURE) == 1  # passage 2
        assert await uow.passages.count(a.agent) == 0
    await a_unchanged()
    assert await searches(db, "a", a) == found
    # Sessions: expiry, purge, clear, delete, forget.
    async with b.unit_of_work() as uow:
        touched = await uow.sessions.touch(a.session, ttl=60)
        assert (touched.tenant, touched.expires_at is not None) == ("b", True)
        removed = await uow.sessions.purge_expired(now=utcnow() + timedelta(seconds=30))
        assert removed == Removed(sessions=1, messages=1)  # B's copy of the expired session
    await a_unchanged()
    async with b.unit_of_work() as uow:
        assert await uow.messages.clear(a.session) == 2
        await uow.sessions.delete(a.spare_session)
    await a_unchanged()
    async with b.unit_of_work() as uow:
        assert await uow.agents.forget({"user_id": "ada"}) == Removed(sessions=1)  # the keyed session
        await uow.agents.delete(a.agent)
    await a_unchanged()
    async with owner.unit_of_work(read_only=True, all_tenants=True) as uow:
        for table in TABLES:
            left = sa.select(sa.func.count()).select_from(table).where(table.c.tenant == "b")
            assert (await uow.session.execute(left)).scalar() == 0, table.name
    assert await searches(db, "a", a) == found
    assert await log_of(db, "a", a.session) == a_log


async def test_maintenance_across_tenants_matches_rows_by_tenant_and_id(scene: Scene) -> None:
    """All-tenants `forget` and `purge_expired`, and `delete_tenant`, with B's rows under A's ids."""
    db, owner = scene.db, scene.owner
    a = await fill_a(db)
    await copy_tenant(owner, "a", "b")
    # B's copies alone get a person to forget and a session expired long ago.  Raw SQL:
    # the tenant is named (only row-level security would add it).
    edits = [
        (SESSIONS, a.spare_session, {"meta": {"user_id": "bea"}}),
        (PASSAGES, a.passages[1], {"meta": {"user_id": "bea"}}),
        (SESSIONS, a.old_session, {"expires_at": datetime(2000, 1, 1, tzinfo=timezone.utc)}),
    ]
    async with db.unit_of_work("b") as uow:
        for table, key, values in edits:
            await uow.session.execute(
                sa.update(table).where(table.c.tenant == "b", table.c.id == key).values(values)
            )
    before = await tenant_hash(owner, "a")
    found = await searches(db, "a", a)
    async with owner.unit_of_work(all_tenants=True) as uow:
        assert await uow.agents.forget({"user_id": "bea"}) == Removed(sessions=1, messages=1, passages=1)
        instant = datetime(2001, 1, 1, tzinfo=timezone.utc)
        assert await uow.sessions.purge_expired(now=instant) == Removed(sessions=1, messages=1)
    assert await tenant_hash(owner, "a") == before
    async with db.unit_of_work("b", read_only=True) as uow:
        assert [s.key for s in (await uow.sessions.list(a.agent)).items] == ["chat-1"]
        assert await uow.passages.count(a.agent) == 3
    assert await db.delete_tenant("b", batch=2) == {
        "agents": 1,
        "embedding_models": 2,
        "sessions": 1,
        "messages": 5,
        "archival_passages": 3,
        "graph_checkpoints": 0,
        "graph_writes": 0,
        "graph_blobs": 0,
        "graph_store_items": 0,
        "graph_store_vectors": 0,
    }
    assert await tenant_hash(owner, "a") == before
    assert await searches(db, "a", a) == found
