"""AsyncPostgresStore's tests (langgraph-checkpoint-postgres 3.2.0, tests/test_async_store.py), on memorm."""

from .suite import POSTGRES

globals().update(POSTGRES.cases("test_async_store"))
