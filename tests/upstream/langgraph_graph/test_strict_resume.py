"""LangGraph's `tests/test_strict_resume.py` (the `langgraph` sdist) with a `MemormSaver`."""

from .suite import GRAPH

globals().update(GRAPH.cases("test_strict_resume"))
