"""Which commands make a database and which need one: missing SQLite files, and copy's and import's targets.

A command that reads or changes a database refuses a SQLite file that is not
there, naming the path, and does not create it.  ``db upgrade``, ``demo``, the
destination of ``copy`` and the target of ``import`` create it; copy and
import then migrate an empty target to head, and refuse one with a memorm
schema at another revision.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from memorm import Database
from memorm.cli import main
from memorm.migrate import head_revision
from tests.conftest import POSTGRES_URL, REQUIRE_POSTGRES, postgres_unavailable
from tests.test_cli_transfer import _populate, dump

SAMPLE = Path(__file__).resolve().parent / "data" / "memgpt"
OLDER = "0002"  # a revision before head, whatever head is


def memorm(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def revision(url: str) -> str | None:
    async def read() -> str | None:
        async with Database(url) as db:
            return await db.current_revision()

    return asyncio.run(read())


@pytest.fixture
def upgraded(tmp_path: Path) -> str:
    """A SQLite database at head, with two agents' data."""
    url = f"sqlite:///{tmp_path / 'source.db'}"
    asyncio.run(_populate(url))
    return url


@pytest.fixture
def export(upgraded: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    file = tmp_path / "memory.jsonl"
    assert memorm(capsys, "export", upgraded, str(file))[0] == 0
    return file


# -- a missing SQLite file -------------------------------------------------------

READERS = {
    "db current": ["db", "current", "--url", "{db}"],
    "db downgrade": ["db", "downgrade", "base", "--url", "{db}"],
    "db check": ["db", "check", "--url", "{db}"],
    "db scrub": ["db", "scrub", "--url", "{db}"],
    "check": ["check", "--url", "{db}"],
    "stats": ["stats", "--url", "{db}"],
    "purge": ["purge", "--expired", "--url", "{db}"],
    "purge --dry-run": ["purge", "--older-than", "30d", "--dry-run", "--url", "{db}"],
    "forget": ["forget", "--meta", "user_id=u42", "--url", "{db}"],
    "import-memgpt": ["import-memgpt", str(SAMPLE), "--url", "{db}"],
    "export": ["export", "{db}", "{tmp}/out.jsonl"],
    "copy from it": ["copy", "{db}", "sqlite:///{tmp}/destination.db"],
    "copy --verify-only into it": ["copy", "--verify-only", "{source}", "{db}"],
}


@pytest.mark.parametrize("argv", READERS.values(), ids=READERS.keys())
def test_a_command_that_needs_a_database_refuses_a_missing_file_and_creates_none(
    argv: list[str], upgraded: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "typo" / "agnets.db"
    missing.parent.mkdir()
    values = {"db": f"sqlite:///{missing}", "tmp": str(tmp_path), "source": upgraded}
    before = sorted(tmp_path.rglob("*"))
    code, out, err = memorm(capsys, *(arg.format(**values) for arg in argv))
    assert code == 1
    assert out == ""
    assert err == (
        f"memorm: error: no SQLite database at {missing} (check the URL; `memorm db upgrade` creates one)\n"
    )
    assert sorted(tmp_path.rglob("*")) == before  # not the file, nor the export, nor copy's destination


def test_a_missing_relative_path_is_named_in_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = memorm(capsys, "db", "current", "--url", "sqlite:///memroy.db")
    assert code == 1
    assert f"no SQLite database at {tmp_path / 'memroy.db'} " in err
    assert not (tmp_path / "memroy.db").exists()


def test_the_default_url_is_a_file_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MEMORM_DATABASE_URL", raising=False)
    assert memorm(capsys, "stats")[0] == 1
    assert not (tmp_path / "memorm.db").exists()
    assert memorm(capsys, "db", "upgrade")[0] == 0
    assert memorm(capsys, "stats")[0] == 0


def test_the_commands_that_make_a_database_create_the_file(
    upgraded: str, export: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, argv in {
        "upgraded.db": ["db", "upgrade", "--url"],
        "demo.db": ["demo", "--url"],
        "copy.db": ["copy", upgraded],
        "import.db": ["import"],
    }.items():
        path = tmp_path / name
        args = [*argv, f"sqlite:///{path}"] + ([str(export)] if argv == ["import"] else [])
        code, _, err = memorm(capsys, *args)
        assert (code, err) == (0, ""), name
        assert revision(f"sqlite:///{path}") == head_revision(), name


@pytest.mark.postgres
def test_a_missing_postgres_database_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reason = postgres_unavailable()
    if reason is not None:
        if REQUIRE_POSTGRES:
            pytest.fail(reason)
        pytest.skip(reason)
    url = make_url(POSTGRES_URL).set(database="memorm_no_such_database").render_as_string()
    for argv in (["db", "current", "--url", url], ["export", url, str(tmp_path / "out.jsonl")]):
        code, _, err = memorm(capsys, *argv)
        assert code == 1
        assert err.startswith("memorm: error: cannot reach the database at ")
        assert "memorm_no_such_database" in err
        assert err.count("\n") == 1


# -- copy's and import's target ----------------------------------------------------


def test_import_migrates_an_empty_target_then_fills_it(
    plain_url: str, upgraded: str, export: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = memorm(
        capsys, "import", plain_url, str(export)
    )  # a new file, or a new Postgres database
    assert (code, err) == (0, "")
    assert "imported 8 messages" in out
    assert revision(plain_url) == head_revision()
    assert dump(plain_url) == dump(upgraded)


def test_import_of_a_file_that_is_no_export_leaves_the_target_untouched(
    plain_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "notes.jsonl"
    bad.write_text('{"hello": "world"}\n', encoding="utf-8")
    code, _, err = memorm(capsys, "import", plain_url, str(bad))
    assert code == 1
    assert "is not a memorm export" in err
    if plain_url.startswith("sqlite:///"):
        assert not Path(plain_url.removeprefix("sqlite:///")).exists()
    else:
        assert revision(plain_url) is None


def test_copy_and_import_refuse_a_target_at_an_older_revision(
    plain_url: str, upgraded: str, export: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert memorm(capsys, "db", "upgrade", OLDER, "--url", plain_url)[0] == 0
    for argv in (["copy", upgraded, plain_url], ["import", plain_url, str(export)]):
        code, out, err = memorm(capsys, *argv)
        assert code == 1, argv
        assert "copied" not in out
        assert err.startswith("memorm: error: the database is at ")
        assert OLDER in err
        assert "memorm db upgrade" in err
        assert err.count("\n") == 1
        assert revision(plain_url) == OLDER  # not migrated behind its owner's back


def test_copy_and_import_go_on_into_a_target_at_head(
    plain_url: str, upgraded: str, export: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert memorm(capsys, "copy", upgraded, plain_url)[0] == 0
    code, out, _ = memorm(capsys, "import", plain_url, str(export))
    assert code == 0
    assert "imported 0 messages (8 already there)" in out


def test_copy_migrates_a_target_emptied_by_downgrade_base(
    plain_url: str, upgraded: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert memorm(capsys, "db", "upgrade", "--url", plain_url)[0] == 0
    assert memorm(capsys, "db", "downgrade", "base", "--url", plain_url)[0] == 0
    code, out, _ = memorm(capsys, "copy", upgraded, plain_url)
    assert code == 0
    assert "copied 8 messages" in out
    assert revision(plain_url) == head_revision()
