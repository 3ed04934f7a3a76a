"""memorm demo and memorm db upgrade|downgrade|current: outputs, exit codes, one-line errors."""

from __future__ import annotations

import pytest

from memorm.cli import main
from memorm.migrate import head_revision


def test_demo_tours_the_features_and_can_run_again(
    plain_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--url", plain_url]) == 0
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
    assert main(["demo", "--url", plain_url]) == 0  # idempotent: a new session, the same agent and passages
    assert "sessions 2 · messages 6 · passages 4" in capsys.readouterr().out


def test_db_upgrade_current_and_downgrade(plain_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "upgrade", "--url", plain_url]) == 0  # on SQLite, it creates the file
    assert capsys.readouterr().out.strip() == f"upgraded to {head_revision()}"
    assert main(["db", "current", "--url", plain_url]) == 0
    assert capsys.readouterr().out.strip() == head_revision()
    assert main(["db", "downgrade", "0002", "--url", plain_url]) == 0
    assert capsys.readouterr().out.strip() == "downgraded to 0002"
    assert main(["db", "current", "--url", plain_url]) == 0
    assert capsys.readouterr().out.strip() == "0002"
    assert main(["db", "downgrade", "base", "--url", plain_url]) == 0
    assert capsys.readouterr().out.strip() == "downgraded to base (empty)"
    assert main(["db", "current", "--url", plain_url]) == 0
    assert capsys.readouterr().out.strip() == "base (no memorm schema)"


def test_errors_are_one_line_and_exit_1(plain_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "upgrade", "no-such-revision", "--url", plain_url]) == 1
    err = capsys.readouterr().err
    assert err.startswith("memorm: error:")
    assert len(err.strip().splitlines()) == 1
    assert main(["db", "current", "--url", "mysql://root@localhost/x"]) == 1
    assert "unsupported database" in capsys.readouterr().err
