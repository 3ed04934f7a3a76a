"""Operations on whole tenants: list them, delete one, and make the application's Postgres role.

`Database.delete_tenant` and the `memorm tenant` and `memorm db create-role`
commands call these.  Statements that must name a role or database (DDL
takes no bind parameters) are built by Postgres' own `format()` with
`%I`/`%L`, so no name reaches SQL unquoted.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from typing import TYPE_CHECKING

import sqlalchemy as sa

from memorm.errors import ValidationError
from memorm.models import (
    AGENT_NAMES,
    AGENTS,
    CHECKPOINT_TABLES,
    EMBEDDING_MODELS,
    MESSAGES,
    PASSAGES,
    SESSIONS,
    STORE_TABLES,
)
from memorm.progress import Reporter, Silent
from memorm.search.fts_ddl import FTS_INDEXES
from memorm.search.text import merge_deleted
from memorm.tenancy import check_tenant
from memorm.translate import translating
from memorm.validation import check_flag, check_int

if TYPE_CHECKING:
    from memorm.db import Database

__all__ = ["DELETE_BATCH", "create_role", "delete_tenant", "list_tenants"]

DELETE_BATCH = 5_000  # rows per DELETE (and per transaction) in delete_tenant
# Children first: each batch deletes rows no other row still points to.
_DELETE_ORDER: tuple[sa.Table, ...] = (
    MESSAGES,
    *CHECKPOINT_TABLES,
    *reversed(STORE_TABLES),
    PASSAGES,
    SESSIONS,
    EMBEDDING_MODELS,
    AGENTS,
)
# The tables `list_tenants` counts per tenant.
_TABLES: tuple[sa.Table, ...] = (AGENTS, EMBEDDING_MODELS, SESSIONS, MESSAGES, PASSAGES)
# The tables `delete_tenant` counts: those, the graph state of the sessions and the graph stores.
_DELETED: tuple[sa.Table, ...] = (*_TABLES, *CHECKPOINT_TABLES, *STORE_TABLES)


async def list_tenants(db: Database) -> dict[str, dict[str, int]]:
    """Every tenant with its row count per table, by tenant name.

    Reads across tenants: on Postgres the role must bypass row-level security.
    """
    found: dict[str, dict[str, int]] = {}
    async with db.unit_of_work(read_only=True, all_tenants=True) as uow:
        for table in _TABLES:
            counts = sa.select(table.c.tenant, sa.func.count()).group_by(table.c.tenant)
            with translating():
                for tenant, count in await uow.session.execute(counts):
                    found.setdefault(tenant, {t.name: 0 for t in _TABLES})[table.name] = int(count)
    return dict(sorted(found.items()))


async def delete_tenant(
    db: Database,
    tenant: str,
    *,
    batch: int = DELETE_BATCH,
    dry_run: bool = False,
    reporter: Reporter | None = None,
) -> dict[str, int]:
    """Delete every row of `tenant`, in batches of `batch` rows, each its own transaction.

    No batch holds its locks for long, so the tenant's (and everyone's)
    traffic goes on meanwhile; rows the tenant writes during the deletion
    are deleted too if they land in a table not yet emptied.  Full-text
    entries go with their rows (on SQLite the index is merged, as by
    `forget`), and the in-process vector cache drops the tenant's matrices.
    Returns the rows deleted per table (with `dry_run`, the rows there are;
    nothing changes): agents, embedding models, sessions, messages, archival
    passages, the graph state of the sessions (`graph_checkpoints`,
    `graph_writes`, `graph_blobs`: what `memorm.compat.langgraph` stores)
    and the agents' LangGraph stores (`graph_store_items`,
    `graph_store_vectors`), every table named even when it held none.
    Works with the application role: the units of work are the tenant's own.
    """
    owner = check_tenant(tenant)
    size = check_int(batch, "batch", minimum=1, maximum=1_000_000)
    view = db.for_tenant(owner)
    counts = {table.name: 0 for table in _DELETED}
    async with view.unit_of_work(read_only=True) as uow:
        for table in _DELETED:
            with translating():
                counts[table.name] = int(
                    await uow.session.scalar(sa.select(sa.func.count()).where(table.c.tenant == owner)) or 0
                )
    if check_flag(dry_run, "dry_run"):
        return counts
    report = reporter or Silent()
    deleted = {table.name: 0 for table in _DELETED}
    for table in _DELETE_ORDER:
        report.start(table.name, counts[table.name])
        while True:
            async with view.unit_of_work() as uow:
                statement = _delete_batch(table, owner, size)
                with translating():
                    result = await uow.session.execute(statement)
                done = int(result.rowcount)  # type: ignore[attr-defined]
            deleted[table.name] += done
            report.advance(table.name, done)
            if done < size:
                break
    async with view.unit_of_work() as uow:  # the agents' names, with the agents gone
        with translating():
            await uow.session.execute(sa.delete(AGENT_NAMES).where(AGENT_NAMES.c.tenant == owner))
    db.vector_cache.evict_tenant(owner)
    if db.dialect == "sqlite" and (deleted["messages"] or deleted["archival_passages"]):
        async with view.unit_of_work() as uow:
            for index in FTS_INDEXES:
                await merge_deleted(uow.link, index)
    return deleted


def _delete_batch(table: sa.Table, owner: str, size: int) -> sa.Delete:
    """Delete up to `size` of the tenant's rows of `table`, found by their key."""
    key = [table.c.id] if "id" in table.c else list(table.primary_key.columns)
    doomed = sa.select(*key).where(table.c.tenant == owner).limit(size)
    found = key[0].in_(doomed.scalar_subquery()) if len(key) == 1 else sa.tuple_(*key).in_(doomed)
    return sa.delete(table).where(table.c.tenant == owner, found)


