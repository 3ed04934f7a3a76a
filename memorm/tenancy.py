"""Tenants: the owner every row has, and how a unit of work is scoped to one.

A tenant is a non-empty string of at most 128 characters without NUL.
`"default"` is the tenant of code that names none.  The repositories filter
every statement by the unit of work's tenant; on Postgres, row-level
security checks the same thing under them, against the transaction-local
setting `memorm.tenant` that the unit of work sets when its transaction
begins (docs/tenancy.md).
"""

from __future__ import annotations

from memorm.errors import ValidationError

__all__ = [
    "DEFAULT_TENANT",
    "MAX_TENANT",
    "TENANT_SETTING",
    "begin_statements",
    "check_tenant",
]

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


def begin_statements(tenant: str, *, read_only: bool, distributed: bool = False) -> tuple[str, ...]:
    """`BEGIN` and the tenant's setting, as simple-protocol messages (one round trip each).

    The tenant travels hex-encoded (UTF-8), so the statement holds only
    hex digits from it, whatever characters the name has: one message on a
    single server.  On a Citus cluster the setting must reach the workers
    that run the shard queries: Citus passes on `SET LOCAL` (with
    `citus.propagate_set_commands = 'local'`), not `set_config`, and `SET`
    takes only a literal, so the name is written as an escape string literal
    (`E'…'`, backslashes and quotes escaped; a tenant has no NUL).  There
    `BEGIN` goes alone, a round trip more: Citus replays the whole message
    of a propagated `SET LOCAL` on the workers, where a `BEGIN` in it would
    warn on every transaction.
    """
    mode = " READ ONLY" if read_only else ""
    begin = f"BEGIN ISOLATION LEVEL READ COMMITTED{mode}"
    if distributed:
        literal = "E'" + tenant.replace("\\", "\\\\").replace("'", "\\'") + "'"
        propagate = "SET LOCAL citus.propagate_set_commands = 'local'"
        return begin, f"{propagate}; SET LOCAL {TENANT_SETTING} = {literal}"
    value = f"convert_from(decode('{tenant.encode().hex()}', 'hex'), 'UTF8')"
    return (f"{begin}; SELECT set_config('{TENANT_SETTING}', {value}, true)",)
