"""Running ``memorm`` in-process from a plain test function, for the CLI tests.

``main`` runs its own event loop, so the CLI tests are plain functions that
build and read their data with ``run`` (``asyncio.run``).
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from rich.console import Console
from rich.progress import Progress

from memorm.cli import main
from memorm.cli import progress as progress_cli

T = TypeVar("T")


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


def memorm(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``memorm ARGV``: its exit status, stdout and stderr."""
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Runs a command argparse must refuse (exit 2); returns its error line."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    assert exited.value.code == 2, argv
    err = capsys.readouterr().err
    assert "error:" in err, err
    return err


def drawn_progress(monkeypatch: pytest.MonkeyPatch) -> list[Progress]:
    """The progress bars the next commands draw, as if stderr were a terminal (one `Progress` each)."""
    bars: list[Progress] = []

    def terminal_bar() -> Progress:
        bars.append(Progress(console=Console(file=io.StringIO(), force_terminal=True)))
        return bars[-1]

    monkeypatch.setattr(progress_cli, "progress_bar", terminal_bar)  # the handlers import it when they run
    return bars