SCRAM_ITERATIONS = 4096  # Postgres' own default (scram_iterations)


def scram_sha_256(password: str, *, salt: bytes | None = None) -> str:
    """The SCRAM-SHA-256 verifier Postgres stores for `password` (RFC 5802, 7677).

    Given to `ALTER ROLE … PASSWORD`, Postgres stores it as is, so the
    password itself never reaches the server or its logs.  (Postgres
    normalises a password with SASLprep first; for the printable ASCII and
    most other text that changes nothing.)
    """
    salt = os.urandom(16) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, SCRAM_ITERATIONS)
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", "sha256").digest()
    encode = base64.b64encode
    return (
        f"SCRAM-SHA-256${SCRAM_ITERATIONS}:{encode(salt).decode()}"
        f"${encode(stored_key).decode()}:{encode(server_key).decode()}"
    )


def _check_role(role: object) -> str:
    if not isinstance(role, str) or not role or "\x00" in role or len(role.encode()) > 63:
        raise ValidationError("role: expected a name of 1 to 63 bytes without NUL")
    return role


_ROLE_LOCK = 0x6D656D6F726D_01  # "memorm", 1: the advisory lock create_role holds


async def create_role(db: Database, role: str, *, password: str | None = None) -> list[str]:
    """Create (or update) `role`: a login role for the application, subject to row-level security.

    `db` connects as an administrator (a superuser, or a role with
    CREATEROLE that owns memorm's tables).  The role gets exactly what memorm
    needs: `CONNECT` on the database, `USAGE` on the schema, `SELECT`,
    `INSERT`, `UPDATE` and `DELETE` on memorm's tables and `SELECT` on
    `alembic_version`; default privileges give it the same on tables the
    owner creates later (new migrations).  It is never a superuser, never
    `BYPASSRLS`, and never the tables' owner (`ValidationError`).  Returns
    what was done, one line each.
    """
    name = _check_role(role)
    if password is not None and (not isinstance(password, str) or "\x00" in password):
        raise ValidationError("password: expected a string without NUL")
    if db.dialect != "postgresql":
        raise ValidationError("create-role is for Postgres: SQLite has no roles")
    await db.check_schema()
    done: list[str] = []
    async with db.engine.begin() as connection:

        async def run(template: str, *values: object) -> None:
            """Execute `template` after Postgres' format() quoted `values` into it."""
            params = {f"v{i}": value for i, value in enumerate(values)}
            args = "".join(f", CAST(:v{i} AS text)" for i in range(len(values)))
            statement = await connection.scalar(sa.text(f"SELECT format('{template}'{args})"), params)
            await connection.exec_driver_sql(str(statement))

        with translating():
            # One at a time per database: each GRANT CONNECT rewrites the database's
            # catalog row, and two transactions doing so at once fail ("tuple
            # concurrently updated") instead of waiting for each other.
            await connection.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _ROLE_LOCK})
            where = await connection.execute(
                sa.text(
                    "SELECT schemaname, tableowner FROM pg_tables "
                    "WHERE tablename = 'agents' AND schemaname = ANY (current_schemas(false)) "
                    "ORDER BY array_position(current_schemas(false), schemaname::text) LIMIT 1"
                )
            )
            schema, owner = where.one()  # the schema memorm's tables are found in
            if owner == name:
                raise ValidationError(
                    f"role {name!r} owns memorm's tables: the application role must be another one"
                )
            exists = await connection.scalar(
                sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": name}
            )
            if exists:
                await run("ALTER ROLE %I LOGIN NOSUPERUSER NOBYPASSRLS", name)
                done.append(f"role {name} updated: LOGIN NOSUPERUSER NOBYPASSRLS")
            else:
                await run("CREATE ROLE %I LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE", name)
                done.append(f"role {name} created: LOGIN NOSUPERUSER NOBYPASSRLS")
            if password is not None:
                # Hashed here: the statement (which a server may log) holds no password.
                await run("ALTER ROLE %I PASSWORD %L", name, scram_sha_256(password))
                done.append("password set (sent as a SCRAM-SHA-256 verifier)")
            database = await connection.scalar(sa.text("SELECT current_database()"))
            await run("GRANT CONNECT ON DATABASE %I TO %I", database, name)
            await run("GRANT USAGE ON SCHEMA %I TO %I", schema, name)
            for table in (*_TABLES, AGENT_NAMES, *CHECKPOINT_TABLES, *STORE_TABLES):
                await run("GRANT SELECT, INSERT, UPDATE, DELETE ON %I.%I TO %I", schema, table.name, name)
            await run("GRANT SELECT ON %I.alembic_version TO %I", schema, name)
            await run(
                "ALTER DEFAULT PRIVILEGES FOR ROLE %I IN SCHEMA %I "
                "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO %I",
                owner,
                schema,
                name,
            )
            done.append(
                f"granted: CONNECT on {database}, USAGE on schema {schema}, SELECT/INSERT/UPDATE/DELETE "
                f"on {', '.join(t.name for t in (*_TABLES, AGENT_NAMES))} "
                f"(and on tables {owner} creates later), "
                "SELECT on alembic_version"
            )
    return done
