"""``memorm --version``, and a command line that loads only what it uses.

``memorm --help`` once took two seconds: every subcommand's module imported
SQLAlchemy, alembic, numpy and rich to register itself.  Timing it here would
be flaky on a busy machine, so these tests check the cause instead: which
modules a fresh interpreter holds after parsing (benchmarks/startup.py
measures the time).
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

import pytest

import memorm
from memorm.cli import main
from memorm.cli import transfer as transfer_cli
from memorm.transfer import DEFAULT_BATCH_SIZE

# What registering and parsing must not import: the heavy libraries, and
# memorm's own modules that bring them.
HEAVY = ("sqlalchemy", "sqlmodel", "pydantic", "numpy", "alembic", "rich", "asyncpg", "aiosqlite", "asyncio")
HEAVY_MEMORM = ("memorm.db", "memorm.models", "memorm.migrate", "memorm.transfer", "memorm.retention")

PROBE = """
import json, sys
from memorm.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)))
"""


def loaded_by(*argv: str) -> list[str]:
    """The modules a fresh interpreter has loaded after ``memorm ARGV`` exits from argparse."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, check=True, timeout=60
    )
    modules: list[str] = json.loads(result.stdout.splitlines()[-1])
    return modules


def heavy(modules: list[str]) -> list[str]:
    return [
        name
        for name in modules
        if name.split(".")[0] in HEAVY or any(name == m or name.startswith(f"{m}.") for m in HEAVY_MEMORM)
    ]


def test_version_prints_the_packages_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"memorm {memorm.__version__}\n"


def test_the_installed_version_is_memorms_own() -> None:
    # pyproject.toml reads the version from memorm/__init__.py: a stale install disagrees
    assert importlib.metadata.version("memorm") == memorm.__version__


HELP = [
    ["--help"],
    ["--version"],
    *(
        [*command, "--help"]
        for command in (
            ["db"],
            ["db", "upgrade"],
            ["db", "current"],
            ["db", "check"],
            ["db", "create-role"],
            ["db", "scrub"],
            ["demo"],
            ["check"],
            ["stats"],
            ["import-memgpt"],
            ["import-langgraph"],
            ["purge"],
            ["forget"],
            ["copy"],
            ["export"],
            ["import"],
            ["tenant"],
            ["tenant", "list"],
            ["tenant", "delete"],
            ["mcp"],
            ["mcp", "hash-token"],
        )
    ),
]


@pytest.mark.parametrize("argv", HELP, ids=[" ".join(argv) for argv in HELP])
def test_help_and_version_import_no_database_library(argv: list[str]) -> None:
    assert heavy(loaded_by(*argv)) == []


def test_a_usage_error_imports_no_database_library() -> None:
    assert heavy(loaded_by("purge", "--older-than", "30", "--url", "sqlite:///x.db")) == []


def test_the_probe_sees_what_a_command_imports() -> None:
    # The check above means something only if a real command shows up in it.
    assert "sqlalchemy" in heavy(loaded_by("db", "current", "--url", "sqlite:///:memory:"))


def test_the_commands_state_the_batch_size_memorm_transfer_uses() -> None:
    assert transfer_cli.DEFAULT_BATCH_SIZE == DEFAULT_BATCH_SIZE
