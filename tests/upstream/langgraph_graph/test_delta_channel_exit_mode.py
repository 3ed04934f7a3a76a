"""LangGraph's `tests/test_delta_channel_exit_mode.py` (the `langgraph` sdist) with a `MemormSaver`."""

from .suite import GRAPH

globals().update(GRAPH.cases("test_delta_channel_exit_mode"))
