"""memorm's import graph gets no worse than its recorded baseline, and the ratchet only tightens (#29).

The graph is read with `ast` by `tests/tools/import_graph.py`; nothing is imported
and no database is needed. When a refactor removes a cycle, an upward arrow, a
hidden import or a long module, ``python -m tests.tools.import_graph --update``
records the better state.
"""

from __future__ import annotations

import json
from pathlib import Path
from textwrap import dedent

import pytest

from tests.tools.import_graph import BASELINE, ROOT, Import, analyse, compare, to_baseline

UPDATE = "python -m tests.tools.import_graph --update"


@pytest.fixture(scope="module")
def verdict() -> tuple[list[str], list[str]]:
    return compare(analyse(ROOT / "memorm"), json.loads(BASELINE.read_text(encoding="utf-8")))


def test_memorm_imports_are_no_worse_than_the_baseline(verdict: tuple[list[str], list[str]]) -> None:
    worse, _ = verdict
    assert not worse, (
        "memorm's import graph got worse than tests/tools/import_graph_baseline.json "
        "(arrows point down; see docs/reliability.md#structure-the-import-graph):\n  " + "\n  ".join(worse)
    )


def test_baseline_lists_only_what_is_still_there(verdict: tuple[list[str], list[str]]) -> None:
    _, gone = verdict
    assert not gone, f"the import graph got better; record it with `{UPDATE}`:\n  " + "\n  ".join(gone)


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dedent(text), encoding="utf-8")
    return root / "pkg"


# pkg.top -> pkg.low at module level and pkg.low -> pkg.top inside a function: a cycle, and
# an upward arrow. pkg.sub.a imports pkg.top only under TYPE_CHECKING: another upward arrow.
TINY = {
    "pkg/__init__.py": "from pkg.sub.a import thing as thing\n",
    "pkg/top.py": "from pkg import low\n\nVALUE = 1\n",
    "pkg/low.py": """\
        import os


        def late() -> int:
            from . import top

            return top.VALUE
        """,
    "pkg/sub/__init__.py": "from .a import thing as thing\n",
    "pkg/sub/a.py": """\
        from typing import TYPE_CHECKING

        if TYPE_CHECKING:
            from ..top import VALUE
        else:
            import pkg.low.late

        thing = 1
        """,
}
LAYERS = [("pkg.top",), ("pkg", "pkg.sub"), ("pkg.low",)]


def test_analyser_finds_cycles_upward_arrows_and_hidden_imports(tmp_path: Path) -> None:
    report = analyse(_write(tmp_path, TINY), LAYERS, max_lines=5)

    assert report.cycles == [["pkg.low", "pkg.top"]]
    assert report.paths["pkg.low"] == ["pkg.low", "pkg.top", "pkg.low"]
    assert report.upward == [
        Import("pkg.low", "pkg.top", "function"),
        Import("pkg.sub.a", "pkg.top", "type_checking"),
    ]
    assert report.hidden == report.upward
    assert report.long == {"pkg.low": 7, "pkg.sub.a": 8}
    assert report.unlayered == []


def test_analyser_resolves_relative_and_submodule_imports(tmp_path: Path) -> None:
    report = analyse(_write(tmp_path, TINY), LAYERS)
    # `from pkg import low` imports the submodule, `from pkg.sub.a import thing` a name in a
    # module, `from .a import ...` is relative, and `import pkg.low.late` names a function.
    assert {(i.importer, i.imported) for i in report.edges if i.kind == "module"} == {
        ("pkg", "pkg.sub.a"),
        ("pkg.top", "pkg.low"),
        ("pkg.sub", "pkg.sub.a"),
        ("pkg.sub.a", "pkg.low"),
    }
    assert analyse(tmp_path / "pkg", [("pkg.top", "pkg.low")]).unlayered == ["pkg", "pkg.sub", "pkg.sub.a"]


def test_ratchet_fails_on_anything_worse_and_on_anything_gone(tmp_path: Path) -> None:
    package = _write(tmp_path, TINY)
    baseline = to_baseline(analyse(package, LAYERS, max_lines=5))
    assert compare(analyse(package, LAYERS, max_lines=5), baseline) == ([], [])

    # A new module imported (and importing) from inside functions, upward; pkg.top grows.
    _write(tmp_path, {"pkg/sub/b.py": "def f():\n    from pkg import top\n"})
    (package / "top.py").write_text(TINY["pkg/top.py"] * 2)
    (package / "low.py").write_text("def late():\n    import pkg.sub.b\n    from . import top\n")
    worse, gone = compare(analyse(package, LAYERS, max_lines=5), baseline)
    assert worse == [
        "new or larger cycle of 3, new members ['pkg.sub.b']: pkg.low -> pkg.sub.b -> pkg.top -> pkg.low",
        "new upward arrow: pkg.low -> pkg.sub.b (function)",
        "new upward arrow: pkg.sub.b -> pkg.top (function)",
        "new hidden import: pkg.low -> pkg.sub.b (function)",
        "new hidden import: pkg.sub.b -> pkg.top (function)",
        "module too long: pkg.top (6 lines; baseline: not listed)",
    ]
    assert gone == ["no longer too long: pkg.low"]  # the grown cycle is worse, not gone

    # Back as it was, less the cycle: nothing is worse, and the baseline is out of date.
    _write(tmp_path, TINY)
    (package / "sub" / "b.py").unlink()
    (package / "low.py").write_text("import os\n")
    worse, gone = compare(analyse(package, LAYERS, max_lines=5), baseline)
    assert worse == []
    assert gone == [
        "cycle smaller or gone: ['pkg.low', 'pkg.top']",
        "upward arrow gone: pkg.low -> pkg.top (function)",
        "hidden import gone: pkg.low -> pkg.top (function)",
        "no longer too long: pkg.low",
    ]
