"""`memorm export` / `memorm import`: a database (or one tenant of it) as JSON Lines.

The file's first line is a header, then one record per row, tables in
dependency order, then an end record with the counts actually written:

```text
{"memorm": "0.1.0", "revision": "0008", "tenant": null, "tables": {"agents": 2, …}}
{"table": "agents", "row": {"tenant": "default", "id": "0190…", "name": "sam", …}}
…
{"end": true, "tables": {"agents": 2, …}}
```

Rows use the JSON-safe encoding of `memorm.transfer.codec`, each with its
tenant.  The header's `tenant` is the export's scope: the one tenant
exported, or null for every tenant.  Its counts are taken before the rows
are read (for progress); the end record's are exact, and its absence marks
a truncated file.  Files ending in `.gz`
are gzip-compressed.

An import reads the file twice: it checks every row first, alone
(`memorm.transfer.checks`) and against the others and the database
(`memorm.transfer.references`), so a bad file is refused by line with
nothing written; then it writes.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Generator, Iterable, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic.script import ScriptDirectory

from memorm import graph_values
from memorm.db import Database
from memorm.errors import SchemaError, UnsafeValueError, ValidationError
from memorm.graph_values import AllowedType
from memorm.migrate import alembic_config, head_revision
from memorm.transfer.checks import check_row
from memorm.transfer.codec import from_json_row, to_json_row
from memorm.transfer.files import check_target, new_file
from memorm.transfer.references import FileCheck, Numbered, Pending
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
from memorm.transfer.scope import Scope, check_reach, check_scope
from memorm.transfer.target import check_destination, prepare_destination, refresh_statistics, written
from memorm.validation import check_flag

__all__ = ["ImportReport", "check_revision", "export_jsonl", "import_jsonl", "read_header"]


@dataclass
class ImportReport:
    """What an import did: the file's header, and rows inserted and skipped (already there) by table.

    `analyzed`: the tables whose Postgres planner statistics the import
    refreshed (`ANALYZE`), those it wrote rows to and may analyze.
    """

    header: dict[str, Any]
    inserted: dict[str, int] = field(default_factory=lambda: {table.name: 0 for table in TABLES})
    skipped: dict[str, int] = field(default_factory=lambda: {table.name: 0 for table in TABLES})
    analyzed: list[str] = field(default_factory=list)


# Not `memorm.types.json.dumps`, which writes -0.0 as 0.0 (jsonb has no negative
# zero): vectors keep their components' signs in both engines (pgvector, SQLite's
# packed floats), and the file carries what the rows hold.  JSON documents read
# back from either engine hold no -0.0 to keep.
_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))


def _line(record: dict[str, Any]) -> str:
    return _ENCODER.encode(record) + "\n"


async def export_jsonl(
    db: Database,
    path: str | os.PathLike[str],
    *,
    tenant: str | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    reporter: Reporter | None = None,
    overwrite: bool = False,
) -> dict[str, int]:
    """Write every row of `db` (or of one tenant) to `path`; the rows written, by table.

    The file appears under its name only once complete (it is written beside
    it first, then linked or renamed: `memorm.transfer.files`).  An existing
    `path` is refused unless `overwrite`, and one that is not a regular
    file (a symbolic link, a FIFO, a device…) always, before anything is read.

    Args:
        tenant: export that tenant's rows only, read in units of work of that
            tenant (so an application role under row-level security can
            export its own tenant).  None exports every tenant, which on
            Postgres needs a role that bypasses row-level security.  The
            header records it (`"tenant"`).

    Raises:
        ValidationError: `tenant` is no tenant name, or is None for a role
            under row-level security; `path` exists (without `overwrite`) or
            is not a regular file.
    """
    from memorm import __version__

    scope = check_scope(tenant)
    replace = check_flag(overwrite, "overwrite")
    report = reporter or Silent()
    target = Path(path)
    check_target(target, overwrite=replace)
    await db.check_schema()
    check_reach(db, scope)
    counts = {table.name: await count_rows(db, table, tenant=scope) for table in TABLES}
    written = dict.fromkeys(counts, 0)
    header = {"memorm": __version__, "revision": head_revision(), "tenant": scope, "tables": counts}
    with new_file(target, overwrite=replace) as out:
        out.write(_line(header))
        for table in TABLES:
            report.start(table.name, counts[table.name])
            async for rows in read_batches(db, table, tenant=scope, batch_size=batch_size):
                out.writelines(_line({"table": table.name, "row": to_json_row(table, row)}) for row in rows)
                written[table.name] += len(rows)
                report.advance(table.name, len(rows))
        out.write(_line({"end": True, "tables": written}))
    return written


def check_revision(revision: object, *, where: str = "the file") -> None:
    """Refuse data from a schema revision this memorm does not know (a newer memorm's).

    Raises:
        SchemaError: `revision` is not one of this memorm's migrations.
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


def read_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The header of the export at `path`, checked: a memorm export of a revision this memorm knows.

    Raises:
        ValidationError: the file's first line is no memorm header.
        SchemaError: the file comes from a newer memorm's schema.
        OSError: the file cannot be read.
    """
    source = Path(path)
    try:
        with closing(_records(source)) as records:
            header = next(records, (1, "", {}))[2]
    except ValidationError:
        header = {}
    if "memorm" not in header or not isinstance(header.get("tables"), dict):
        raise ValidationError(f"{source} is not a memorm export (its first line is no memorm header)")
    check_revision(header.get("revision"), where=str(source))
    return header


def _records(source: Path) -> Generator[tuple[int, str, dict[str, Any]], None, None]:
    """Each line of `source` as a JSON object, with its number and `file:line`.

    Lines are split and decoded here, not by a text reader, so a line that is
    not UTF-8 is named exactly (a reader decodes ahead, a chunk at a time).
    """
    number = 0
    with gzip.open(source, "rb") if source.name.endswith(".gz") else open(source, "rb") as lines:
        try:
            for number, raw in enumerate(lines, start=1):
                where = f"{source}:{number}"
                try:
                    record = json.loads(raw.decode("utf-8"))
                except UnicodeDecodeError:
                    raise ValidationError(f"{where}: not UTF-8 text") from None
                except RecursionError:
                    raise ValidationError(f"{where}: JSON nested too deeply") from None
                except ValueError:
                    raise ValidationError(f"{where}: not a line of JSON") from None
                if not isinstance(record, dict):
                    raise ValidationError(f"{where}: expected a JSON object")
                yield number, where, record
        except (EOFError, gzip.BadGzipFile) as error:  # a gzip stream cut short, or none
            raise ValidationError(f"{source}:{number + 1}: unreadable ({error})") from None


def _rows(source: Path, *, older: bool) -> Iterator[Numbered]:
    """The rows of the export at `source` (after its header), decoded, with their lines.

    Raises:
        ValidationError: a line that is no record of a memorm table, or an end
            record that is missing, not last, or counts other rows than the file holds.
    """
    seen = {table.name: 0 for table in TABLES}
    end: object = None
    for number, where, record in _records(source):
        if number == 1:
            continue  # the header, read by the caller
        if end is not None:
            raise ValidationError(f"{where}: data after the end record")
        if "end" in record:
            end = record.get("tables")
            continue
        try:
            table = table_named(record.get("table"))
        except KeyError:
            raise ValidationError(f"{where}: {record.get('table')!r} is not a memorm table") from None
        data = record.get("row")
        if not isinstance(data, dict):
            raise ValidationError(f'{where}: expected a "row" object')
        try:
            row = from_json_row(table, data, older=older)
        except ValidationError as error:
            raise ValidationError(f"{where}: {error}") from None
        seen[table.name] += 1
        yield number, where, table, row
    if end is None:
        raise ValidationError(f"{source} ends early (no end record): a truncated export?")
    # An export from before a table existed (the graph state's, 0012; the store's, 0013) does not name it.
    counted = {**{name: 0 for name in seen if name not in end}, **end} if isinstance(end, dict) else end
    if counted != seen:
        raise ValidationError(f"{source}: its end record counts {end}, but it holds {seen}")


async def _check_rows(
    db: Database | None,
    rows: Iterable[Numbered],
    source: str,
    *,
    tenant: Scope,
    graph_types: frozenset[tuple[str, str]],
    batch_size: int,
    reporter: Reporter,
) -> None:
    """Check every row of an export, alone and against the others and `db`; write nothing.

    `db` None: an empty database (no memorm schema), which holds no row a
    row of the file could clash with or refer to.

    Raises:
        ValidationError: the first problem found, naming its line.
    """
    check = FileCheck(db, tenant)
    table: sa.Table | None = None
    pending: Pending = []
    for line, where, target, row in rows:
        try:
            values = check_row(target, row, graph_types=graph_types)
        except UnsafeValueError as error:
            raise UnsafeValueError(f"{where}: {error}") from None
        except ValidationError as error:
            raise ValidationError(f"{where}: {error}") from None
        if tenant is not None and values["tenant"] != tenant:
            raise ValidationError(
                f"{where}: {target.name}.tenant: a row of tenant {values['tenant']!r}, "
                f"but the import is of tenant {tenant!r}"
            )
        check.order(target, values, where)
        if target is not table or len(pending) >= batch_size:
            if table is not None and pending:
                await check.batch(table, pending)
                reporter.advance("check", len(pending))
            table, pending = target, []
        pending.append((where, line, values))
    if table is not None and pending:
        await check.batch(table, pending)
        reporter.advance("check", len(pending))
    check.finish(source)


async def import_jsonl(
    db: Database,
    path: str | os.PathLike[str],
    *,
    tenant: str | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    reporter: Reporter | None = None,
    allowed_types: Iterable[AllowedType] | None = None,
) -> ImportReport:
    """Insert the rows of an export at `path` into `db`, skipping (tenant, id) keys it already has.

    An empty `db` (no memorm schema) is migrated to head once the whole
    file has passed its checks; one with a memorm schema must be at head
    (`SchemaError` otherwise, naming `memorm db upgrade`), as for
    `copy_database`.  The
    file must not come from a newer revision than this memorm's head.
    The whole file is checked first, each row as the API checks its input and
    against the other rows and `db` (see `memorm.transfer.references`):
    a bad file raises `ValidationError` naming the line, and nothing is
    written: an empty `db` stays empty (not migrated), and a SQLite file
    that was not there is not made.  Then each batch commits on its own: after a failure (a lost
    connection), importing again finishes the job.

    Each row keeps the tenant it has in the file; rows of an export from
    before tenants (revision 0008) are the default tenant's.

    Graph state (LangGraph's checkpoints, writes and channel values) is
    read without being built, and a value naming a callable that is neither
    a type LangGraph's graphs store nor one of `allowed_types` is refused
    (`UnsafeValueError` naming its line), as a pickle is: loading it would
    run that callable.

    Args:
        tenant: import into that tenant only, in units of work of that
            tenant (so an application role under row-level security can
            import its own tenant): a row of another tenant is refused
            (`ValidationError` naming its line) before anything is written.
            None imports every tenant's rows as they are, which on Postgres
            needs a role that bypasses row-level security.
        allowed_types: your own types that the graph state holds, as
            `MemormSaver` takes them (classes, `(module, name)` pairs or
            `"module.Name"`).
    """
    scope = check_scope(tenant)
    graph_types = graph_values.allowed_types(allowed_types)
    report = reporter or Silent()
    source = Path(path)
    header = read_header(source)  # a file that is no export leaves even an empty ``db`` untouched
    # Nothing is written (a new SQLite file not even made) until the whole file has passed.
    empty = await check_destination(db, scope)
    older = header.get("revision") != head_revision()  # its rows may lack columns added since
    counts = header["tables"]
    report.start("check", sum(n for n in counts.values() if isinstance(n, int) and not isinstance(n, bool)))
    await _check_rows(
        None if empty else db,  # an empty database holds nothing to check the rows against
        _rows(source, older=older),
        str(source),
        tenant=scope,
        graph_types=graph_types,
        batch_size=batch_size,
        reporter=report,
    )
    await prepare_destination(db, empty)

    result = ImportReport(header=header)
    table: sa.Table | None = None
    batch: list[Row] = []

    async def flush() -> None:
        if table is not None and batch:
            fresh = await insert_new(db, table, batch, tenant=scope)
            result.inserted[table.name] += fresh
            result.skipped[table.name] += len(batch) - fresh
            report.advance(table.name, len(batch))
            batch.clear()

    for _, _, target, row in _rows(source, older=older):
        if target is not table:
            await flush()
            table = target
            count = counts.get(table.name)
            report.start(table.name, count if isinstance(count, int) else 0)
        batch.append(row)
        if len(batch) >= batch_size:
            await flush()
    await flush()
    result.analyzed = await refresh_statistics(db, written(result.inserted), report)
    return result
