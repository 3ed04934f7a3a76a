"""LangGraph's graph tests on memorm: replay and forks, DeltaChannels, subgraphs, interrupts.

The `langgraph` sdist's tests take their checkpointer from the fixtures
`sync_checkpointer` and `async_checkpointer` (LangGraph's in-memory, SQLite
and Postgres savers, parametrised); here those fixtures are `conftest.py`'s, a
`MemormSaver` on a fresh memorm database of each engine.  The modules are every
one of the sdist's whose cases take a checkpointer and need nothing more (the
others, `test_pregel*` and `test_large_cases*`, need syrupy and pytest-mock).
The first five hold the calls issue #31 found `MemormSaver` failing (a listing
`before` a config that names only a checkpoint id).
"""

from __future__ import annotations

from ..fetch import Sdist
from ..loader import Suite, in_worker_thread

__all__ = ["ALLOWS_OWN_TYPES", "GRAPH"]

MODULES = [
    "test_time_travel",
    "test_time_travel_async",
    "test_delta_channel_fork",
    "test_subgraph_persistence",
    "test_subgraph_persistence_async",
    "test_checkpoint_migration",
    "test_delta_channel_exit_mode",
    "test_delta_channel_parallel_order",
    "test_delta_channel_subgraph",
    "test_delta_channel_to_plain",
    "test_delta_channel_update_state",
    "test_interrupt_state",
    "test_interruption",
    "test_pydantic",
    "test_strict_resume",
]

# Cases whose functional `entrypoint` keeps a pydantic state of the module's own: LangGraph
# allows such types to its serializer only under LANGGRAPH_STRICT_MSGPACK, so their saver is
# given them (`allowed_types=`), as a memorm user gives theirs.  Every other case's graphs
# allow their types themselves (`StateGraph`'s `with_allowlist`).
ALLOWS_OWN_TYPES = frozenset({"test_interrupt_functional_pydantic"})

GRAPH = Suite(
    Sdist(
        name="langgraph",
        version="1.2.24",
        sha256="86b0dd611b7201cb393da2de0e064029c1bef520f11a5e6ee04be53c2a815bc7",
        members=(
            "tests/__init__.py",
            "tests/any_str.py",
            "tests/any_int.py",
            *(f"tests/{module}.py" for module in MODULES),
        ),
    ),
    modules=MODULES,
    wrap=in_worker_thread,  # a sync case's graph.invoke runs on memorm's sync loop, off the test's
)
