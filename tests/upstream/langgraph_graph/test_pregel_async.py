"""LangGraph's `tests/test_pregel_async.py` (the `langgraph` sdist) with memorm's saver and store."""

from .suite import GRAPH

globals().update(GRAPH.cases("test_pregel_async"))
