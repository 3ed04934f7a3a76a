"""LangGraph's `tests/test_subgraph_persistence.py` (the `langgraph` sdist) with a `MemormSaver`."""

from .suite import GRAPH

globals().update(GRAPH.cases("test_subgraph_persistence"))
