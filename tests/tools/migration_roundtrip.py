"""Run the real ``alembic`` command line on both engines: upgrade, check, downgrade, upgrade.

``python -m tests.tools.migration_roundtrip [POSTGRES_URL]`` (used by ``nox -s migrations``).
Postgres gets a throwaway database, since the command line takes no search_path.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import asyncpg
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parents[2]
STEPS = (["upgrade", "head"], ["check"], ["downgrade", "base"], ["upgrade", "head"], ["check"])


def alembic(url: str, *args: str) -> None:
    command = [sys.executable, "-m", "alembic", "-c", str(ROOT / "alembic.ini"), "-x", f"url={url}", *args]
    print("$ alembic", *args, flush=True)
    subprocess.run(command, check=True, cwd=ROOT)


async def _admin(url: str, sql: str) -> None:
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


def main(postgres_url: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sqlite_url = f"sqlite+aiosqlite:///{Path(tmp) / 'migrations.db'}"
        print("== sqlite")
        for step in STEPS:
            alembic(sqlite_url, *step)
    name = f"memorm_migrations_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(postgres_url, f'CREATE DATABASE "{name}"'))
    try:
        print("== postgres")
        url = make_url(postgres_url).set(database=name).render_as_string(hide_password=False)
        for step in STEPS:
            alembic(url, *step)
    finally:
        asyncio.run(_admin(postgres_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


if __name__ == "__main__":
    main(
        sys.argv[1]
        if len(sys.argv) > 1
        else os.environ.get("MEMORM_TEST_POSTGRES_URL", "postgresql+asyncpg://root@127.0.0.1:5432/test")
    )
