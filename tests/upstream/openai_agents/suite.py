"""The SDK's session tests on memorm: which sdist, which modules, and the names swapped in them.

``SQLiteSession`` and ``SQLAlchemySession`` make ``MemormSession``s on the
test's memorm database (``sessions.py``); the SDK's sync cases, which call
``asyncio.run`` themselves, run in a worker thread, since memorm's fixtures
are anyio's.  README.md in this folder says why each case left out is.
"""

from __future__ import annotations

from ..fetch import Sdist
from ..loader import Suite, in_worker_thread
from .sessions import SQLAlchemySessions, sqlite_session

__all__ = ["AGENTS"]


# The SDK sessions' own machinery: no name swap gives a MemormSession these.
_NO_CLOSE = "a MemormSession has no close(): it holds no connection"
_CORRUPT = (
    "memorm keeps items in a JSON column, checked on write, so no row holds unparsable JSON; "
    "a row other code wrote reads as its items (test_compat_openai_agents.py::"
    "test_messages_written_through_memorm_read_as_items)"
)
_CONNECTION_SET = "plants a failing sqlite3.Connection in SQLiteSession's private connection set"
_ALONE = "tests SessionSettings alone, no session"
_SAME_AS_SQLITE = "the same case as memory/test_session.py's, run there"
_SQLALCHEMY_FAKES = (
    "fakes SQLAlchemySession's private session factory and dialect flags (concurrent pops: "
    "test_concurrent_pop_item_returns_each_row_once, run here)"
)
_ASCII = (
    "SQLAlchemySession's ensure_ascii option for a text column; memorm stores JSON "
    "(non-ASCII round trips: memory/test_session.py's test_sqlite_session_unicode_content)"
)
_REGISTRY = "SQLAlchemySession's private table-init lock map and engine registry"
_ENGINE = "SQLAlchemySession's engine property"
_ORDER_BY = "inspects SQLAlchemySession's ORDER BY; memorm orders by seq"

# Cases that ran only because the vendored copy rewrote lines inside them (marked "memorm:"): they
# reach the SDK sessions' private state inline, which no name swap reaches.  memorm's own tests of
# the same behaviour are named in each reason.
_REWRITTEN = "asserts on the SDK session's private {what} inside the case; memorm's own {tests}"
_POOLS = (
    "tests/test_compat_openai_agents.py::test_dispose_closes_the_pool_of_a_dead_loop_before_its_own_loop_ends"
)
_EXIT = "tests/test_compat_sync.py::test_a_sync_program_exits_promptly_with_its_pools_closed"
_ROLLBACK = (
    "tests/test_uow.py::test_exception_in_the_body_rolls_back_every_repository_call and "
    "::test_database_without_the_schema_raises_schema_error_naming_the_upgrade_command"
)
_CANCEL = (
    "tests/test_uow.py::test_cancelled_unit_of_work_rolls_back_and_returns_its_connection, "
    "::test_cancelling_mid_statement_never_leaves_the_database_locked and "
    "tests/test_compat_openai_agents.py::test_add_items_cancelled_as_its_commit_fails_raises_the_cancellation"
)
_ORDER = (
    "tests/test_compat_openai_agents.py::test_get_items_matches_the_sdks_sqlite_session and "
    "::test_pop_item_removes_and_returns_the_newest_item (memorm orders by seq, never by timestamp)"
)


def _rewritten(what: str, tests: str) -> str:
    return _REWRITTEN.format(what=what, tests=tests)


