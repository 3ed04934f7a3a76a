"""`memorm db create-role`: the application's Postgres login role, made or brought in line.

The application role may read and write memorm's rows and do nothing that
reaches past row-level security.  `create_role` makes it so whatever the
role held before: it removes the attributes (`CREATEROLE`, `CREATEDB`,
`REPLICATION`, `BYPASSRLS`), the memberships (any role it could `SET ROLE`
to that owns memorm's tables, is a superuser, bypasses row-level security,
may replicate, may grant roles, or may touch the server's files) and the
table privileges (`TRUNCATE`, which empties a table past every policy;
`REFERENCES`; `TRIGGER`; grant options) it should not have, then checks
that none is left by another road.  What it cannot remove it refuses, and
the transaction leaves the role as it was.

Statements that must name a role or database (DDL takes no bind
parameters) are built by Postgres' own `format()` with `%I`/`%L`, so no
name reaches SQL unquoted.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from memorm.engines import Reachable
from memorm.errors import ValidationError
from memorm.models import metadata
from memorm.translate import translating

__all__ = ["ROLE_LOCK", "SCRAM_ITERATIONS", "create_role", "scram_sha_256"]

SCRAM_ITERATIONS = 4096  # Postgres' own default (scram_iterations)
ROLE_LOCK = 0x6D656D6F726D_01  # "memorm", 1: the advisory lock create_role holds (for its grants)
_GRANTED = "SELECT, INSERT, UPDATE, DELETE"  # on each of memorm's tables; SELECT on alembic_version
# The role attributes an application role never has (as pg_roles' rolbypassrls, rolreplication,
# rolcreaterole, rolcreatedb), and those only a superuser may take away.
_ATTRIBUTES = ("BYPASSRLS", "REPLICATION", "CREATEROLE", "CREATEDB")
_SUPERUSER_ONLY = {"BYPASSRLS", "REPLICATION"}
# Table privileges it must not hold, by any road: TRUNCATE empties a table past row-level
# security; REFERENCES and TRIGGER let it hang its own constraints and code on memorm's tables.
_FORBIDDEN = [
    *(f"{kind} WITH GRANT OPTION" for kind in _GRANTED.split(", ")),
    "TRUNCATE",
    "REFERENCES",
    "TRIGGER",
]

# The roles a member could SET ROLE to and so escape row-level security, each with why.
_DANGEROUS = """
SELECT d.oid, d.rolname::text AS name, CASE
    WHEN d.rolsuper THEN 'is a superuser'
    WHEN d.oid = ANY(CAST(:owners AS oid[])) THEN 'owns memorm''s tables'
    WHEN d.rolbypassrls THEN 'bypasses row-level security'
    WHEN d.rolreplication THEN 'may replicate the whole database'
    WHEN d.rolcreaterole THEN 'may grant itself other roles (CREATEROLE)'
    ELSE 'may read or write the server''s files' END AS why
FROM pg_roles d
WHERE d.rolsuper OR d.rolbypassrls OR d.rolreplication OR d.rolcreaterole
    OR d.oid = ANY(CAST(:owners AS oid[]))
    OR d.rolname IN ('pg_read_server_files', 'pg_write_server_files', 'pg_execute_server_program')
"""
# The role's direct memberships that lead to a dangerous role, with why (the first found).
_MEMBERSHIPS = f"""
WITH danger AS ({_DANGEROUS})
SELECT r.rolname::text, g.rolname::text AS grantor, r.rolsuper, (
    SELECT CASE WHEN d.oid = r.oid THEN d.why
        ELSE 'is a member of ' || quote_ident(d.name) || ', which ' || d.why END
    FROM danger d WHERE pg_has_role(r.oid, d.oid, 'MEMBER')
    ORDER BY d.oid = r.oid DESC, d.name LIMIT 1) AS why
FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid LEFT JOIN pg_roles g ON g.oid = m.grantor
WHERE m.member = CAST(:role AS oid)
ORDER BY r.rolname
"""  # noqa: S608 (constant SQL)
# Dangerous roles the role still reaches once its memberships were revoked.
_STILL_MEMBER = f"""
WITH danger AS ({_DANGEROUS})
SELECT d.name, d.why FROM danger d
WHERE d.oid <> CAST(:role AS oid) AND pg_has_role(CAST(:role AS oid), d.oid, 'MEMBER')
ORDER BY d.name
"""  # noqa: S608 (constant SQL)
# What the role holds directly on each table, beyond what memorm grants: privileges and grant options.
_EXTRA_GRANTS = """
SELECT c.relname::text, a.privilege_type, a.is_grantable
FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
WHERE c.oid = ANY(CAST(:tables AS oid[])) AND a.grantee = CAST(:role AS oid)
UNION ALL
SELECT c.relname::text, a.privilege_type || ' (column ' || quote_ident(f.attname::text) || ')', a.is_grantable
FROM pg_class c JOIN pg_attribute f ON f.attrelid = c.oid CROSS JOIN LATERAL aclexplode(f.attacl) a
WHERE c.oid = ANY(CAST(:tables AS oid[])) AND a.grantee = CAST(:role AS oid)
"""
# Privileges the role still holds once its own grants were redone (through PUBLIC, a role it
# belongs to, or a grant by another grantor).
_STILL_GRANTED = """
SELECT c.relname::text, p.kind FROM pg_class c CROSS JOIN unnest(CAST(:kinds AS text[])) AS p(kind)
WHERE c.oid = ANY(CAST(:tables AS oid[])) AND CASE WHEN p.kind = 'REFERENCES'
    THEN has_any_column_privilege(CAST(:role AS oid), c.oid, p.kind)
    ELSE has_table_privilege(CAST(:role AS oid), c.oid, p.kind) END
ORDER BY c.relname, p.kind
"""


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


class _Session:
    """The admin's transaction, running DDL whose names Postgres' format() quoted."""

    def __init__(self, connection: AsyncConnection) -> None:
        self.connection = connection

    async def run(self, template: str, *values: object) -> None:
        """Execute `template` after Postgres' format() quoted `values` into it."""
        params = {f"v{i}": value for i, value in enumerate(values)}
        args = "".join(f", CAST(:v{i} AS text)" for i in range(len(values)))
        statement = await self.connection.scalar(sa.text(f"SELECT format('{template}'{args})"), params)
        await self.connection.exec_driver_sql(str(statement))

    async def rows(self, query: str, **params: object) -> list[tuple[Any, ...]]:
        return [tuple(row) for row in await self.connection.execute(sa.text(query), params)]

    async def value(self, query: str, **params: object) -> Any:
        return await self.connection.scalar(sa.text(query), params)


async def create_role(db: Reachable, role: str, *, password: str | None = None) -> list[str]:
    """Create `role`, or bring an existing one in line: a login role subject to row-level security.

    `db` connects as an administrator (a superuser, or a role with
    CREATEROLE that owns memorm's tables).  The role gets exactly what memorm
    needs: `CONNECT` on the database, `USAGE` on the schema, `SELECT`,
    `INSERT`, `UPDATE` and `DELETE` on each of memorm's tables and `SELECT`
    on `alembic_version`; default privileges give it the same on tables the
    owner creates later (new migrations).

    An existing role loses what it should not have: the attributes
    `BYPASSRLS`, `REPLICATION`, `CREATEROLE` and `CREATEDB` (the first two
    only a superuser may remove); membership in any role it could
    `SET ROLE` to and escape row-level security (one that owns memorm's
    tables, is a superuser, has `BYPASSRLS`, `REPLICATION` or `CREATEROLE`,
    or is `pg_read_server_files`, `pg_write_server_files` or
    `pg_execute_server_program`, or a member of one of those); and every
    other privilege and grant option on memorm's tables, on the schema and
    in the owner's default privileges (`TRUNCATE` empties a table past every
    policy).  Then it checks that the role holds none of these by another
    road (granted to `PUBLIC`, through a role it keeps, by another grantor).

    Raises:
        ValidationError: `role` is a superuser (memorm does not demote
            one), or owns memorm's tables; or something could not be taken
            away (the message says what, and where to revoke it).  Nothing
            has changed then: it all runs in one transaction.

    Returns:
        What was done, one line each: the role, what was removed, and one
        line per table granted.
    """
    name = _check_role(role)
    if password is not None and (not isinstance(password, str) or "\x00" in password):
        raise ValidationError("password: expected a string without NUL")
    if db.dialect != "postgresql":
        raise ValidationError("create-role is for Postgres: SQLite has no roles")
    await db.check_schema()
    async with db.engine.begin() as connection:
        with translating():
            return await _create_role(_Session(connection), name, password)


