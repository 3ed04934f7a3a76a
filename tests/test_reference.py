"""The API reference shows the whole public API, rendered from Google-style docstrings.

A module fixture builds the site once (`mkdocs build --strict`, so broken
links and cross-references fail it); the reference page must then hold an
anchor for every public method of the repositories, `Database` and
`UnitOfWork` (found by introspection, inherited ones included) and for every
name in `memorm.__all__`, and no page may show raw reST.  Other tests read
memorm's sources, so a reST docstring is caught without building anything.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from importlib.util import find_spec
from pathlib import Path

import pytest

import memorm
from memorm.db import Database
from memorm.repositories import (
    AgentRepository,
    CheckpointRepository,
    MessageRepository,
    PassageRepository,
    SessionRepository,
)
from memorm.uow import UnitOfWork

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "memorm").rglob("*.py"))

# Each class as the reference page renders it (its `:::` directive names this path).
DOCUMENTED = {
    AgentRepository: "memorm.repositories.AgentRepository",
    SessionRepository: "memorm.repositories.SessionRepository",
    MessageRepository: "memorm.repositories.MessageRepository",
    PassageRepository: "memorm.repositories.PassageRepository",
    CheckpointRepository: "memorm.repositories.CheckpointRepository",
    Database: "memorm.db.Database",
    UnitOfWork: "memorm.uow.UnitOfWork",
}

# A reST role (`:class:` before its target), which Markdown shows as typed.
ROLE = re.compile(r"(?<![\w:]):(?:class|meth|func|data|mod|attr|exc|obj|const):(?=[`~\w])")


def public_methods(cls: type) -> set[str]:
    """The public methods and properties of `cls`, its own and those inherited from memorm classes."""
    names = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("memorm"):
            continue  # object's, or a framework's
        for name, value in vars(klass).items():
            if name.startswith("_"):
                continue
            if inspect.isfunction(value) or isinstance(value, (property, staticmethod, classmethod)):
                names.add(name)
    return names


def docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each docstring in `path`: modules, classes, functions and attributes."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for index, statement in enumerate(node.body):
            documents = index == 0 or isinstance(node.body[index - 1], (ast.Assign, ast.AnnAssign))
            if (
                documents
                and isinstance(statement, ast.Expr)
                and isinstance(statement.value, ast.Constant)
                and isinstance(statement.value.value, str)
            ):
                found.append((statement.lineno, statement.value.value))
    return found


# -- the sources: no site build needed ----------------------------------------------


def test_the_public_classes_have_public_methods() -> None:
    # Guards the introspection below: a helper that found nothing would pass anything.
    assert {"window", "context", "delete_before", "append"} <= public_methods(MessageRepository)
    assert {"search", "hybrid_search", "get_model", "define_model"} <= public_methods(PassageRepository)
    assert {"commit", "rollback"} <= public_methods(UnitOfWork)


def test_sources_have_no_rest_roles_or_literal_blocks() -> None:
    problems = []
    for path in SOURCES:
        where = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8")
        for match in ROLE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            problems.append(f"{where}:{line}: reST role {match.group()}")
        if "Example::" in text:
            problems.append(f"{where}: reST `Example::`")
        for line, doc in docstrings(path):
            if any(row.rstrip().endswith("::") for row in doc.splitlines()):
                problems.append(f"{where}:{line}: a docstring with a reST literal block (`::`)")
    # Google style for mkdocstrings: [`Name`][memorm.module.Name] or `name` for a
    # reference, an `Example:` section or a ```python fence for code.
    assert not problems, "\n".join(problems)


# -- the built site -------------------------------------------------------------------


class _Page(HTMLParser):
    """The element ids and the visible text of an HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name == "id" and value:
                self.ids.add(value)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def read_page(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The docs site, built once with `mkdocs build --strict` (broken links and refs fail it)."""
    if find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (it comes with the `docs` and `dev` dependency groups)")
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", "mkdocs.yml", "-d", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stdout}\n{built.stderr}"
    return out


@pytest.fixture(scope="module")
def reference(site: Path) -> _Page:
    return read_page(site / "reference" / "index.html")


@pytest.mark.parametrize("cls", list(DOCUMENTED), ids=lambda cls: cls.__name__)
def test_reference_shows_every_public_method(cls: type, reference: _Page) -> None:
    path = DOCUMENTED[cls]
    assert path in reference.ids
    missing = sorted(name for name in public_methods(cls) if f"{path}.{name}" not in reference.ids)
    assert not missing, f"{cls.__name__} methods missing from docs/reference.md: {missing}"


def test_reference_shows_every_name_memorm_exports(reference: _Page) -> None:
    # _EXPORTS maps each exported name to the module that defines it.
    paths = [f"{memorm._EXPORTS[name]}.{name}" for name in memorm.__all__]
    missing = sorted(path for path in paths if path not in reference.ids)
    assert not missing, f"memorm.__all__ names missing from docs/reference.md: {missing}"


def test_no_page_shows_raw_rest(site: Path) -> None:
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 10
    problems = []
    for html in pages:
        where = html.relative_to(site).as_posix()
        text = "".join(read_page(html).text)
        problems += [f"{where}: reST role {role}" for role in sorted(set(ROLE.findall(text)))]
        if "Example::" in text:
            problems.append(f"{where}: a reST `Example::`")
        if "::</p>" in html.read_text(encoding="utf-8"):
            problems.append(f"{where}: a paragraph ending in a reST `::`")
    assert not problems, "\n".join(problems)


# What LangGraph's classes give MemormSaver and MemormStore, and graphs and nodes call.
INHERITED = {
    "memorm.compat.langgraph.MemormSaver": ["get", "aget"],
    "memorm.compat.langgraph_store.MemormStore": [
        *("get", "put", "search", "delete", "list_namespaces"),
        *("aget", "aput", "asearch", "adelete", "alist_namespaces"),
    ],
}


def test_reference_shows_the_langgraph_methods_people_call(reference: _Page) -> None:
    missing = [f"{path}.{name}" for path, names in INHERITED.items() for name in names]
    missing = [anchor for anchor in missing if anchor not in reference.ids]
    assert not missing, f"inherited LangGraph methods missing from docs/reference.md: {missing}"


def test_reference_writes_annotations_as_python_does(reference: _Page) -> None:
    # A class with a `list` method annotates `builtins.list[...]` after it (mypy reads
    # `list` there as the method); the reader should see `list[...]`.
    text = "".join(reference.text)
    assert "list[ScoredPassage]" in text
    assert "builtins." not in text


def test_reference_defines_the_passages_filter(reference: _Page) -> None:
    assert "memorm.search.filters.Filter" in reference.ids
    text = "".join(reference.text)
    assert '{"$in": [value, …]}' in text
