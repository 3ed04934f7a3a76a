"""What `export`, `import` and `copy` refuse, and what a refusal leaves: nothing, on both engines.

`export` writes a new regular file (`--force` replaces a regular one) and
never writes through, nor replaces, a symbolic link, a FIFO or a directory;
an import refused (a cut file, a bad row, no header) leaves no database
behind (a SQLite file not made, an empty Postgres database still empty);
a database is not copied into itself.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
import sqlalchemy as sa
from cli_run import memorm
from conftest import Store

from memorm import Database, ValidationError
from memorm.transfer import copy_database, export_jsonl, import_jsonl
from memorm.transfer.copy import verify_copy

pytestmark = pytest.mark.anyio


async def _fill(db: Database, name: str = "sam") -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create(name)
        chat = await uow.sessions.create(agent.id)
        await uow.messages.append(chat.id, [{"role": "user", "content": f"m{n}"} for n in range(3)])


def _scope(db: Database) -> str | None:
    """Every tenant, unless the role sees one tenant at a time (MEMORM_TEST_POSTGRES_ROLE=app)."""
    return None if db.dialect == "sqlite" or db.bypasses_rls else db.tenant


async def _exported(db: Database, file: Path) -> str | None:
    await _fill(db)
    tenant = _scope(db)
    await export_jsonl(db, file, tenant=tenant)
    return tenant


async def _nothing_at(url: str) -> bool:
    """Whether `url` holds no database memorm made: no SQLite file, or no table in Postgres."""
    if url.startswith("sqlite"):
        return not await anyio.Path(url.split("///", 1)[1]).exists()
    async with Database(url) as target, target.engine.connect() as connection:
        tables = await connection.scalar(
            sa.text("SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()")
        )
    return tables == 0


# -- export ------------------------------------------------------------------------------------


async def test_export_writes_through_no_link_and_replaces_nothing_but_a_regular_file_when_forced(
    db: Database, tmp_path: Path
) -> None:
    await _fill(db)
    tenant = _scope(db)
    tmp_path = tmp_path / "exports"  # (beside a SQLite test database's files)
    tmp_path.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    link = tmp_path / "link.jsonl"
    link.symlink_to(victim)
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    folder = tmp_path / "folder.jsonl"
    folder.mkdir()
    for target, kind in ((link, "a symbolic link"), (fifo, "a FIFO"), (folder, "a directory")):
        for overwrite in (False, True):
            with pytest.raises(ValidationError, match=kind):
                await export_jsonl(db, target, tenant=tenant, overwrite=overwrite)
    assert link.is_symlink()
    assert fifo.is_fifo()
    assert folder.is_dir()
    # The name export once wrote beside its target, a link put there: not followed.
    (tmp_path / "out.jsonl.partial").symlink_to(victim)
    out = tmp_path / "out.jsonl"
    await export_jsonl(db, out, tenant=tenant)
    assert victim.read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["victim.txt", "link.jsonl", "fifo.jsonl", "folder.jsonl", "out.jsonl.partial", "out.jsonl"]
    )
    first = out.read_text()
    assert first.splitlines()[-1].startswith('{"end":true')
    with pytest.raises(ValidationError, match="exists: replace it with --force"):
        await export_jsonl(db, out, tenant=tenant)
    assert out.read_text() == first
    await _fill(db, "kim")  # more rows: the forced export replaces the file with the new ones
    await export_jsonl(db, out, tenant=tenant, overwrite=True)
    assert out.read_text() != first
    assert not out.is_symlink()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("out.jsonl.") and not p.is_symlink()]


def test_memorm_export_refuses_an_existing_file_unless_forced(
    plain_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert memorm(capsys, "db", "upgrade", "--url", plain_url)[0] == 0
    out = tmp_path / "memory.jsonl.gz"
    assert memorm(capsys, "export", plain_url, str(out))[0] == 0
    before = out.read_bytes()
    code, _, err = memorm(capsys, "export", plain_url, str(out))
    assert code == 1
    assert err == f"memorm: error: {out} exists: replace it with --force (overwrite=True)\n"
    assert out.read_bytes() == before
    assert memorm(capsys, "export", "--force", plain_url, str(out))[0] == 0
    assert memorm(capsys, "import", f"sqlite:///{tmp_path / 'back.db'}", str(out))[0] == 0


# -- import ------------------------------------------------------------------------------------


def _cut(file: Path) -> Path:
    cut = file.with_name("cut.jsonl")
    cut.write_text("".join(file.read_text().splitlines(keepends=True)[:-1]))
    return cut


def _bad_row(file: Path) -> Path:
    """The export with its last message pointing at a session no row is."""
    lines = file.read_text().splitlines(keepends=True)
    last = max(i for i, line in enumerate(lines) if line.startswith('{"table":"messages"'))
    record = json.loads(lines[last])
    record["row"]["session_id"] = "0190a1c3-0000-7000-8000-000000000000"
    lines[last] = json.dumps(record) + "\n"
    bad = file.with_name("bad.jsonl")
    bad.write_text("".join(lines))
    return bad


def _headless(file: Path) -> Path:
    headless = file.with_name("headless.jsonl")
    headless.write_text("".join(file.read_text().splitlines(keepends=True)[1:]))
    return headless


@pytest.mark.parametrize(
    ("broken", "words"),
    [(_cut, "ends early"), (_bad_row, "no session"), (_headless, "not a memorm export")],
)
async def test_a_refused_import_leaves_no_database_behind(
    db: Database, plain_url: str, tmp_path: Path, broken: Callable[[Path], Path], words: str
) -> None:
    file = tmp_path / "memory.jsonl"
    tenant = await _exported(db, file)
    async with Database(plain_url) as target:
        with pytest.raises(ValidationError, match=words):
            await import_jsonl(target, broken(file), tenant=tenant)
    assert await _nothing_at(plain_url)  # not a file, not a table
    async with Database(plain_url) as target:  # the whole file imports into it afterwards
        report = await import_jsonl(target, file, tenant=tenant)
    assert report.inserted["messages"] == 3


def test_memorm_import_refused_makes_no_sqlite_file_and_leaves_postgres_empty(
    plain_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = f"sqlite:///{tmp_path / 'source.db'}"
    assert memorm(capsys, "db", "upgrade", "--url", source)[0] == 0
    asyncio.run(_fill_url(source))
    file = tmp_path / "memory.jsonl"
    assert memorm(capsys, "export", source, str(file))[0] == 0
    code, _, err = memorm(capsys, "import", plain_url, str(_cut(file)))
    assert (code, err.count("\n")) == (1, 1)
    assert "ends early" in err
    assert asyncio.run(_nothing_at(plain_url))


async def _fill_url(url: str) -> None:
    async with Database(url) as db:
        await _fill(db)


# -- copy --------------------------------------------------------------------------------------


async def test_a_database_is_not_copied_into_itself_however_its_url_is_spelled(
    db: Database, store: Store, tmp_path: Path
) -> None:
    await _fill(db)
    tenant = _scope(db)
    spellings = [db, db.for_tenant("other"), store.database()]
    if db.dialect == "sqlite":
        path = Path(db.url.database or "")
        (tmp_path / "alias.db").symlink_to(path)
        spellings += [Database(f"sqlite:///{tmp_path / 'alias.db'}"), Database(f"sqlite:///{path}")]
    for same in spellings:
        with pytest.raises(ValidationError, match="one database"):
            await copy_database(db, same, tenant=tenant)
        with pytest.raises(ValidationError, match="one database"):
            await verify_copy(db, same, tenant=tenant)
    for same in spellings[2:]:
        await same.dispose()
    async with Database(f"sqlite:///{tmp_path / 'other.db'}") as other:  # another database copies
        report = await copy_database(db, other, tenant=tenant)
    assert report.inserted["messages"] == 3
    assert not report.problems
