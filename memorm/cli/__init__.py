"""The `memorm` command.

Each module named in `COMMANDS` defines `register(commands)`, which
adds its subcommands (`argparse` subparsers whose `handler` default is an
async function of the parsed arguments).  Registering imports nothing heavy:
SQLAlchemy, alembic, numpy, rich and memorm's services load inside the
handlers, so `memorm --help` and `memorm --version` answer in about a
tenth of a second and each command loads only what it uses
(tests/test_cli_startup.py keeps it so).  Every command takes `--url`
(else `MEMORM_DATABASE_URL`, else `sqlite:///memorm.db`) or URLs as
arguments, and opens them with `memorm.cli.open_database.open_database`.
Errors print one line and exit non-zero; `--debug` shows the traceback.
memorm's warnings (a scrub that could not clean every table) print one
line, `memorm: warning: …`, and leave the exit status alone.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import TextIO

from memorm import __version__

__all__ = ["COMMANDS", "main"]

# The modules that register subcommands, in the order ``memorm --help`` lists them.
COMMANDS = ("db", "demo", "inspect", "legacy", "langgraph", "mcp", "retention", "tenant", "transfer")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memorm", description="memorm: agents' memory in a database.")
    parser.add_argument("--version", action="version", version=f"memorm {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(commands)
    return parser


def _said_in_one_line(error: Exception) -> bool:
    """Whether `error` is one the user can act on from its message alone."""
    from memorm.errors import MemormError

    if isinstance(error, (MemormError, OSError)):
        return True
    # alembic's CommandError (an unknown revision, say): if alembic was never
    # imported, the error cannot be one, and importing it to check costs a second.
    alembic = sys.modules.get("alembic.util.exc")
    return alembic is not None and isinstance(error, alembic.CommandError)


def _one_line(
    show: Callable[..., None],
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """Show a memorm warning as `memorm: warning: …` on stderr; others as Python would."""
    if category.__module__.startswith("memorm."):
        print(f"memorm: warning: {message}", file=sys.stderr)
    else:
        show(message, category, filename, lineno, file, line)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    import asyncio  # after parsing: --help and usage errors need no event loop

    try:
        with warnings.catch_warnings():
            # memorm's warnings (a scrub that skipped tables…) as one line each, every time.
            warnings.filterwarnings("always", category=UserWarning, module=r"memorm\.")
            warnings.showwarning = functools.partial(_one_line, warnings.showwarning)
            result = asyncio.run(args.handler(args))
    except KeyboardInterrupt:
        print("memorm: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        if args.debug or not _said_in_one_line(error):
            raise
        print(f"memorm: error: {error}", file=sys.stderr)
        return 1
    return int(result or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
