"""Row-level security on Postgres: every tenant table shows a unit of work its tenant's rows only.

Each table has row-level security enabled and forced (the tables' owner is
subject to it too) and one policy, `memorm_tenant`, that lets a statement
read and write only rows whose `tenant` equals the transaction-local setting
`memorm.tenant`.  The unit of work sets it when its transaction begins; a
connection without it sees no row and can write none.  Superusers and roles
with `BYPASSRLS` are not subject to policies (Postgres' rule): they are for
migrations and cross-tenant maintenance, never for the application
(docs/tenancy.md).  Migration 0008 creates the same objects (its own frozen
copy of these statements), 0012 for the graph-state tables, 0013 for the graph
store's; `memorm.migrate.create_all` runs them too, on the tables it makes.
"""

from __future__ import annotations

import sqlalchemy as sa

from memorm.models import TABLES
from memorm.tenancy import TENANT_SETTING

__all__ = ["POLICY", "TENANT_TABLES", "policy_statements"]

POLICY = "memorm_tenant"
TENANT_TABLES: tuple[sa.Table, ...] = TABLES  # every table of memorm's holds a tenant's rows
_OWN = f"tenant = current_setting('{TENANT_SETTING}', true)"


def policy_statements(table: str) -> list[str]:
    """The row-level security DDL of one table."""
    return [
        f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY",
        f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY",
        f"CREATE POLICY {POLICY} ON {table} USING ({_OWN}) WITH CHECK ({_OWN})",
    ]
