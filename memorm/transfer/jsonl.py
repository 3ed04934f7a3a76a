"""``memorm export`` / ``memorm import``: a database as JSON Lines.

The file's first line is a header, then one record per row, tables in
dependency order, then an end record with the counts actually written::

    {"memorm": "0.1.0", "revision": "0004", "tables": {"agents": 2, …}}
    {"table": "agents", "row": {"id": "0190…", "name": "sam", …}}
    …
    {"end": true, "tables": {"agents": 2, …}}

Rows use the JSON-safe encoding of :mod:`memorm.transfer.codec`.  The header's
counts are taken before the rows are read (for progress); the end record's
are exact, and its absence marks a truncated file.  Files ending in ``.gz``
are gzip-compressed.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import sqlalchemy as sa
from alembic.script import ScriptDirectory

from memorm.db import Database
from memorm.errors import SchemaError, ValidationError
from memorm.migrate import alembic_config, head_revision
from memorm.transfer.codec import from_json_row, to_json_row
from memorm.transfer.rows import (
    DEFAULT_BATCH_SIZE,
    TABLES,
    Reporter,
    Row,
    Silent,
    count_rows,
    insert_new,
    read_batches,
    table_named,
)
from memorm.types.json import dumps

__all__ = ["ImportReport", "check_revision", "export_jsonl", "import_jsonl"]


@dataclass
class ImportReport:
    """What an import did: the file's header, and rows inserted and skipped (already there) by table."""

    header: dict[str, Any]
    inserted: dict[str, int] = field(default_factory=lambda: {table.name: 0 for table in TABLES})
    skipped: dict[str, int] = field(default_factory=lambda: {table.name: 0 for table in TABLES})


def _open(path: Path, mode: str, *, name: Path | None = None) -> IO[str]:
    """``path`` as text; gzip-compressed if ``name`` (default ``path``) ends in ``.gz``."""
    if (name or path).name.endswith(".gz"):
        return io.TextIOWrapper(gzip.GzipFile(path, mode), encoding="utf-8", newline="\n")
    return open(path, mode, encoding="utf-8", newline="\n")


def _line(record: dict[str, Any]) -> str:
    return dumps(record) + "\n"


async def export_jsonl(
    db: Database,
    path: str | os.PathLike[str],
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    reporter: Reporter | None = None,
) -> dict[str, int]:
    """Write every row of ``db`` to ``path``; the rows written, by table.

    The file appears under its name only once complete (it is written beside
    it first, then renamed).
    """
    from memorm import __version__

    report = reporter or Silent()
    target = Path(path)
    await db.check_schema()
    counts = {table.name: await count_rows(db, table) for table in TABLES}
    written = dict.fromkeys(counts, 0)
    partial = target.with_name(target.name + ".partial")
    try:
        with _open(partial, "w", name=target) as out:
            out.write(_line({"memorm": __version__, "revision": head_revision(), "tables": counts}))
            for table in TABLES:
                report.start(table.name, counts[table.name])
                async for rows in read_batches(db, table, batch_size=batch_size):
                    out.writelines(
                        _line({"table": table.name, "row": to_json_row(table, row)}) for row in rows
                    )
                    written[table.name] += len(rows)
                    report.advance(table.name, len(rows))
            out.write(_line({"end": True, "tables": written}))
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    return written


def check_revision(revision: object, *, where: str = "the file") -> None:
    """Refuse data from a schema revision this memorm does not know (a newer memorm's).

    Raises:
        SchemaError: ``revision`` is not one of this memorm's migrations.
    """
    head = head_revision()
    if revision == head:
        return
    scripts = ScriptDirectory.from_config(alembic_config())
    try:
        known = isinstance(revision, str) and scripts.get_revision(revision) is not None
    except Exception:  # alembic raises several kinds for an unknown or malformed id
        known = False
    if not known:
        raise SchemaError(
            f"{where} comes from schema revision {revision!r}, newer than this memorm's head {head}: "
            "upgrade memorm to import it"
        )


def _record(line: str, where: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except ValueError:
        raise ValidationError(f"{where}: not a line of JSON") from None
    if not isinstance(record, dict):
        raise ValidationError(f"{where}: expected a JSON object")
    return record


async def import_jsonl(
    db: Database,
    path: str | os.PathLike[str],
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    reporter: Reporter | None = None,
) -> ImportReport:
    """Insert the rows of an export at ``path`` into ``db``, skipping ids it already has.

    ``db`` must be at the head revision (``SchemaError`` otherwise; run
    ``memorm db upgrade`` first), and the file must not come from a newer one.
    Each batch commits on its own: after a failure, importing again finishes the job.
    """
    report = reporter or Silent()
    source = Path(path)
    await db.check_schema()
    with _open(source, "r") as lines:
        try:
            header = _record(next(lines, "null"), f"{source}:1")
        except ValidationError:
            header = {}
        if "memorm" not in header or not isinstance(header.get("tables"), dict):
            raise ValidationError(f"{source} is not a memorm export (its first line is no memorm header)")
        check_revision(header.get("revision"), where=str(source))
        older = header.get("revision") != head_revision()  # its rows may lack columns added since
        result = ImportReport(header=header)
        seen = {table.name: 0 for table in TABLES}
        table: sa.Table | None = None
        batch: list[Row] = []
        end: object = None

        async def flush() -> None:
            if table is not None and batch:
                fresh = await insert_new(db, table, batch)
                result.inserted[table.name] += fresh
                result.skipped[table.name] += len(batch) - fresh
                report.advance(table.name, len(batch))
                batch.clear()

        for number, line in enumerate(lines, start=2):
            where = f"{source}:{number}"
            if end is not None:
                raise ValidationError(f"{where}: data after the end record")
            record = _record(line, where)
            if "end" in record:
                end = record.get("tables")
                continue
            try:
                target = table_named(record.get("table"))
            except KeyError:
                raise ValidationError(f"{where}: {record.get('table')!r} is not a memorm table") from None
            data = record.get("row")
            if not isinstance(data, dict):
                raise ValidationError(f'{where}: expected a "row" object')
            try:
                row = from_json_row(target, data, older=older)
            except ValidationError as error:
                raise ValidationError(f"{where}: {error}") from None
            if target is not table:
                await flush()
                table = target
                report.start(table.name, int(header["tables"].get(table.name) or 0))
            batch.append(row)
            seen[table.name] += 1
            if len(batch) >= batch_size:
                await flush()
        await flush()
    if end is None:
        raise ValidationError(f"{source} ends early (no end record): a truncated export?")
    if end != seen:
        raise ValidationError(f"{source}: its end record counts {end}, but it holds {seen}")
    return result
