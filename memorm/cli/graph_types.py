"""`--allow-type MODULE.NAME`: a type of your own that imported graph state may name.

Not a command (no `register`).  `memorm import` and `memorm import-langgraph`
refuse a LangGraph value naming a callable that is neither a type
LangGraph's graphs store nor one given here (see `memorm.graph_values`):
loading it would call that name.  The option is repeated, one type each, as
the refusal names it (`mypkg.models.Profile`).
"""

from __future__ import annotations

import argparse

from memorm.errors import ValidationError

__all__ = ["add_allow_type_option", "type_name"]


def type_name(text: str) -> str:
    """An argparse type: `module.Name`, a class a graph's state holds."""
    from memorm.graph_values import allowed_types

    try:
        allowed_types([text], "--allow-type")
    except ValidationError:
        raise argparse.ArgumentTypeError(
            f"expected MODULE.NAME (e.g. mypkg.models.Profile), got {text!r}"
        ) from None
    return text


def add_allow_type_option(command: argparse.ArgumentParser) -> None:
    """Add `--allow-type MODULE.NAME` (repeatable; `args.allow_type`, a list or None) to `command`."""
    command.add_argument(
        "--allow-type",
        action="append",
        type=type_name,
        metavar="MODULE.NAME",
        help="a type of your own that the graph state holds (a pydantic model, dataclass, enum…), "
        "which its values may name; repeat for each. Values naming anything else but LangGraph's "
        "own types are refused: loading them would call that name",
    )
