"""`--tenant NAME`: what `stats`, `purge` and `forget` work on, one tenant or every tenant.

Not a command (no `register`).  With `--tenant`, a command runs in that
tenant (`db.for_tenant(NAME)`); without it, across every tenant, which on
Postgres needs a role that bypasses row-level security.  `every_tenant`
checks that first and says so in one line, naming `--tenant` as the way
out, instead of letting the first all-tenants unit of work refuse:

```python
async with open_database(args.url) as db:
    view, every = await tenant_scope(db, args.tenant, "purge")
    removed = await purge_expired(view, all_tenants=every)
```
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from memorm.errors import ValidationError

if TYPE_CHECKING:
    from memorm.db import Database

__all__ = ["add_tenant_option", "every_tenant", "tenant_flag", "tenant_name", "tenant_scope"]


def tenant_name(text: str) -> str:
    """An argparse type: a tenant's name (1 to 128 characters, no NUL)."""
    from memorm.tenancy import check_tenant  # only when a tenant is given: it imports SQLAlchemy

    try:
        return check_tenant(text)
    except ValidationError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("tenant: ")) from None


def add_tenant_option(command: argparse.ArgumentParser, what: str) -> None:
    """Add `--tenant NAME` to `command`, whose help says it scopes `what`."""
    command.add_argument(
        "--tenant",
        type=tenant_name,
        metavar="NAME",
        help=f"only this tenant's {what} (default: every tenant's; on Postgres that needs "
        "a role that bypasses row-level security)",
    )


async def every_tenant(db: Database, command: str) -> None:
    """Refuse, in one line, to run `command` across tenants with a role that sees one at a time."""
    await db.check_schema()  # which also learns whether the role bypasses row-level security
    if db.dialect == "postgresql" and not db.bypasses_rls:
        raise ValidationError(
            f"`memorm {command}` reads every tenant, but this role is subject to row-level security "
            "and sees one tenant at a time: connect as a superuser or a BYPASSRLS role"
            + ("" if command.startswith("tenant") else ", or give --tenant NAME")
        )


async def tenant_scope(db: Database, tenant: str | None, command: str) -> tuple[Database, bool]:
    """The database `command` runs on and whether across every tenant: `tenant`'s view, or all of them."""
    if tenant is not None:
        return db.for_tenant(tenant), False
    await every_tenant(db, command)
    return db, True


def tenant_flag(tenant: str | None) -> str:
    """` --tenant NAME`, quoted for a shell, or nothing: for hints that name a command to run."""
    import shlex

    return "" if tenant is None else f" --tenant {shlex.quote(tenant)}"
