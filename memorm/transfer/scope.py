"""Which tenants a transfer moves: one (`"acme"`), or every tenant (None).

Every read and write of a copy, export or import runs in a unit of work of
its scope: one tenant's own (so an application role under row-level security
can move its tenant), or an all-tenants one for None (which on Postgres
needs a role that bypasses row-level security).
"""

from __future__ import annotations

from memorm.db import Database
from memorm.errors import ValidationError
from memorm.tenancy import check_tenant
from memorm.uow import UnitOfWork

__all__ = ["Scope", "check_reach", "check_scope", "scoped"]

Scope = str | None  # a tenant, or None: every tenant


def check_scope(tenant: object) -> Scope:
    """`tenant` checked as a tenant name (None, every tenant, passes).

    Raises:
        ValidationError: `tenant` is neither None nor a valid tenant name.
    """
    return None if tenant is None else check_tenant(tenant)


def check_reach(db: Database, tenant: Scope, *, bypasses: bool | None = None) -> None:
    """Refuse every tenant's rows to a role that sees one tenant at a time (after `check_schema`).

    `bypasses`: whether the role bypasses row-level security, if known
    otherwise (a database without memorm's schema has had no schema check).

    Raises:
        ValidationError: `tenant` is None and `db`'s role is subject to
            row-level security (Postgres).
    """
    if bypasses is None and db.dialect == "postgresql":
        bypasses = db.bypasses_rls
    if tenant is None and db.dialect == "postgresql" and not bypasses:
        raise ValidationError(
            "every tenant's rows need a role that bypasses row-level security (a superuser or one with "
            "BYPASSRLS); this role sees one tenant at a time: name it (--tenant NAME)"
        )


def scoped(db: Database, tenant: Scope, *, read_only: bool = False) -> UnitOfWork:
    """A unit of work of `db` for the scope: `tenant`'s own, or every tenant's for None."""
    if tenant is None:
        return db.unit_of_work(read_only=read_only, all_tenants=True)
    return db.unit_of_work(tenant, read_only=read_only)
