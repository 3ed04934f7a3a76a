"""Every ``python`` example in README.md and docs/ runs, on both engines, twice.

Each page's examples run in order, in-process, against a fresh database named
by ``MEMORM_DATABASE_URL`` (the examples use ``Database()``'s default): a SQLite
file, or a throwaway Postgres database (a URL cannot carry a search_path).
Then they run again in the same directory against the same database, as a
reader pasting an example twice would: no name may be taken, no total grown.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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
    monkeypatch.setenv("MEMORM_DATABASE_URL", plain_url)
    monkeypatch.chdir(tmp_path)
    for run in (1, 2):
        for number, source in enumerate(examples(page), start=1):
            code = compile(source, f"{page.name} example {number} (run {run})", "exec")
            exec(code, {"__name__": "__main__"})
