"""memorm's import graph, read with `ast` (nothing is imported): cycles, upward arrows, long modules.

``python -m tests.tools.import_graph`` prints the report; ``--update`` rewrites the
baseline (``import_graph_baseline.json``) that ``tests/test_import_graph.py`` holds
the code to, so that it can only get better (issue #29).

An import is counted wherever it is written: at module level, inside a function
(``function``) or under ``if TYPE_CHECKING:`` (``type_checking``); the last two are
"hidden" imports, and still dependencies. Importing ``memorm.a.b`` also runs
``memorm/a/__init__.py``; that implicit edge is not counted.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BASELINE = Path(__file__).with_name("import_graph_baseline.json")
MAX_LINES = 400
HIDDEN = ("function", "type_checking")

# Top to bottom: a module may import from its own layer and the layers below it.
# A pattern names a module and everything under it; the longest matching pattern wins.
LAYERS: list[tuple[str, ...]] = [
    # Entry points: the command, framework adapters, whole-database copies, the pytest plugin.
    (
        "memorm.cli",
        "memorm.compat",
        "memorm.mcp",
        "memorm.transfer",
        "memorm.legacy",
        "memorm.demo",
        "memorm.testing",
    ),
    ("memorm",),  # the package's re-exports
    ("memorm.db",),  # the public front: units of work, tenant views, whole-database operations
    # Services that run many units of work or reach the whole database, through a protocol
    # (`memorm.uow.UnitsOfWork`, `memorm.engines.Reachable`), not `Database`.
    ("memorm.migrate", "memorm.retention", "memorm.tenants", "memorm.roles", "memorm.health"),
    ("memorm.distribute", "memorm.scrub"),
    ("memorm.uow",),
    ("memorm.checkout",),  # what an open unit of work holds: write lock, turn, connection
    ("memorm.backend",),  # what a database's units of work share
    ("memorm.connections", "memorm.schema_state"),
    ("memorm.repositories",),
    ("memorm.search",),
    # The connection a unit of work runs on, and the statements that go straight to the driver.
    (
        "memorm.link",
        "memorm.driver",
        "memorm.compiled",
        "memorm.connection_state",
        "memorm.unit_state",
        "memorm.engines",
        "memorm.pool_figures",
        "memorm.telemetry",
        "memorm.telemetry_spans",
        "memorm.routing",
        "memorm.translate",
        "memorm.conflicts",
    ),
    ("memorm.models", "memorm.rls"),
    ("memorm.graph_models",),  # the graph tables beside memorm's own
    ("memorm.rows",),  # the tables' base, and how row objects are built
    ("memorm.tenancy",),
    ("memorm.types",),
    ("memorm.graph_values", "memorm.msgpack_read", "memorm.progress", "memorm.tokens", "memorm.embeddings"),
    ("memorm.removal",),  # what deleting rows removed: results the repositories and services return
    ("memorm.config", "memorm.validation", "memorm.concurrency", "memorm.ids", "memorm.page"),
    ("memorm.errors",),
]


@dataclass(frozen=True, order=True)
class Import:
    """One memorm-internal import: ``importer`` imports ``imported``, of one kind."""

    importer: str
    imported: str
    kind: str  # "module", "function" or "type_checking"


@dataclass
class Report:
    """What the graph holds, in plain values (what the baseline records)."""

    edges: list[Import]
    cycles: list[list[str]]  # strongly connected components, each sorted
    upward: list[Import]
    hidden: list[Import]
    long: dict[str, int]
    unlayered: list[str]
    paths: dict[str, list[str]]  # a walk through each component, by first member


def modules(package: Path) -> dict[str, Path]:
    """Every module under ``package`` by dotted name (``pkg/a/__init__.py`` is ``pkg.a``)."""
    found: dict[str, Path] = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(nodes: Iterable[ast.AST], kind: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Each import statement in ``nodes``, with the kind it inherits from where it sits."""
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, kind
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _walk(ast.iter_child_nodes(node), "function")
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _walk(node.body, "function" if kind == "function" else "type_checking")
            yield from _walk(node.orelse, kind)
        else:
            yield from _walk(ast.iter_child_nodes(node), kind)


