"""LangGraph's store tests on memorm: which sdists, which modules, and the names swapped in them.

Each ``PostgresStore`` / ``AsyncPostgresStore`` / ``InMemoryStore`` the cases
make is a ``MemormStore`` on the test's memorm database (``kit.py``), the
helpers that ran SQL on PostgresStore's ``store`` table run the same statements
on memorm's, and the ``store`` fixture is ``conftest.py``'s.  README.md in this
folder says why each case left out or expected to fail is.
"""

from __future__ import annotations

from typing import Any

from memorm.compat.langgraph import MemormStore

from ..fetch import Sdist
from ..loader import Suite
from . import kit

__all__ = ["BASE", "POSTGRES"]

_INTERNALS = "tests PostgresStore's private SQL helpers, not a store's behaviour"
_PAGINATION = (
    "backdates rows through PostgresStore's private cursor inline in the case; memorm's own "
    "tests/upstream/langgraph_store/test_pagination.py::test_omit_expired_filters_before_the_page_is_cut "
    "pins the same pages"
)


_POSTGRES_STORE: dict[str, Any] = {
    "PostgresStore": MemormStore,  # only type hints, and the xfailed migration case, name it now
    "_create_vector_store": kit.vector_store_context,
    "_expire_now": kit.expire_now_in,
    "_row_exists": kit.row_exists,
    "_stored_expires_at": kit.stored_expires_at,
}
_ASYNC_POSTGRES_STORE: dict[str, Any] = {
    "AsyncPostgresStore": MemormStore,
    "_create_vector_store": kit.avector_store_context,
    "_create_pool_store": None,  # a one-connection psycopg pool: its only case is xfailed
    "_aexpire_now": kit.aexpire_now,
    "_arow_exists": kit.arow_exists,
    "_astored_expires_at": kit.astored_expires_at,
}

# langgraph-checkpoint-postgres: PostgresStore's and AsyncPostgresStore's tests.
POSTGRES = Suite(
    Sdist(
        name="langgraph-checkpoint-postgres",
        version="3.2.0",
        sha256="dffef0e6822d7c614019f7f2c4bdbef42859746aee2d3e6d9d9747cf3744ca90",
        members=(
            "tests/__init__.py",
            "tests/conftest.py",
            "tests/embed_test_utils.py",
            "tests/test_store.py",
            "tests/test_async_store.py",
        ),
    ),
    modules=["conftest", "test_store", "test_async_store"],
    substitute={"test_store": _POSTGRES_STORE, "test_async_store": _ASYNC_POSTGRES_STORE},
    fixtures={
        "test_store": ["vector_store", "conftest.fake_embeddings"],
        "test_async_store": ["vector_store", "conftest.fake_embeddings"],
    },
    left_out={
        "test_store": {"test_omit_expired_search_pagination": _PAGINATION},
        "test_async_store": {"test_omit_expired_search_pagination": _PAGINATION},
    },
    xfail={
        "test_escape_like_literal": _INTERNALS,
        "test_namespace_match_pattern": _INTERNALS,
        "test_nonnull_migrations": "tests PostgresStore.MIGRATIONS: memorm migrates with alembic",
        "test_abatch_uses_single_pool_checkout": "counts PostgresStore's psycopg pool checkouts",
    },
    long=frozenset({"test_store_ttl", "test_large_batches", "test_large_batches_async"}),
)

_HELPERS = "tests LangGraph's own helpers, not a store"

_BASE_LEFT_OUT = {
    "test_async_batch_store_resilience": f"{_HELPERS} (AsyncBatchedBaseStore)",
    "test_async_batch_store": f"{_HELPERS} (AsyncBatchedBaseStore; pytest-mock)",
    "test_async_batch_store_handles_cancellation": f"{_HELPERS} (AsyncBatchedBaseStore)",
    "test_async_batch_store_deduplication": f"{_HELPERS} (AsyncBatchedBaseStore; pytest-mock)",
    "test_dedupe_ops_maps_repeated_reads_and_puts_to_one_op": f"{_HELPERS} (_dedupe_ops)",
    "test_get_text_at_path": f"{_HELPERS} (get_text_at_path)",
    "test_get_text_at_path_with_non_dict_mapping": f"{_HELPERS} (get_text_at_path)",
    "test_validate_op_namespace_rejects_invalid_labels": f"{_HELPERS} (validate_op_namespace)",
    "test_validate_op_namespace_allows_empty_prefix_and_wildcards": f"{_HELPERS} (validate_op_namespace)",
}

# langgraph-checkpoint: InMemoryStore's tests (its other modules test checkpointers and serializers).
BASE = Suite(
    Sdist(
        name="langgraph-checkpoint",
        version="4.3.2",
        sha256="fcab8468c7e965d7055e2a35c253d73a145624ef4728b150ca7c361f4afca286",
        members=("tests/__init__.py", "tests/embed_test_utils.py", "tests/test_store.py"),
    ),
    modules=["test_store"],
    substitute={"test_store": {"InMemoryStore": kit.MemormInMemoryStore}},
    fixtures={"test_store": ["fake_embeddings"]},
    left_out={"test_store": _BASE_LEFT_OUT},
)
