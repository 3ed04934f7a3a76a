"""Run memorm's benchmarks and print memorm-vs-raw-driver tables.

::

    python -m benchmarks.run                      # every module, both engines
    python -m benchmarks.run --engine sqlite      # one engine
    python -m benchmarks.run --only core          # some modules (repeat or comma-separate)
    python -m benchmarks.run --quick              # fewer repetitions: a smoke test

Every ``benchmarks/<name>.py`` that defines ``async def run(engines, *, quick=False)``
returning :class:`benchmarks.report.Row` objects is a benchmark module; ``core``
runs first, the rest in name order.  Results are also written as JSON to
``.bench/latest.json`` at the repository root (``--json`` to change it).

Postgres comes from ``MEMORM_BENCH_POSTGRES_URL`` (default
``postgresql+asyncpg://root@127.0.0.1:5432/test``); each module works in a
fresh schema that is dropped afterwards.  With ``--engine all`` an unreachable
Postgres is skipped with a warning; with ``--engine postgres`` it is an error.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import pkgutil
import platform
import sqlite3
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

import benchmarks
from benchmarks.report import Row, print_goals, print_table
from benchmarks.stores import ENGINES, postgres_unavailable

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JSON = ROOT / ".bench" / "latest.json"
NOT_MODULES = {"report", "run", "stores", "timing"}
FIRST = ("core",)


def discover() -> dict[str, ModuleType]:
    """Benchmark modules by name: ``benchmarks/<name>.py`` files that define ``run``."""
    names = sorted(
        info.name
        for info in pkgutil.iter_modules(benchmarks.__path__)
        if not info.ispkg and info.name not in NOT_MODULES and not info.name.startswith("_")
    )
    names.sort(key=lambda name: (FIRST.index(name) if name in FIRST else len(FIRST), name))
    found = {}
    for name in names:
        module = importlib.import_module(f"benchmarks.{name}")
        if callable(getattr(module, "run", None)):
            found[name] = module
    return found


def environment() -> dict[str, Any]:
    """What the numbers depend on, saved beside them."""
    import aiosqlite
    import asyncpg
    import sqlalchemy

    import memorm

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "memorm"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = None, None
    return {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git_commit": commit,
        "memorm_dirty": dirty,
        "memorm": memorm.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "sqlalchemy": sqlalchemy.__version__,
        "asyncpg": asyncpg.__version__,
        "aiosqlite": getattr(aiosqlite, "__version__", None),
        "sqlite": sqlite3.sqlite_version,
    }


async def choose_engines(requested: str) -> list[str]:
    if requested == "sqlite":
        return ["sqlite"]
    reason = await postgres_unavailable()
    if requested == "postgres":
        if reason is not None:
            raise SystemExit(f"error: {reason}")
        return ["postgres"]
    if reason is not None:
        print(f"warning: skipping Postgres: {reason}", file=sys.stderr)
        return ["sqlite"]
    return list(ENGINES)


async def main(argv: Sequence[str] | None = None) -> int:
    modules = discover()
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["sqlite", "postgres", "all"], default="all")
    parser.add_argument(
        "--only",
        action="append",
        metavar="MODULE",
        help=f"run only these modules (repeatable or comma-separated): {', '.join(modules)}",
    )
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, smaller data: a smoke test")
    parser.add_argument(
        "--json", type=Path, default=DEFAULT_JSON, help="results file (default .bench/latest.json)"
    )
    args = parser.parse_args(argv)

    selected = list(modules)
    if args.only:
        selected = [name.strip() for item in args.only for name in item.split(",") if name.strip()]
        unknown = [name for name in selected if name not in modules]
        if unknown:
            parser.error(f"unknown module {', '.join(unknown)}; choose from {', '.join(modules)}")
    engines = await choose_engines(args.engine)

    results: list[Row] = []
    started = time.perf_counter()
    for name in selected:
        module_started = time.perf_counter()
        rows: list[Row] = await modules[name].run(engines, quick=args.quick)
        results += rows
        for engine in [*engines, *sorted({row.engine for row in rows} - set(engines))]:
            engine_rows = [row for row in rows if row.engine == engine]
            if engine_rows:
                where = f" on {engine}" if engine in ENGINES else ""  # startup's rows have no engine
                print_table(f"== {name}{where} ==", engine_rows)
        print(f"\n({name}: {time.perf_counter() - module_started:.1f} s)")
    elapsed = time.perf_counter() - started

    print_goals(results)
    misses = [row for row in results if row.verdict == "MISS"]
    print(f"\n{len(results)} rows in {elapsed:.1f} s; {len(misses)} MISS")
    for row in misses:
        print(f"  MISS {row.module}/{row.engine}: {row.operation}")

    args.json.parent.mkdir(parents=True, exist_ok=True)
    if args.json.parent == DEFAULT_JSON.parent and not (args.json.parent / ".gitignore").exists():
        (args.json.parent / ".gitignore").write_text("*\n")  # results stay out of git
    report = {
        "environment": environment(),
        "engines": engines,
        "modules": selected,
        "quick": args.quick,
        "seconds": elapsed,
        "rows": [row.as_dict() for row in results],
    }
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
