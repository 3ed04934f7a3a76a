"""`memorm.testing`: pytest fixtures for testing code that uses memorm.

Installed with memorm as a pytest plugin (entry point `pytest11`), so its
fixtures are there in every test of a project that depends on memorm:

* `memorm_db`: a fresh, migrated [`Database`][memorm.db.Database] per test: a SQLite
  file in `tmp_path`, or with `--memorm-url URL` (or `MEMORM_TEST_URL`) a
  fresh schema of that Postgres database, dropped after the test.
* `memorm_uow`: a unit of work on `memorm_db`, committed when the test ends.
* `make_agent(**kw)`, `make_session(agent=None, **kw)`,
  `add_messages(session, messages)`: async factories returning what they made.

The fixtures are plain `async def` fixtures, run by anyio's pytest plugin for
tests marked `pytest.mark.anyio` (with `anyio_backend` set to `"asyncio"`:
the drivers need asyncio), or by pytest-asyncio in `asyncio_mode = "auto"`.

Example:
    ```python
    import pytest

    pytestmark = pytest.mark.anyio


    async def test_reply_is_stored(make_session, add_messages, memorm_db):
        chat = await make_session()
        await add_messages(chat, [{"role": "user", "content": "hi"}])
        async with memorm_db.unit_of_work(read_only=True) as uow:
            assert await uow.messages.count(chat.id) == 1
    ```

`capture_statements(db)` (a context manager, not a fixture) lists the
statements a `Database` sends inside the block, with their parameters: those
memorm sends on the driver itself (appends, windows, searches) and those that
go through SQLAlchemy alike.

Loading the plugin adds an option and defines fixtures, nothing else: no
connection is made and asyncpg is not imported until a test asks for
`memorm_db`.  Disable it with `-p no:memorm`.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import pytest

if TYPE_CHECKING:
    from memorm import Agent, Database, Message, Session, UnitOfWork
    from memorm.engines import Reachable

__all__ = [
    "URL_ENV",
    "AddMessages",
    "MakeAgent",
    "MakeSession",
    "add_messages",
    "capture_statements",
    "make_agent",
    "make_session",
    "memorm_db",
    "memorm_uow",
]


@contextmanager
def capture_statements(db: Reachable, containing: str = "") -> Iterator[list[tuple[str, Any]]]:
    """The statements (SQL, parameters) `db` (a `Database` or `uow.backend`) sends in the block, in order.

    Both kinds: those memorm sends on the driver connection itself (its hot
    paths, `BEGIN`/`COMMIT`) and those that go through SQLAlchemy (your
    `uow.session` queries, memorm's other calls).  With `containing`, only
    statements whose SQL contains it.  For the running event loop's engine.

    Example:
        ```python
        with capture_statements(db) as sent:
            async with db.unit_of_work(read_only=True) as uow:
                await uow.messages.window(chat.id)
        assert len(sent) == 1  # one SELECT, no BEGIN or COMMIT
        ```
    """
    from sqlalchemy import event

    from memorm.connection_state import WATCHERS

    engine = db.engine.sync_engine
    sent: list[tuple[str, Any]] = []

    def on_driver(pool: Any, statement: str, parameters: Sequence[Any]) -> None:
        if pool is engine.pool and containing in statement:
            sent.append((statement, parameters))

    def on_sqlalchemy(
        _conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool
    ) -> None:
        if containing in statement:
            sent.append((statement, parameters))

    WATCHERS.append(on_driver)
    event.listen(engine, "before_cursor_execute", on_sqlalchemy)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", on_sqlalchemy)
        WATCHERS.remove(on_driver)


URL_ENV = "MEMORM_TEST_URL"
"""The environment variable naming a Postgres database for `memorm_db` (`--memorm-url` wins)."""

# memorm_uow puts itself here while open, so the factories write through it.
_OPEN_UOW = pytest.StashKey["UnitOfWork"]()
_names = itertools.count(1)
T = TypeVar("T")


class MakeAgent(Protocol):
    """`await make_agent(**kw)`: a new agent (`kw` as for `uow.agents.create`; `name` optional)."""

    async def __call__(self, **kw: Any) -> Agent: ...


class MakeSession(Protocol):
    """`await make_session(agent=None, **kw)`: a new session of `agent` (a new agent if None)."""

    async def __call__(self, agent: Agent | uuid.UUID | str | None = None, **kw: Any) -> Session: ...


class AddMessages(Protocol):
    """`await add_messages(session, messages)`: the stored messages, with their `seq`."""

    async def __call__(
        self, session: Session | uuid.UUID | str, messages: Sequence[Message | Mapping[str, Any]]
    ) -> list[Message]: ...


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memorm", "memorm test database")
    group.addoption(
        "--memorm-url",
        dest="memorm_url",
        default=None,
        metavar="URL",
        help=f"run memorm_db on this Postgres database, one schema per test (default: ${URL_ENV}, "
        "else a SQLite file per test)",
    )


def pytest_configure(config: pytest.Config) -> None:
    url = _postgres_url(config)
    if url is not None and not url.partition("://")[0].startswith("postgres"):
        raise pytest.UsageError(
            f"--memorm-url / {URL_ENV} must name a Postgres database, not {url.partition(':')[0]}: "
            "memorm_db is a SQLite file per test by default"
        )


def _postgres_url(config: pytest.Config) -> str | None:
    url: str | None = config.getoption("memorm_url", None) or os.environ.get(URL_ENV) or None
    return url


@pytest.fixture
async def memorm_db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    """A fresh database at memorm's newest schema (`await db.upgrade()`), disposed after the test."""
    from memorm import Database

    url = _postgres_url(request.config)
    if url is None:
        db = Database(f"sqlite+aiosqlite:///{tmp_path / 'memorm.db'}")
        try:
            await db.upgrade()
            yield db
        finally:
            await db.dispose()
        return
    async with _postgres_schema(url) as schema:
        db = Database(url, connect_args={"server_settings": {"search_path": f"{schema},public"}})
        try:
            await db.upgrade()
            yield db
        finally:
            await db.dispose()


@pytest.fixture
async def memorm_uow(request: pytest.FixtureRequest, memorm_db: Database) -> AsyncIterator[UnitOfWork]:
    """A unit of work on `memorm_db`, committed when the test ends.

    On SQLite a writing unit of work holds the database's write lock while
    open: code under test that opens writing units of work of its own should
    take `memorm_db` instead.
    """
    import asyncio

    # The unit of work opens and closes in a task of its own: SQLite's write lock
    # belongs to the task that took it, and pytest-asyncio runs a fixture's setup
    # and teardown in different tasks.
    opened: asyncio.Future[UnitOfWork] = asyncio.get_running_loop().create_future()
    finished = asyncio.Event()

    async def hold() -> None:
        async with memorm_db.unit_of_work() as uow:
            opened.set_result(uow)
            await finished.wait()

    holder = asyncio.create_task(hold())
    either: list[asyncio.Future[Any]] = [opened, holder]
    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    if not opened.done():
        await holder  # it failed to open: raise why
    request.node.stash[_OPEN_UOW] = opened.result()
    try:
        yield opened.result()
    finally:
        del request.node.stash[_OPEN_UOW]
        finished.set()
        await holder  # the commit, and any error it raises


class _Writer:
    """Runs a factory's write in the test's `memorm_uow` if open, else in its own committed one."""

    def __init__(self, request: pytest.FixtureRequest, db: Database) -> None:
        self.request = request
        self.db = db

    async def __call__(self, write: Callable[[UnitOfWork], Awaitable[T]]) -> T:
        uow = self.request.node.stash.get(_OPEN_UOW, None)
        if uow is not None:
            return await write(uow)
        async with self.db.unit_of_work() as own:
            return await write(own)


@pytest.fixture
def make_agent(request: pytest.FixtureRequest, memorm_db: Database) -> MakeAgent:
    """An async factory of agents: `await make_agent(name=…, system=…, core_memory=…)`.

    Factories write through `memorm_uow` when the test uses it; otherwise each
    call commits in a unit of work of its own, so code under test sees the rows.
    """
    writer = _Writer(request, memorm_db)

    async def make(**kw: Any) -> Agent:
        name = kw.pop("name") if "name" in kw else f"agent-{next(_names)}"
        return await writer(lambda uow: uow.agents.create(name, **kw))

    return make


@pytest.fixture
def make_session(request: pytest.FixtureRequest, memorm_db: Database, make_agent: MakeAgent) -> MakeSession:
    """An async factory of sessions: `await make_session(agent, title=…, key=…)` (a new agent if none)."""
    writer = _Writer(request, memorm_db)

    async def make(agent: Agent | uuid.UUID | str | None = None, **kw: Any) -> Session:
        owner = agent if agent is not None else await make_agent()
        agent_id = _id_of(owner)
        return await writer(lambda uow: uow.sessions.create(agent_id, **kw))

    return make


@pytest.fixture
def add_messages(request: pytest.FixtureRequest, memorm_db: Database) -> AddMessages:
    """An async helper appending `Message` objects or dicts: `await add_messages(chat, [...])`."""
    writer = _Writer(request, memorm_db)

    async def add(
        session: Session | uuid.UUID | str, messages: Sequence[Message | Mapping[str, Any]]
    ) -> list[Message]:
        session_id = _id_of(session)
        return await writer(lambda uow: uow.messages.append(session_id, list(messages)))

    return add


def _id_of(row: Agent | Session | uuid.UUID | str) -> uuid.UUID | str:
    return row if isinstance(row, (uuid.UUID, str)) else row.id


def _asyncpg_dsn(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


_extension_ready: set[str] = set()


@asynccontextmanager
async def _postgres_schema(url: str) -> AsyncIterator[str]:
    """A fresh schema in the Postgres database at `url`, dropped with everything in it afterwards."""
    import asyncpg

    dsn = _asyncpg_dsn(url)
    schema = f"memorm_test_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(dsn)
    try:
        if dsn not in _extension_ready:
            # In public, once: a test dropping its schema must never drop the extension.
            await admin.execute("CREATE EXTENSION IF NOT EXISTS vector SCHEMA public")
            await admin.execute("CREATE EXTENSION IF NOT EXISTS btree_gin SCHEMA public")
            _extension_ready.add(dsn)
        await admin.execute(f'CREATE SCHEMA "{schema}"')
        try:
            yield schema
        finally:
            await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await admin.close()
