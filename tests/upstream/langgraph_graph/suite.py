"""LangGraph's graph tests on memorm: time travel, DeltaChannel forks and subgraph persistence.

The `langgraph` sdist's tests take their checkpointer from the fixtures
`sync_checkpointer` and `async_checkpointer` (LangGraph's in-memory, SQLite
and Postgres savers, parametrised); here those fixtures are `conftest.py`'s, a
`MemormSaver` on a fresh memorm database of each engine.  The modules are the
ones that replay, fork and persist subgraphs through the checkpointer: the
calls issue #31 found `MemormSaver` failing (a listing `before` a config that
names only a checkpoint id).
"""

from __future__ import annotations

from ..fetch import Sdist
from ..loader import Suite, in_worker_thread

__all__ = ["GRAPH"]

MODULES = [
    "test_time_travel",
    "test_time_travel_async",
    "test_delta_channel_fork",
    "test_subgraph_persistence",
    "test_subgraph_persistence_async",
]

GRAPH = Suite(
    Sdist(
        name="langgraph",
        version="1.2.24",
        sha256="86b0dd611b7201cb393da2de0e064029c1bef520f11a5e6ee04be53c2a815bc7",
        members=("tests/__init__.py", "tests/any_str.py", *(f"tests/{module}.py" for module in MODULES)),
    ),
    modules=MODULES,
    wrap=in_worker_thread,  # a sync case's graph.invoke runs on memorm's sync loop, off the test's
)
