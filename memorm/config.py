"""Where memorm finds its database: an argument, `MEMORM_DATABASE_URL`, or a file."""

from __future__ import annotations

import os

from sqlalchemy.engine import URL, make_url

from memorm.errors import ValidationError

__all__ = ["DEFAULT_URL", "resolve_url"]

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
    return parsed.set(drivername=driver)