def imports_of(name: str, path: Path, known: Iterable[str]) -> set[Import]:
    """The imports ``name`` (at ``path``) makes of the modules in ``known``."""
    known = set(known)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[Import] = set()
    for statement, kind in _walk(ast.parse(path.read_text(encoding="utf-8")).body, "module"):
        targets: list[str] = []
        if isinstance(statement, ast.Import):
            targets = [alias.name for alias in statement.names]
        else:
            base = statement.module or ""
            if statement.level:  # `from .. import x` in pkg/a/b.py is `from pkg import x`
                anchor = package.rsplit(".", statement.level - 1)[0]
                base = f"{anchor}.{base}" if base else anchor
            for alias in statement.names:
                # `from pkg import sub` imports the submodule; `from pkg import name` only pkg.
                targets.append(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
        for target in targets:
            while target and target not in known:  # `import pkg.a.b` of a name inside a module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(Import(name, target, kind))
    return found


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the components with more than one module, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def _nearest(start: str, targets: set[str], graph: dict[str, set[str]], within: set[str]) -> list[str]:
    """A shortest path from ``start`` (left out) to the first of ``targets`` it reaches."""
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph.get(node, set()) & within):
            if nxt in targets:
                path = [nxt, node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return path[-2::-1]
            if nxt not in came_from:
                came_from[nxt] = node
                queue.append(nxt)
    raise ValueError(f"{start} reaches none of {sorted(targets)}")


def cycle_path(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A closed walk from ``component[0]`` through every member and back, short hops first."""
    within = set(component)
    path, left = [component[0]], within - {component[0]}
    while left:
        path += _nearest(path[-1], left, graph, within)
        left -= set(path)
    return path + _nearest(path[-1], {component[0]}, graph, within)


def layer_of(module: str, layers: Sequence[tuple[str, ...]]) -> int | None:
    """The index of ``module``'s layer (0 is the top), by its longest matching pattern."""
    best: tuple[int, int] | None = None
    for number, patterns in enumerate(layers):
        for pattern in patterns:
            if (module == pattern or module.startswith(pattern + ".")) and (
                best is None or len(pattern) > best[0]
            ):
                best = (len(pattern), number)
    return None if best is None else best[1]


def analyse(package: Path, layers: Sequence[tuple[str, ...]] = LAYERS, max_lines: int = MAX_LINES) -> Report:
    """Read every module of ``package`` and measure its import graph."""
    found = modules(package)
    edges = sorted(set().union(*(imports_of(name, path, found) for name, path in found.items())))
    graph: dict[str, set[str]] = {name: set() for name in found}
    for edge in edges:
        graph[edge.importer].add(edge.imported)
    cycles = strongly_connected(graph)
    level = {name: layer_of(name, layers) for name in found}
    upward = [
        edge
        for edge in edges
        if (a := level[edge.importer]) is not None and (b := level[edge.imported]) is not None and b < a
    ]
    lengths = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in found.items()}
    return Report(
        edges=edges,
        cycles=cycles,
        upward=upward,
        hidden=[edge for edge in edges if edge.kind in HIDDEN],
        long={name: n for name, n in sorted(lengths.items()) if n > max_lines},
        unlayered=sorted(name for name, number in level.items() if number is None),
        paths={c[0]: cycle_path(c, graph) for c in cycles},
    )


def _arrow(edge: Import) -> str:
    return f"{edge.importer} -> {edge.imported} ({edge.kind})"


def to_baseline(report: Report) -> dict[str, Any]:
    """The report as the JSON the baseline file holds."""
    return {
        "cycles": report.cycles,
        "upward": sorted({_arrow(edge) for edge in report.upward}),
        "hidden": sorted({_arrow(edge) for edge in report.hidden}),
        "long": report.long,
    }


def compare(report: Report, baseline: dict[str, Any]) -> tuple[list[str], list[str]]:
    """``(worse, stale)``: what got worse than ``baseline``, and what it lists that has gone."""
    now = to_baseline(report)
    worse = [f"module in no layer (add it to LAYERS): {name}" for name in report.unlayered]
    before, after = [set(c) for c in baseline["cycles"]], [set(c) for c in report.cycles]
    for component in report.cycles:
        if not any(set(component) <= old for old in before):
            new = sorted(set(component) - set().union(*before)) or "none (cycles merged)"
            walk = " -> ".join(report.paths[component[0]])
            worse.append(f"new or larger cycle of {len(component)}, new members {new}: {walk}")
    # A cycle that shrank, split or went; one that grew is reported above, as worse.
    stale = [f"cycle smaller or gone: {c}" for c in baseline["cycles"] if not any(set(c) <= a for a in after)]
    for key, label in (("upward", "upward arrow"), ("hidden", "hidden import")):
        worse += [f"new {label}: {arrow}" for arrow in now[key] if arrow not in baseline[key]]
        stale += [f"{label} gone: {arrow}" for arrow in baseline[key] if arrow not in now[key]]
    for name, lines in now["long"].items():
        if lines > baseline["long"].get(name, 0):
            was = baseline["long"].get(name, "not listed")
            worse.append(f"module too long: {name} ({lines} lines; baseline: {was})")
    stale += [f"no longer too long: {name}" for name in baseline["long"] if name not in now["long"]]
    return worse, stale


def render(report: Report) -> str:
    """The report, for people."""
    lines = [f"Cycles ({len(report.cycles)}, {sum(map(len, report.cycles))} modules):"]
    for component in report.cycles:
        lines.append(f"  [{len(component)}] " + " -> ".join(report.paths[component[0]]))
        lines.append("      members: " + ", ".join(component))
    lines.append(f"Upward arrows ({len(report.upward)}):")
    lines += [f"  {_arrow(edge)}" for edge in report.upward]
    counts = {kind: sum(edge.kind == kind for edge in report.hidden) for kind in HIDDEN}
    lines.append(
        f"Hidden imports ({len(report.hidden)}: {counts['function']} in functions, "
        f"{counts['type_checking']} under TYPE_CHECKING):"
    )
    lines += [f"  {_arrow(edge)}" for edge in report.hidden]
    lines.append(f"Modules over {MAX_LINES} lines ({len(report.long)}):")
    lines += [f"  {n:5d}  {name}" for name, n in sorted(report.long.items(), key=lambda item: -item[1])]
    if report.unlayered:
        lines.append("Modules in no layer: " + ", ".join(report.unlayered))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.tools.import_graph", description=__doc__)
    parser.add_argument("--update", action="store_true", help=f"rewrite {BASELINE.name} to the current graph")
    args = parser.parse_args(argv)
    report = analyse(ROOT / "memorm")
    print(render(report))
    if args.update:
        BASELINE.write_text(json.dumps(to_baseline(report), indent=2) + "\n", encoding="utf-8")
        print(f"\nwrote {BASELINE.relative_to(ROOT)}")
        return 0
    worse, stale = compare(report, json.loads(BASELINE.read_text(encoding="utf-8")))
    for heading, items in (
        ("Worse than the baseline", worse),
        ("Better than the baseline (record it with --update)", stale),
    ):
        if items:
            print(f"\n{heading}:\n  " + "\n  ".join(items))
    return 1 if worse or stale else 0


if __name__ == "__main__":
    sys.exit(main())
