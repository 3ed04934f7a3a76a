"""Moving whole databases: copies between engines, JSON Lines export and import.

These are infrastructure, not the agent loop: they read memorm's tables with
SQLAlchemy Core in keyset-paged batches (`memorm.transfer.rows`), write
with the bulk path of `memorm.driver`, and never hold a whole table in
memory.  Every write skips rows whose id the destination already has, so an
interrupted run can simply be run again.

Example:
    ```python
    async with Database("sqlite:///agents.db") as src, Database(pg_url) as dst:
        report = await copy_database(src, dst)
        assert not report.problems
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
