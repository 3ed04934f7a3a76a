"""PostgresStore's tests (langgraph-checkpoint-postgres 3.2.0, tests/test_store.py), on MemormStore."""

from .suite import POSTGRES

globals().update(POSTGRES.cases("test_store"))
