"""LangGraph's `tests/test_checkpoint_migration.py` (the `langgraph` sdist) with a `MemormSaver`."""

from .suite import GRAPH

globals().update(GRAPH.cases("test_checkpoint_migration"))
