"""Moving whole databases, or one tenant: copies between engines, JSON Lines export and import.

These are infrastructure, not the agent loop: they read memorm's tables with
SQLAlchemy Core in keyset-paged batches (`memorm.transfer.rows`), write
with the bulk path of `memorm.driver`, and never hold a whole table in
memory.  Rows are keyed by (tenant, id) (the LangGraph tables, the graph
state of the sessions and the agents' long-term store, which have no id, by
their whole primary key): every write skips rows whose key the destination
already has, so an interrupted run can simply be run again.
Each operation takes `tenant=`: one tenant's rows (in units of work of that
tenant), or None for every tenant's (`memorm.transfer.scope`).

Example:
    ```python
    async with Database("sqlite:///agents.db") as src, Database(pg_url) as dst:
        report = await copy_database(src, dst)  # every tenant
        assert not report.problems
        await copy_database(src, dst, tenant="acme")  # one tenant
    ```
"""

from memorm.transfer.copy import CopyReport, copy_database
from memorm.transfer.jsonl import ImportReport, export_jsonl, import_jsonl
from memorm.transfer.rows import DEFAULT_BATCH_SIZE, TABLES, Reporter
from memorm.transfer.verify import TableDigest, compare_digests, digest_database

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "TABLES",
    "CopyReport",
    "ImportReport",
    "Reporter",
    "TableDigest",
    "compare_digests",
    "copy_database",
    "digest_database",
    "export_jsonl",
    "import_jsonl",
]
