"""LangGraph's graph tests on memorm: replay and forks, DeltaChannels, subgraphs, interrupts.

The `langgraph` sdist's tests take their checkpointer from the fixtures
`sync_checkpointer` and `async_checkpointer` (LangGraph's in-memory, SQLite
and Postgres savers, parametrised); here those fixtures are `conftest.py`'s, a
`MemormSaver` on a fresh memorm database of each engine, and `sync_store` /
`async_store` a `MemormStore` beside it.  The modules are every one of the
sdist's whose cases take a checkpointer or a store.  The first five hold the
calls issue #31 found `MemormSaver` failing (a listing `before` a config that
names only a checkpoint id).
"""

from __future__ import annotations

from ..fetch import Sdist
from ..loader import Suite, in_worker_thread

__all__ = ["GRAPH", "STRICT_MODE"]

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
    "test_pregel",
    "test_pregel_async",
    "test_large_cases",
    "test_large_cases_async",
]

# The helpers and syrupy snapshots the modules import and compare with.
HELPERS = ("any_str", "any_int", "agents", "messages", "fake_chat", "fake_tracer", "memory_assert")
SNAPSHOTS = ("test_pregel", "test_pregel_async", "test_large_cases")

# Cases whose graph state holds types of their own (pydantic models, dataclasses, LangChain's
# agent actions): their graphs compile as under LangGraph's strict mode, which hands the saver
# the types the state schema names (`with_allowlist`); memorm loads no other (conftest.py).
STRICT_MODE = frozenset(
    {
        "test_interrupt_functional_pydantic",
        "test_in_one_fan_out_state_graph_waiting_edge_custom_state_class_pydantic_input",
        "test_conditional_state_graph",
        "test_conditional_graph_state",
    }
)

# Cases that assert wall-clock latency: a streamed chunk within 0.1 s of the graph's start
# (after its first checkpoint is written), two nodes in parallel within 3 s.  On two CPUs shared
# with other lanes they miss by scheduling alone; .ci/run runs them in its timed lanes.
TIMED = frozenset(
    {
        "test_stream_buffering_single_node",
        "test_stream_subgraphs_during_execution",
        "test_parallel_node_execution",
    }
)

GRAPH = Suite(
    Sdist(
        name="langgraph",
        version="1.2.24",
        sha256="86b0dd611b7201cb393da2de0e064029c1bef520f11a5e6ee04be53c2a815bc7",
        members=(
            "tests/__init__.py",
            *(f"tests/{helper}.py" for helper in HELPERS),
            *(f"tests/__snapshots__/{module}.ambr" for module in SNAPSHOTS),
            *(f"tests/{module}.py" for module in MODULES),
        ),
    ),
    modules=MODULES,
    timed=TIMED,
    wrap=in_worker_thread,  # a sync case's graph.invoke runs on memorm's sync loop, off the test's
)
