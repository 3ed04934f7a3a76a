"""Every ``python`` example in README.md and docs/ runs, on both engines.

Each page's examples run in order, in-process, against a fresh database named
by ``MEMORM_DATABASE_URL`` (the examples use ``Database()``'s default): a SQLite
file, or a throwaway Postgres database (a URL cannot carry a search_path).
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from tests.conftest import ENGINES, POSTGRES_URL, REQUIRE_POSTGRES, asyncpg_dsn, postgres_unavailable

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def examples(page: Path) -> list[str]:
    return BLOCK.findall(page.read_text(encoding="utf-8"))


def test_docs_have_examples() -> None:
    assert sum(len(examples(page)) for page in PAGES) >= 8


async def _admin(sql: str) -> None:
    connection = await asyncpg.connect(asyncpg_dsn())
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


@pytest.fixture
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    engine: str = request.param
    if engine == "sqlite":
        yield f"sqlite:///{tmp_path / 'docs.db'}"
        return
    reason = postgres_unavailable()
    if reason is not None:
        if REQUIRE_POSTGRES:
            pytest.fail(reason)
        pytest.skip(reason)
    name = f"memorm_docs_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.mark.parametrize("database_url", ENGINES, indirect=True)
@pytest.mark.parametrize(
    "page", [p for p in PAGES if examples(p)], ids=lambda p: p.relative_to(ROOT).as_posix()
)
def test_page_examples_run(
    page: Path, database_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MEMORM_DATABASE_URL", database_url)
    monkeypatch.chdir(tmp_path)
    for number, source in enumerate(examples(page), start=1):
        code = compile(source, f"{page.name} example {number}", "exec")
        exec(code, {"__name__": "__main__"})
