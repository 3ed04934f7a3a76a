"""Every ``python`` example in README.md and docs/ runs, on both engines, twice.

Each page's examples run in order, in-process, against a fresh database named
by ``MEMORM_DATABASE_URL`` (the examples use ``Database()``'s default): a SQLite
file, or a throwaway Postgres database (a URL cannot carry a search_path).
Then they run again in the same directory against the same database, as a
reader pasting an example twice would: no name may be taken, no total grown.

What the docs quote of memorm's migrations and messages is checked against
the real thing, so a new migration without a docs update fails here.
"""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory

from memorm.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def examples(page: Path) -> list[str]:
    return BLOCK.findall(page.read_text(encoding="utf-8"))


def test_docs_have_examples() -> None:
    assert sum(len(examples(page)) for page in PAGES) >= 8


@pytest.mark.parametrize(
    "page", [p for p in PAGES if examples(p)], ids=lambda p: p.relative_to(ROOT).as_posix()
)
def test_page_examples_run_twice(
    page: Path, plain_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if page.name == "adk.md" and sys.version_info < (3, 11):
        pytest.skip("google-adk needs Python 3.11+")
    monkeypatch.setenv("MEMORM_DATABASE_URL", plain_url)
    monkeypatch.chdir(tmp_path)
    for run in (1, 2):
        for number, source in enumerate(examples(page), start=1):
            code = compile(source, f"{page.name} example {number} (run {run})", "exec")
            # As a script runs: its module is __main__, so what names its classes (LangGraph's
            # serializer stores a type as its module and name) finds them there.
            script = types.ModuleType("__main__")
            monkeypatch.setitem(sys.modules, "__main__", script)
            exec(code, script.__dict__)


def revisions() -> list[tuple[str, str]]:
    """Each revision in migrations/versions, oldest first, with its docstring's summary."""
    scripts = ScriptDirectory(str(ROOT / "migrations"))
    return [(script.revision, " ".join(script.doc.split())) for script in scripts.walk_revisions()][::-1]


def test_migrations_page_lists_every_revision_with_its_summary() -> None:
    page = (ROOT / "docs" / "migrations.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(\w+)` \| ([^|]*) \| ([^|]*) \|$", page, re.MULTILINE)
    assert [(revision, summary.replace("`", "").strip()) for revision, summary, _ in rows] == revisions()
    assert all(detail.strip() for _, _, detail in rows)


def test_cli_page_quotes_the_real_export_header_and_revision_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # SQLite only: the header and the revision check do not depend on the engine.
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8").splitlines()
    url = f"sqlite:///{tmp_path / 'memory.db'}"
    monkeypatch.chdir(tmp_path)
    assert main(["db", "upgrade", "--url", url]) == 0
    assert main(["export", url, "memory.jsonl"]) == 0
    header, *rest = Path("memory.jsonl").read_text(encoding="utf-8").splitlines()
    real = json.loads(header)
    shown = json.loads(next(line for line in page if line.startswith('{"memorm":')))
    assert (list(shown), shown["memorm"], shown["revision"], shown["tenant"], list(shown["tables"])) == (
        list(real),
        real["memorm"],
        real["revision"],
        real["tenant"],
        list(real["tables"]),
    )

    # The documented refusal, for the documented (newer) revision, word for word.
    error = next(line for line in page if line.startswith("memorm: error: memory.jsonl comes from"))
    newer = re.search(r"revision '(\w+)'", error)
    assert newer is not None
    Path("memory.jsonl").write_text(
        "\n".join([json.dumps({**real, "revision": newer[1]}), *rest]) + "\n", encoding="utf-8"
    )
    capsys.readouterr()
    assert main(["import", url, "memory.jsonl"]) == 1
    assert capsys.readouterr().err.strip() == error
