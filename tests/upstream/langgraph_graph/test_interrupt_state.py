"""LangGraph's `tests/test_interrupt_state.py` (the `langgraph` sdist) with a `MemormSaver`."""

from .suite import GRAPH

globals().update(GRAPH.cases("test_interrupt_state"))
