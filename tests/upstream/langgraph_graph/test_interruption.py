"""LangGraph's `tests/test_interruption.py` (the `langgraph` sdist) with a `MemormSaver`."""

from .suite import GRAPH

globals().update(GRAPH.cases("test_interruption"))