async def _create_role(sql: _Session, name: str, password: str | None) -> list[str]:
    # One at a time per database: each GRANT rewrites a catalog row (the database's,
    # a table's), and two transactions doing so at once fail ("tuple concurrently
    # updated") instead of waiting for each other.
    await sql.value("SELECT pg_advisory_xact_lock(:key)", key=ROLE_LOCK)
    (schema, owner), *_ = await sql.rows(
        "SELECT schemaname::text, tableowner::text FROM pg_tables "
        "WHERE tablename = 'agents' AND schemaname = ANY (current_schemas(false)) "
        "ORDER BY array_position(current_schemas(false), schemaname::text) LIMIT 1"
    )  # the schema memorm's tables are found in, and their owner
    if owner == name:
        raise ValidationError(f"role {name!r} owns memorm's tables: the application role must be another one")
    order = [*metadata.tables, "alembic_version"]  # memorm's tables in the models' order, as reported
    found = await sql.rows(
        "SELECT c.relname::text, c.oid, c.relowner FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = :schema AND c.relname = ANY(CAST(:names AS text[]))",
        schema=schema,
        names=order,
    )
    tables = {str(table): int(oid) for table, oid, _ in sorted(found, key=lambda row: order.index(row[0]))}
    owners = sorted({int(owned_by) for _, _, owned_by in found})
    admin_is_superuser = bool(await sql.value("SELECT rolsuper FROM pg_roles WHERE rolname = current_user"))
    attributes = "LOGIN NOSUPERUSER " + " ".join(f"NO{keyword}" for keyword in _ATTRIBUTES)
    state = await sql.rows(
        "SELECT rolsuper, rolcanlogin, rolbypassrls, rolreplication, rolcreaterole, rolcreatedb "
        "FROM pg_roles WHERE rolname = :r",
        r=name,
    )
    done: list[str] = []
    if not state:
        await sql.run(f"CREATE ROLE %I {attributes}", name)
        done.append(f"role {name} created: {attributes}")
    else:
        done += await _alter_role(sql, name, state[0], attributes, admin_is_superuser)
    key = int(await sql.value("SELECT oid FROM pg_roles WHERE rolname = :r", r=name))
    if state:
        done += await _revoke_memberships(sql, name, key, owners, admin_is_superuser)
    if password is not None:
        # Hashed here: the statement (which a server may log) holds no password.
        await sql.run("ALTER ROLE %I PASSWORD %L", name, scram_sha_256(password))
        done.append("password set (sent as a SCRAM-SHA-256 verifier)")
    done.append(await _grant_connect(sql, name, key))
    could_create = await sql.value(
        "SELECT count(*) FROM pg_namespace n CROSS JOIN LATERAL aclexplode(n.nspacl) a "
        "WHERE n.nspname = :schema AND a.grantee = CAST(:role AS oid) AND a.privilege_type = 'CREATE'",
        schema=schema,
        role=key,
    )
    await sql.run("REVOKE ALL ON SCHEMA %I FROM %I CASCADE", schema, name)
    await sql.run("GRANT USAGE ON SCHEMA %I TO %I", schema, name)
    if could_create:
        done.append(f"revoked CREATE on schema {schema}")
    done.append(f"granted USAGE on schema {schema}")
    done += await _regrant_tables(sql, name, key, schema, tables)
    await sql.run(
        "ALTER DEFAULT PRIVILEGES FOR ROLE %I IN SCHEMA %I REVOKE ALL ON TABLES FROM %I", owner, schema, name
    )
    await sql.run(
        f"ALTER DEFAULT PRIVILEGES FOR ROLE %I IN SCHEMA %I GRANT {_GRANTED} ON TABLES TO %I",
        owner,
        schema,
        name,
    )
    done.append(
        f"granted {_GRANTED} on the tables {owner} creates later in schema {schema} (default privileges)"
    )
    await _check_nothing_left(sql, name, key, tables, owners)
    if await sql.value(
        "SELECT has_schema_privilege(CAST(:role AS oid), :schema, 'CREATE')", role=key, schema=schema
    ):
        done.append(
            f"warning: {name} may still CREATE in schema {schema} (granted to PUBLIC or to a role it belongs "
            f"to), where the owner's sessions could pick up what it makes: REVOKE CREATE ON SCHEMA {schema} "
            "FROM PUBLIC"
        )
    return done


async def _grant_connect(sql: _Session, name: str, key: int) -> str:
    """Grant CONNECT on the database, if the administrator may; the line saying how the role connects."""
    database, may_grant = (
        await sql.rows(
            "SELECT datname::text, pg_has_role(datdba, 'USAGE') "
            "OR has_database_privilege(oid, 'CONNECT WITH GRANT OPTION') "
            "FROM pg_database WHERE datname = current_database()"
        )
    )[0]
    if may_grant:
        await sql.run("GRANT CONNECT ON DATABASE %I TO %I", database, name)
        return f"granted CONNECT on database {database}"
    # A CREATEROLE owner of the tables need not own the database: Postgres would only warn.
    if await sql.value(
        "SELECT has_database_privilege(CAST(:role AS oid), current_database(), 'CONNECT')", role=key
    ):
        return f"CONNECT on database {database}: granted already (to PUBLIC, or a role {name} belongs to)"
    raise ValidationError(
        f"role {name!r} may not connect to database {database!r}, and this administrator may not grant it: "
        "run create-role as the database's owner or a superuser"
    )


