"""Tenants: the owner every row has, and how a unit of work is scoped to one.

A tenant is a non-empty string of at most 128 characters without NUL.
`"default"` is the tenant of code that names none.  The repositories filter
every statement by the unit of work's tenant; on Postgres, row-level
security checks the same thing under them, against the transaction-local
setting `memorm.tenant` that the unit of work sets when its transaction
begins (docs/tenancy.md).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import Session

from memorm.errors import ValidationError

__all__ = ["DEFAULT_TENANT", "MAX_TENANT", "TENANT", "TENANT_SETTING", "TenantSession", "check_tenant"]

DEFAULT_TENANT = "default"
TENANT_SETTING = "memorm.tenant"  # the Postgres setting row-level security compares with
MAX_TENANT = 128  # characters


def check_tenant(value: object, field: str = "tenant") -> str:
    """A tenant name: a non-empty string of at most 128 characters without NUL."""
    if not isinstance(value, str):
        raise ValidationError(f"{field}: expected a string, got {type(value).__name__}")
    if not value:
        raise ValidationError(f"{field}: must not be empty")
    if len(value) > MAX_TENANT:
        raise ValidationError(
            f"{field}: {len(value):,} characters, more than the {MAX_TENANT} a tenant may have"
        )
    if "\x00" in value:
        raise ValidationError(f"{field}: contains a NUL character")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise ValidationError(f"{field}: contains a lone surrogate, which no database can store") from None
    return value


TENANT = "memorm_tenant"  # Session.info: the tenant each transaction sets on Postgres
_SET_TENANT = sa.select(sa.func.set_config(TENANT_SETTING, sa.bindparam("tenant", type_=sa.Text), True))


class TenantSession(Session):
    """The unit of work's session: each transaction it begins first sets `memorm.tenant`.

    Only where `info[TENANT]` is set: on Postgres, for a role subject to
    row-level security.  `set_config(…, true)` lasts until the transaction
    ends, so a pooled connection (or a pgbouncer server connection in
    transaction mode) never carries one tenant into the next transaction.
    """


@event.listens_for(TenantSession, "after_begin")
def _set_tenant(session: Session, transaction: Any, connection: sa.Connection) -> None:
    tenant = session.info.get(TENANT)
    if tenant is not None:
        connection.execute(_SET_TENANT, {"tenant": tenant})
