"""InMemoryStore's tests (langgraph-checkpoint 4.3.2, tests/test_store.py), on MemormStore."""

from .suite import BASE

globals().update(BASE.cases("test_store"))
