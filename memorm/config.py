"""Where memorm finds its database: an argument, `MEMORM_DATABASE_URL`, or a file."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.engine import URL, make_url

from memorm.errors import ValidationError

__all__ = ["DEFAULT_URL", "POSTGRES_URL_PARAMETERS", "resolve_url", "sqlite_file"]

DEFAULT_URL = "sqlite+aiosqlite:///memorm.db"

# Plain and sync-driver spellings, mapped to the async drivers memorm runs on.
_DRIVERS = {
    "sqlite": "sqlite+aiosqlite",
    "sqlite+aiosqlite": "sqlite+aiosqlite",
    "sqlite+pysqlite": "sqlite+aiosqlite",
    "postgresql": "postgresql+asyncpg",
    "postgres": "postgresql+asyncpg",
    "postgresql+asyncpg": "postgresql+asyncpg",
    "postgresql+psycopg": "postgresql+asyncpg",
    "postgresql+psycopg2": "postgresql+asyncpg",
}


def resolve_url(url: str | URL | None = None) -> URL:
    """The async URL to use: `url`, else `MEMORM_DATABASE_URL`, else `DEFAULT_URL`.

    `sqlite:///x.db` and `postgresql://…` are mapped to aiosqlite and asyncpg.
    """
    raw = url if url is not None else os.environ.get("MEMORM_DATABASE_URL") or DEFAULT_URL
    try:
        parsed = make_url(raw)
    except Exception:  # the parser's message repeats the URL, password and all
        raise ValidationError("not a database URL (expected dialect+driver://…)") from None
    driver = _DRIVERS.get(parsed.drivername)
    if driver is None:
        raise ValidationError(
            f"unsupported database {parsed.drivername!r}: memorm runs on "
            "sqlite+aiosqlite:// and postgresql+asyncpg:// URLs"
        )
    resolved = parsed.set(drivername=driver)
    if resolved.get_backend_name() == "postgresql":
        _check_postgres_query(resolved)
    return resolved


POSTGRES_URL_PARAMETERS = (
    "host",
    "port",
    "ssl",
    "passfile",
    "service",
    "servicefile",
    "target_session_attrs",
    "krbsrvname",
    "gsslib",
    "prepared_statement_cache_size",
)
"""The parameters a Postgres URL may carry (`?ssl=require`): those asyncpg's `connect` takes as text.

Others reach asyncpg as keyword arguments it does not know (`options`,
`sslmode`, `application_name`: a `TypeError` at the first connection) or
as text where it wants a number (`timeout`): they are refused when the URL
is read.  Pass them in `connect_args` instead, server settings under
`server_settings`.
"""

_SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
_NUMBERS = ("port", "prepared_statement_cache_size")
_REPEATABLE = ("host", "port")  # several hosts: SQLAlchemy's multi-host URL
_INSTEAD = {
    "options": "pass server settings as Database(url, connect_args={'server_settings': {'name': 'value'}})",
    "sslmode": "asyncpg's name for it is ssl (?ssl=require)",
}


def _check_postgres_query(url: URL) -> None:
    for name, given in url.query.items():
        values = (given,) if isinstance(given, str) else tuple(given)
        if name not in POSTGRES_URL_PARAMETERS:
            instead = _INSTEAD.get(
                name, "pass it in connect_args (Database(url, connect_args={...})), or set it on the role"
            )
            raise ValidationError(f"the URL's {name!r} parameter is not one memorm's driver takes: {instead}")
        if len(values) > 1 and name not in _REPEATABLE:
            raise ValidationError(f"the URL gives {name!r} {len(values)} times: give it once")
        for value in values:
            if name in _NUMBERS and not (value.isascii() and value.isdigit()):
                raise ValidationError(f"the URL's {name!r} is {value!r}: expected a whole number")
            if name == "ssl" and value not in _SSL_MODES:
                raise ValidationError(f"the URL's ssl is {value!r}: expected one of {', '.join(_SSL_MODES)}")


def sqlite_file(url: URL) -> Path | None:
    """The absolute path of the file a SQLite URL names; None for another engine.

    None too for an in-memory database and a `file:` URI (which SQLite
    opens by its own rules).
    """
    name = url.database
    if url.get_backend_name() != "sqlite" or not name or name == ":memory:" or name.startswith("file:"):
        return None
    return Path(name).absolute()