async def _alter_role(
    sql: _Session, name: str, state: tuple[Any, ...], attributes: str, admin_is_superuser: bool
) -> list[str]:
    """Take from an existing role the attributes it must not have; the lines saying so."""
    superuser, can_login, *flags = state
    if superuser:
        raise ValidationError(
            f"role {name!r} is a superuser, which row-level security never holds: memorm will not make it "
            "the application role, nor demote it; give another role's name"
        )
    held = [keyword for keyword, on in zip(_ATTRIBUTES, flags, strict=True) if on]
    needs_superuser = sorted(_SUPERUSER_ONLY.intersection(held))
    if needs_superuser and not admin_is_superuser:
        raise ValidationError(
            f"role {name!r} has {', '.join(needs_superuser)}, which only a superuser may remove: run "
            "create-role connected as a superuser"
        )
    changes = ([] if can_login else ["LOGIN"]) + [f"NO{keyword}" for keyword in held]
    if changes:  # only what changes: a CREATEROLE admin may not even restate NOSUPERUSER
        await sql.run(f"ALTER ROLE %I {' '.join(changes)}", name)
    done = [f"role {name} updated: {attributes}"]
    if held:
        done.append(f"removed {', '.join(held)} from role {name}")
    return done


async def _revoke_memberships(
    sql: _Session, name: str, key: int, owners: list[int], admin_is_superuser: bool
) -> list[str]:
    """Revoke the role's memberships that would let it escape row-level security; one line each."""
    done: dict[str, str] = {}
    for granted, grantor, superuser, why in await sql.rows(_MEMBERSHIPS, role=key, owners=owners):
        if why is None:
            continue  # a harmless group role: the deployment's business
        if superuser and not admin_is_superuser:
            raise ValidationError(
                f"role {name!r} is a member of the superuser {granted!r}, which only a superuser may "
                "revoke: run create-role connected as a superuser"
            )
        if (sql.connection.dialect.server_version_info or (0,)) >= (16,) and grantor is not None:
            # From Postgres 16 a membership is one grant per grantor: revoke each.
            await sql.run("REVOKE %I FROM %I GRANTED BY %I CASCADE", granted, name, grantor)
        else:
            await sql.run("REVOKE %I FROM %I CASCADE", granted, name)
        done[granted] = f"revoked membership in {granted} ({granted} {why})"
    return list(done.values())


async def _regrant_tables(
    sql: _Session, name: str, key: int, schema: str, tables: dict[str, int]
) -> list[str]:
    """Revoke everything the role holds on memorm's tables, then grant what memorm needs; one line each."""
    extra: dict[str, set[str]] = {}
    for table, kind, grantable in await sql.rows(_EXTRA_GRANTS, tables=list(tables.values()), role=key):
        allowed = ["SELECT"] if table == "alembic_version" else _GRANTED.split(", ")
        if kind not in allowed:
            extra.setdefault(table, set()).add(kind)
        if grantable:
            extra.setdefault(table, set()).add(f"{kind} WITH GRANT OPTION")
    done = []
    for table in tables:
        # CASCADE: what the role granted on with a grant option it should not have had goes too.
        await sql.run("REVOKE ALL ON %I.%I FROM %I CASCADE", schema, table, name)
        granted = "SELECT" if table == "alembic_version" else _GRANTED
        await sql.run(f"GRANT {granted} ON %I.%I TO %I", schema, table, name)
        if table in extra:
            done.append(f"revoked {', '.join(sorted(extra[table]))} on {table}")
        done.append(f"granted {granted} on {table}")
    return done


async def _check_nothing_left(
    sql: _Session, name: str, key: int, tables: dict[str, int], owners: list[int]
) -> None:
    """Refuse (`ValidationError`) if the role still reaches past row-level security by another road."""
    problems = [
        f"is still a member of {still}, which {why}"
        for still, why in await sql.rows(_STILL_MEMBER, role=key, owners=owners)
    ]
    kinds = [*_FORBIDDEN, "INSERT", "UPDATE", "DELETE"]
    for table, kind in await sql.rows(_STILL_GRANTED, tables=list(tables.values()), role=key, kinds=kinds):
        if kind in ("INSERT", "UPDATE", "DELETE") and table != "alembic_version":
            continue  # granted on purpose
        problems.append(f"may still {kind} on {table}")
    if problems:
        raise ValidationError(
            f"role {name!r} {'; '.join(problems)} (granted to PUBLIC, by another grantor, or through a role "
            "it belongs to): revoke it there and run create-role again; nothing was changed"
        )
