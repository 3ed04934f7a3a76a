"""Import an upstream project's test modules from its unpacked sdist, and adapt them by name.

Upstream tests import their helpers as ``tests.<module>`` (their repository's
``tests`` package).  ``import_tests`` imports the wanted modules with a
``tests`` package pointing at the unpacked tree, then takes every ``tests.*``
module back out of ``sys.modules`` (ours and other sdists' ``tests`` never
meet).  ``Suite.cases`` then swaps names in the imported module's namespace
(the functions read their globals there) and hands the wrapper module the
cases to collect, marked for memorm's runner.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest

from .fetch import Sdist, UnavailableError, unpacked

__all__ = ["LEFT_OUT", "Suite", "import_tests", "in_worker_thread"]

# The name, in a wrapper module, of its {case: reason} to deselect (conftest.py reads it).
LEFT_OUT = "UPSTREAM_LEFT_OUT"


def in_worker_thread(case: Callable[..., Any]) -> Callable[..., Any]:
    """An async case that runs the sync ``case`` in a worker thread (it may call ``asyncio.run``)."""

    @functools.wraps(case)
    async def run(*args: Any, **kwargs: Any) -> Any:
        return await anyio.to_thread.run_sync(functools.partial(case, *args, **kwargs))

    return run


@contextmanager
def _upstream_tests_package(root: Path, stubs: Mapping[str, types.ModuleType]) -> Iterator[None]:
    ours = {
        name: sys.modules.pop(name)
        for name in list(sys.modules)
        if name == "tests" or name.startswith("tests.")
    }
    package = types.ModuleType("tests")
    package.__path__ = [str(root / "tests")]
    sys.modules["tests"] = package
    added = [name for name in stubs if name not in sys.modules]
    sys.modules.update({name: stubs[name] for name in added})
    try:
        yield
    finally:
        for name in [name for name in sys.modules if name == "tests" or name.startswith("tests.")]:
            del sys.modules[name]
        for name in added:
            del sys.modules[name]
        sys.modules.update(ours)


def import_tests(
    root: Path, names: list[str], stubs: Mapping[str, types.ModuleType]
) -> dict[str, types.ModuleType]:
    """The modules ``tests.<name>`` of the tree at ``root`` and the helpers they import, by short name.

    ``stubs``: modules lent for the import only.
    """
    with _upstream_tests_package(root, stubs):
        for name in names:
            importlib.import_module(f"tests.{name}")
        return {
            name.removeprefix("tests."): module
            for name, module in sys.modules.items()
            if name.startswith("tests.") and (getattr(module, "__file__", None) or "").startswith(str(root))
        }


@dataclass
class Suite:
    """One upstream sdist's test modules, and how they run on memorm.

    Keyed by module (as in ``modules``): ``substitute`` holds the names swapped
    in its namespace after import, ``fixtures`` the upstream fixtures its
    wrapper keeps (``"conftest.name"``: another module's), ``left_out`` its
    cases deselected, each with the reason.  ``xfail`` maps a case to the
    reason it is expected to fail (not run); ``long`` names the cases that only
    ``-m long`` runs; ``timed`` those that assert wall-clock latency (marked
    ``timed``: .ci/run runs them in its timed lanes, where the CPUs are theirs);
    ``stubs`` are modules lent to the import only.
    """

    sdist: Sdist
    modules: list[str]
    substitute: dict[str, dict[str, Any]] = field(default_factory=dict)
    fixtures: dict[str, list[str]] = field(default_factory=dict)
    left_out: dict[str, dict[str, str]] = field(default_factory=dict)
    xfail: dict[str, str] = field(default_factory=dict)
    long: frozenset[str] = frozenset()
    timed: frozenset[str] = frozenset()
    stubs: dict[str, types.ModuleType] = field(default_factory=dict)
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None  # applied to the sync cases
    _loaded: dict[str, types.ModuleType] | None = None
    _unavailable: str | None = None

    def cases(self, module: str) -> dict[str, Any]:
        """What a wrapper module collects from ``tests/<module>.py``: its cases, marked, and kept fixtures.

        Without the sdist the wrapper is skipped; under ``MEMORM_REQUIRE_POSTGRES=1``
        (CI) the collection fails instead.
        """
        if self._loaded is None and self._unavailable is None:
            try:
                self._loaded = import_tests(unpacked(self.sdist), self.modules, self.stubs)
            except (UnavailableError, OSError) as error:  # tried once per process: every wrapper says why
                self._unavailable = f"upstream tests unavailable ({self.sdist.spec}): {error}"
        if self._loaded is None:
            if os.environ.get("MEMORM_REQUIRE_POSTGRES") == "1":
                pytest.fail(f"MEMORM_REQUIRE_POSTGRES=1 but {self._unavailable}", pytrace=False)
            pytest.skip(str(self._unavailable), allow_module_level=True)
        upstream = self._loaded[module]
        vars(upstream).update(self.substitute.get(module, {}))
        found: dict[str, Any] = {}
        for kept in self.fixtures.get(module, []):  # "name", or "module.name" for another module's
            home, _, name = kept.rpartition(".")
            found[name] = getattr(self._loaded[home] if home else upstream, name)
        for name, case in vars(upstream).items():
            if name.startswith("test") and inspect.isfunction(case) and case.__module__ == upstream.__name__:
                found[name] = self._marked(name, case)
        found[LEFT_OUT] = {
            name: reason for name, reason in self.left_out.get(module, {}).items() if name in found
        }
        return found

    @contextmanager
    def importable(self) -> Iterator[None]:
        """The sdist's modules importable by their own names (``tests.<module>``) meanwhile.

        Upstream runs its cases with its modules imported; a value that names a class
        of one (a pickle-free serializer's ``(module, name)``) loads it from there.
        ``import_tests`` took them back out of ``sys.modules``; this puts them in for a case.
        """
        loaded = {f"tests.{name}": module for name, module in (self._loaded or {}).items()}
        clash = [name for name in loaded if sys.modules.get(name) not in (None, loaded[name])]
        if clash:
            raise LookupError(f"{', '.join(clash)} name other modules here than {self.sdist.spec}'s")
        added = [name for name in loaded if name not in sys.modules]
        sys.modules.update({name: loaded[name] for name in added})
        try:
            yield
        finally:
            for name in added:
                del sys.modules[name]

    def _marked(self, name: str, case: Callable[..., Any]) -> Callable[..., Any]:
        marks = [mark for mark in getattr(case, "pytestmark", []) if mark.name != "asyncio"]
        if self.wrap is not None and not inspect.iscoroutinefunction(case):
            case = self.wrap(case)
        # Upstream runs coroutine cases on pytest-asyncio; memorm's fixtures are anyio's.
        if inspect.iscoroutinefunction(case):
            marks.append(pytest.mark.anyio.mark)
        if name in self.long:
            marks.append(pytest.mark.long.mark)
        if name in self.timed:
            marks.append(pytest.mark.timed.mark)
        if name in self.xfail:
            marks.append(pytest.mark.xfail(reason=self.xfail[name], run=False).mark)
        case.pytestmark = marks  # type: ignore[attr-defined]
        return case
