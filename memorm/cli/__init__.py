"""The ``memorm`` command.

Each module in this package that defines ``register(commands)`` adds its
subcommands (``argparse`` subparsers whose ``handler`` default is an async
function of the parsed arguments).  Every command takes ``--url`` (else
``MEMORM_DATABASE_URL``, else ``sqlite:///memorm.db``).  Errors print one line
and exit non-zero; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import pkgutil
import sys
from collections.abc import Sequence

from alembic.util import CommandError

from memorm.errors import MemormError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memorm", description="memorm: agents' memory in a database.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        register = getattr(importlib.import_module(f"{__name__}.{module.name}"), "register", None)
        if register is not None:
            register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        result = asyncio.run(args.handler(args))
    except (MemormError, OSError, CommandError) as error:  # alembic's: an unknown revision, say
        if args.debug:
            raise
        print(f"memorm: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("memorm: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
