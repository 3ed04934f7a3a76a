"""``memorm.testing``, the pytest plugin for users' tests, run as users run it.

Each test writes a small project (the example of docs/testing.md, or tests of
the fixtures' isolation) and runs pytest on it in-process with ``pytester``:
on SQLite by default, and on Postgres through ``--memorm-url`` or
``MEMORM_TEST_URL``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path

import asyncpg
import pytest

from memorm.testing import URL_ENV
from tests.conftest import POSTGRES_URL, asyncpg_dsn

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
# ```py blocks (not run by test_docs) whose first line names their file: "# conftest.py".
FILES = re.compile(r"^```py\n# (\S+\.py)\n(.*?)^```", re.MULTILINE | re.DOTALL)

Runner = Callable[..., pytest.RunResult]

ANYIO_CONFTEST = """
import pytest


@pytest.fixture
def anyio_backend():
    return "asyncio"
"""


def documented_files() -> dict[str, str]:
    return dict(FILES.findall((ROOT / "docs" / "testing.md").read_text(encoding="utf-8")))


@pytest.fixture
def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Runner:
    """``run(engine, *args, via=…)``: pytest in ``pytester``'s project, on SQLite or on Postgres.

    Postgres is named by ``--memorm-url`` (``via="option"``) or ``MEMORM_TEST_URL``.
    """
    # Our runs pick the engine themselves, whatever the caller's environment says.
    monkeypatch.delenv(URL_ENV, raising=False)

    def run_on(engine: str, *args: str, via: str = "option") -> pytest.RunResult:
        if engine == "postgres" and via == "option":
            args = ("--memorm-url", POSTGRES_URL, *args)
        elif engine == "postgres":
            monkeypatch.setenv(URL_ENV, POSTGRES_URL)
        return pytester.runpytest("-p", "no:cacheprovider", *args)

    return run_on


def test_docs_show_a_conftest_and_a_test_file() -> None:
    assert set(documented_files()) == {"conftest.py", "test_chat.py"}


def test_plugin_adds_the_memorm_url_option(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("-p", "no:asyncio", "--help")
    result.stdout.fnmatch_lines(["*--memorm-url=URL*"])


def test_a_sqlite_url_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest("-p", "no:asyncio", "--memorm-url", "sqlite:///x.db")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*must name a Postgres database*"])


def test_documented_example_passes(engine: str, pytester: pytest.Pytester, run: Runner) -> None:
    files = documented_files()
    pytester.makeconftest(files.pop("conftest.py"))
    pytester.makepyfile(**{name.removesuffix(".py"): source for name, source in files.items()})
    result = run(engine, "-p", "no:asyncio")
    result.assert_outcomes(passed=3)


ISOLATION = """
import pytest
import sqlalchemy as sa

pytestmark = pytest.mark.anyio
SEEN = {seen!r}


async def where(db):
    if db.dialect == "sqlite":
        return db.url.database
    async with db.unit_of_work(read_only=True) as uow:
        return (await uow.session.execute(sa.text("SELECT current_schema()"))).scalar()


async def test_first_writes(memorm_db, make_session, add_messages):
    chat = await make_session(title="first")
    await add_messages(chat, [{{"role": "user", "content": "only in the first test"}}])
    with open(SEEN, "a") as seen:
        seen.write(await where(memorm_db) + "\\n")


async def test_second_sees_nothing(memorm_db):
    async with memorm_db.unit_of_work(read_only=True) as uow:
        assert (await uow.agents.list()).total == 0
        assert await memorm_db.current_revision() is not None  # migrated, just empty
    with open(SEEN, "a") as seen:
        seen.write(await where(memorm_db) + "\\n")


@pytest.fixture
async def agent_is_committed(memorm_db):
    yield
    # Torn down after memorm_uow (set up before it): its work must be committed by now.
    async with memorm_db.unit_of_work(read_only=True) as uow:
        assert await uow.agents.get_by_name("kept") is not None


async def test_memorm_uow_commits_at_the_end(agent_is_committed, memorm_uow, make_agent):
    await make_agent(name="kept")
    assert await memorm_uow.agents.get_by_name("kept") is not None
"""


def test_each_test_gets_its_own_database(engine: str, pytester: pytest.Pytester, run: Runner) -> None:
    check_isolation(pytester, run, engine, via="option")


@pytest.mark.parametrize("engine", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
def test_memorm_test_url_names_postgres_too(engine: str, pytester: pytest.Pytester, run: Runner) -> None:
    check_isolation(pytester, run, engine, via="environment")


def check_isolation(pytester: pytest.Pytester, run: Runner, engine: str, *, via: str) -> None:
    seen = pytester.path / "seen.txt"
    pytester.makeconftest(ANYIO_CONFTEST)
    pytester.makepyfile(test_isolation=ISOLATION.format(seen=str(seen)))
    result = run(engine, "-p", "no:asyncio", via=via)
    result.assert_outcomes(passed=3)
    places = seen.read_text().split()
    assert len(places) == 2
    assert len(set(places)) == 2
    if engine == "postgres":
        assert all(name.startswith("memorm_test_") for name in places)
        assert not asyncio.run(_schemas_left(places)), "per-test schemas must be dropped"


async def _schemas_left(names: list[str]) -> list[str]:
    connection = await asyncpg.connect(asyncpg_dsn())
    try:
        rows = await connection.fetch(
            "SELECT nspname FROM pg_namespace WHERE nspname = ANY($1::text[])", names
        )
    finally:
        await connection.close()
    return [row["nspname"] for row in rows]


def test_fixtures_run_under_pytest_asyncio_auto_mode(
    engine: str, pytester: pytest.Pytester, run: Runner
) -> None:
    pytest.importorskip("pytest_asyncio")
    pytester.makeini("[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(
        test_auto="""
async def test_factories(make_session, add_messages, memorm_db):
    chat = await make_session()
    stored = await add_messages(chat, [{"role": "user", "content": "hi"}])
    assert [message.seq for message in stored] == [1]


async def test_unit_of_work_commits(memorm_uow, make_agent):
    await make_agent(name="sam")
    assert await memorm_uow.agents.get_by_name("sam") is not None
"""
    )
    result = run(engine, "-p", "no:anyio")
    result.assert_outcomes(passed=2)
