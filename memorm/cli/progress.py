"""Rich progress bars for the commands' long operations (copies, purges), on stderr.

Not a command (no `register`): `memorm.cli.transfer` and
`memorm.cli.retention` share it.  The bars draw only when stderr is a
terminal, so piped output, cron mail and captured test output stay clean:

```python
with progress_bar() as progress:
    removed = await purge_expired(db, reporter=Bars(progress))
```
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

__all__ = ["Bars", "progress_bar"]


class Bars:
    """A [`Reporter`][memorm.progress.Reporter] drawing one rich progress bar per task."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.tasks: dict[str, TaskID] = {}
        self.done: dict[str, int] = {}  # rows reported per task, for the summary a command prints

    def start(self, task: str, total: int) -> None:
        """Add a bar for `task`, of `total` rows."""
        self.tasks[task] = self.progress.add_task(task, total=total)

    def advance(self, task: str, rows: int) -> None:
        """Move the bar of `task` on by `rows`."""
        self.progress.advance(self.tasks[task], rows)
        self.done[task] = self.done.get(task, 0) + rows


def progress_bar() -> Progress:
    """A rich `Progress` on stderr, disabled when stderr is not a terminal; use it as a context manager."""
    console = Console(stderr=True)
    return Progress(
        TextColumn("{task.description:<18}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not console.is_terminal,
    )
