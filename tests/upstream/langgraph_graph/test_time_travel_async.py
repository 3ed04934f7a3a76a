"""LangGraph's `tests/test_time_travel_async.py` (the `langgraph` sdist) with a `MemormSaver`."""

from .suite import GRAPH

globals().update(GRAPH.cases("test_time_travel_async"))
