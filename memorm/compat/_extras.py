"""What an adapter raises when its framework is not installed: an `ImportError` naming the extra.

Each adapter imports its framework in a `try` and turns the failure into
this error, so `import memorm.compat.langgraph` without LangGraph says what
to install instead of "No module named 'langgraph'":

```python
try:
    from langgraph.checkpoint.base import BaseCheckpointSaver
except ImportError as error:
    raise missing_extra(__name__, "langgraph", error) from error
```
"""

from __future__ import annotations

__all__ = ["missing_extra"]


def missing_extra(module: str, extra: str, error: ImportError) -> ImportError:
    """The error for `module`, whose framework (memorm's extra `extra`) failed to import with `error`.

    A missing package stays a `ModuleNotFoundError` (and so an `ImportError`:
    code that catches either still does); a package that is there but lacks
    a name is one too old for memorm, and the advice upgrades it.
    """
    if isinstance(error, ModuleNotFoundError):
        return ModuleNotFoundError(
            f"{module} needs memorm's `{extra}` extra: pip install 'memorm[{extra}]' ({error})",
            name=error.name,
        )
    return ImportError(
        f"{module} needs memorm's `{extra}` extra at the versions memorm supports: "
        f"pip install -U 'memorm[{extra}]' ({error})",
        name=error.name,
    )