_SESSION_LEFT_OUT = {
    "test_sqlite_session_closed_rejects_empty_add_items": _NO_CLOSE,
    "test_sqlite_session_pop_item_skips_corrupt_most_recent": _CORRUPT,
    "test_sqlite_session_pop_item_returns_none_after_dropping_only_corrupt_rows": _CORRUPT,
    "test_sqlite_session_get_items_limit_skips_corrupt_newest_rows": _CORRUPT,
    "test_sqlite_session_get_items_session_settings_limit_skips_corrupt_rows": _CORRUPT,
    "test_sqlite_session_rollback_failure_evicts_connection": _CONNECTION_SET,
    "test_sqlite_session_close_retries_quarantined_connection": _CONNECTION_SET,
    "test_session_settings_resolve": _ALONE,
    "test_sqlite_session_close_closes_worker_thread_connections": _rewritten(
        "sqlite3 connections (session._connections)", f"{_POOLS} and {_EXIT}"
    ),
    "test_sqlite_session_reaps_connections_from_exited_worker_threads": _rewritten(
        "sqlite3 connections", _POOLS
    ),
    "test_sqlite_session_closes_retired_connections_before_the_next_allocation": _rewritten(
        "sqlite3 connections", _POOLS
    ),
    "test_sqlite_session_keeps_connections_of_live_worker_threads": _rewritten("sqlite3 connections", _POOLS),
    "test_sqlite_session_file_lock_is_shared_across_instances": _rewritten(
        "file-lock table",
        "tests/test_compat_openai_agents.py::test_a_hundred_concurrent_sessions_share_one_database",
    ),
    "test_sqlite_session_failed_add_items_releases_write_lock": _rewritten(
        "connection and sqlite3 table (and expects TypeError)",
        "tests/test_compat_openai_agents.py::test_bad_items_raise_before_anything_is_stored",
    ),
    "test_sqlite_session_failed_clear_session_rolls_back": _rewritten("connection and tables", _ROLLBACK),
    "test_sqlite_session_failed_pop_item_releases_write_lock": _rewritten("connection and tables", _ROLLBACK),
    "test_sqlite_session_post_commit_cancellation_propagates_after_known_outcome": _rewritten(
        "sqlite3 connection (a pausing commit)", _CANCEL
    ),
}
_SQLALCHEMY_LEFT_OUT = {
    "test_session_settings_resolve": _SAME_AS_SQLITE,
    "test_sqlalchemy_session_defaults_to_escaped_non_ascii_storage": _ASCII,
    "test_sqlalchemy_session_can_store_non_ascii_without_escaping": _ASCII,
    "test_sqlite_fallback_reserves_writer_before_tail_claim": _SQLALCHEMY_FAKES,
    "test_pop_item_supports_unknown_delete_rowcount": _SQLALCHEMY_FAKES,
    "test_pop_item_retries_returning_claim_lost_to_concurrent_delete": _SQLALCHEMY_FAKES,
    "test_pop_item_skips_corrupt_most_recent": _CORRUPT,
    "test_get_items_limit_skips_corrupt_newest_rows": _CORRUPT,
    "test_pop_item_returns_none_after_dropping_only_corrupt_rows": _CORRUPT,
    "test_create_tables_false_does_not_allocate_shared_init_lock": _REGISTRY,
    "test_sqlite_configuration_registry_releases_collected_engines": _REGISTRY,
    "test_sqlite_configuration_registry_does_not_grow_unbounded": _REGISTRY,
    "test_get_items_orders_by_id_for_ties": _ORDER_BY,
    "test_engine_property_from_url": _ENGINE,
    "test_engine_property_from_external_engine": _ENGINE,
    "test_engine_property_is_read_only": _ENGINE,
    "test_session_settings_default": _SAME_AS_SQLITE,
    "test_get_items_uses_session_settings_limit": _SAME_AS_SQLITE,
    "test_get_items_explicit_limit_overrides_session_settings": _SAME_AS_SQLITE,
    "test_runner_with_session_settings_override": _SAME_AS_SQLITE,
    "test_mutation_cancellation_waits_for_transaction_exit": _rewritten("engine (a pausing commit)", _CANCEL),
    "test_add_items_waits_for_transient_sqlite_write_lock": _rewritten(
        "engine (a raw connection's write lock)",
        "tests/test_retention_locking.py::test_forget_waits_for_a_writer_holding_the_session_instead_of_deadlocking",
    ),
    "test_add_items_cancelled_waiter_does_not_strand_table_init_lock": _rewritten(
        "table-init lock", "tests/test_concurrency_merger.py::test_a_cancelled_waiting_call_is_skipped"
    ),
    "test_get_items_same_timestamp_consistent_order": _rewritten("table (its created_at column)", _ORDER),
    "test_pop_item_same_timestamp_returns_latest": _rewritten("table (its created_at column)", _ORDER),
}

_SQLITE = {"SQLiteSession": sqlite_session}
_SQLALCHEMY = {"SQLAlchemySession": SQLAlchemySessions()}

AGENTS = Suite(
    Sdist(
        name="openai-agents",
        version="0.24.0",
        sha256="4b4b285f4fed81fdf1b4ac426a9101658d9cd29b4fb1aaeee18f639b77e704e3",
        members=(
            "tests/__init__.py",
            "tests/test_responses.py",
            "tests/memory/test_session.py",
            "tests/memory/test_session_limit.py",
            "tests/extensions/memory/test_sqlalchemy_session.py",
        ),
    ),
    modules=["memory.test_session", "memory.test_session_limit", "extensions.memory.test_sqlalchemy_session"],
    substitute={
        "memory.test_session": _SQLITE,
        "memory.test_session_limit": _SQLITE,
        "extensions.memory.test_sqlalchemy_session": _SQLALCHEMY,
    },
    fixtures={"extensions.memory.test_sqlalchemy_session": ["agent"]},
    left_out={
        "memory.test_session": _SESSION_LEFT_OUT,
        "extensions.memory.test_sqlalchemy_session": _SQLALCHEMY_LEFT_OUT,
    },
    wrap=in_worker_thread,
)
