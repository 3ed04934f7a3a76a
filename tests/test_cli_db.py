"""memorm demo and memorm db upgrade|downgrade|current: outputs, exit codes, one-line errors."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from conftest import ENGINES, POSTGRES_URL, REQUIRE_POSTGRES, asyncpg_dsn, postgres_unavailable
from sqlalchemy.engine import make_url

from memorm.cli import main
from memorm.migrate import head_revision


async def _admin(sql: str) -> None:
    connection = await asyncpg.connect(asyncpg_dsn())
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


@pytest.fixture(params=ENGINES)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'cli.db'}"
        return
    reason = postgres_unavailable()
    if reason is not None:
        if REQUIRE_POSTGRES:
            pytest.fail(reason)
        pytest.skip(reason)
    name = f"memorm_cli_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def test_demo_tours_the_features_and_can_run_again(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--url", url]) == 0
    first = capsys.readouterr().out
    for section in (
        "context window",
        "full-text recall search",
        "date search",
        "archival similarity",
        "trim",
    ):
        assert section in first
    assert "sessions 1 · messages 3 · passages 4" in first
    assert main(["demo", "--url", url]) == 0  # idempotent: a new session, the same agent and passages
    assert "sessions 2 · messages 6 · passages 4" in capsys.readouterr().out


def test_db_upgrade_current_and_downgrade(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "current", "--url", url]) == 0
    assert "base" in capsys.readouterr().out
    assert main(["db", "upgrade", "--url", url]) == 0
    assert capsys.readouterr().out.strip() == f"upgraded to {head_revision()}"
    assert main(["db", "downgrade", "0002", "--url", url]) == 0
    assert capsys.readouterr().out.strip() == "downgraded to 0002"
    assert main(["db", "current", "--url", url]) == 0
    assert capsys.readouterr().out.strip() == "0002"


def test_errors_are_one_line_and_exit_1(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "upgrade", "no-such-revision", "--url", url]) == 1
    err = capsys.readouterr().err
    assert err.startswith("memorm: error:")
    assert len(err.strip().splitlines()) == 1
    assert main(["db", "current", "--url", "mysql://root@localhost/x"]) == 1
    assert "unsupported database" in capsys.readouterr().err
