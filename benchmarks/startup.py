"""Start-up: how long the ``memorm`` command and ``import memorm`` take in a fresh process.

Each case runs as a new process, ``REPEATS`` times, the cases taking turns so
that a change in the machine's load reaches all of them alike (after one
round that is not counted, to warm the file cache).  The median wall time of
each is reported as is: there is no raw-driver side to compare with, so the
reference is the bare interpreter, ``python -c pass``, measured in the same
run.  ``memorm --help`` and ``memorm --version`` have a target: under 0.5 s
(they import no database library; tests/test_cli_startup.py checks that).
The engine does not matter here; ``db current`` reads a SQLite file.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.report import Row
from benchmarks.timing import Samples

REPEATS = 20
QUICK_REPEATS = 5
TARGET_SECONDS = 0.5
ENGINE = "any"  # rows of no engine in particular


def memorm_command() -> list[str]:
    """The installed ``memorm`` script beside this interpreter, else the same entry point through ``-c``."""
    script = Path(sys.executable).with_name("memorm")
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from memorm.cli import main; sys.exit(main())"]


def cases(url: str) -> dict[str, list[str]]:
    """The command lines timed, by the name their row gets."""
    memorm = memorm_command()
    return {
        "python -c pass (reference)": [sys.executable, "-c", "pass"],
        "python -c 'import memorm'": [sys.executable, "-c", "import memorm"],
        "python -c 'from memorm import Database'": [sys.executable, "-c", "from memorm import Database"],
        "memorm --version": [*memorm, "--version"],
        "memorm --help": [*memorm, "--help"],
        "memorm db current (upgraded SQLite file)": [*memorm, "db", "current", "--url", url],
    }


def once(argv: Sequence[str]) -> float:
    """Wall seconds of one run of ``argv``, which must succeed."""
    started = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return seconds


def row(name: str, samples: Samples) -> Row:
    result = Row("startup", ENGINE, name, memorm=samples)
    if name in ("memorm --help", "memorm --version"):
        result.status = "PASS" if samples.median < TARGET_SECONDS else "MISS"
        result.note = f"target: median under {TARGET_SECONDS} s"
    return result


async def run(engines: Sequence[str], *, quick: bool = False) -> list[Row]:
    repeats = QUICK_REPEATS if quick else REPEATS
    with tempfile.TemporaryDirectory(prefix="memorm-bench-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'startup.db'}"
        once([*memorm_command(), "db", "upgrade", "--url", url])
        commands = cases(url)
        samples = {name: Samples() for name in commands}
        for argv in commands.values():
            once(argv)  # warm-up, not counted
        for _ in range(repeats):
            for name, argv in commands.items():
                samples[name].add(once(argv))
    return [row(name, found) for name, found in samples.items()]
