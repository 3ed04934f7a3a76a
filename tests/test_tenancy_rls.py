"""Row-level security on Postgres, with the application role `memorm db create-role` makes.

The suite's other Postgres tests connect as a superuser, which Postgres
exempts from row-level security; these connect as a role that is not,
so the policies (and the tenant setting each transaction makes) really run.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
import sqlalchemy as sa
from conftest import Store, app_role, drop_role
from sqlalchemy.engine import make_url

from memorm import Database, ValidationError, metadata
from memorm.models import (
    AGENTS,
    EMBEDDING_MODELS,
    MESSAGES,
    PASSAGES,
    SESSIONS,
    STORE_ITEMS,
    STORE_TABLES,
    STORE_VECTORS,
)
from memorm.rls import TENANT_TABLES
from memorm.tenants import create_role

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

TABLES = (AGENTS, EMBEDDING_MODELS, SESSIONS, MESSAGES, PASSAGES)


@dataclass
class Roles:
    owner: Database  # a superuser: migrations and maintenance
    app: Database  # the application role: subject to row-level security
    role: str
    schema: str
    dsn: str  # the store's database, as an administrator, on the server itself (never a pooler)


@pytest.fixture
def engine() -> str:
    return "postgres"


@pytest.fixture
async def roles(store: Store) -> AsyncIterator[Roles]:
    async with app_role(store) as (owner, app, role):
        yield Roles(owner, app, role, str(store.schema), store.admin_dsn())


async def _fill(db: Database, tenant: str) -> dict[str, Any]:
    """An agent with a session, two messages and a passage, in `tenant`."""
    async with db.unit_of_work(tenant) as uow:
        agent = await uow.agents.create("sam", core_memory={"human": tenant})
        chat = await uow.sessions.create(agent.id, key="chat")
        messages = await uow.messages.append(
            chat.id,
            [{"role": "user", "content": f"hello from {tenant}"}, {"role": "assistant", "content": "hi"}],
        )
        passage = await uow.passages.add(agent.id, f"{tenant} likes tea", [1.0, 0.0])
    return {
        "agent": agent.id,
        "session": chat.id,
        "messages": [m.id for m in messages],
        "passage": passage.id,
    }


async def _tenants_seen(db: Database, tenant: str) -> dict[str, set[str]]:
    """The tenants whose rows raw SQL through `uow.session` sees, per table."""
    async with db.unit_of_work(tenant, read_only=True) as uow:
        return {
            table.name: set((await uow.session.execute(sa.select(table.c.tenant).distinct())).scalars())
            for table in TABLES
        }


async def test_the_app_role_is_subject_to_row_level_security(roles: Roles) -> None:
    await _fill(roles.app, "a")  # the app role writes through the policies
    await _fill(roles.app, "b")
    assert not roles.app.bypasses_rls
    assert roles.owner.bypasses_rls
    assert await _tenants_seen(roles.app, "a") == {table.name: {"a"} for table in TABLES}
    assert await _tenants_seen(roles.app, "b") == {table.name: {"b"} for table in TABLES}
    assert await _tenants_seen(roles.owner, "a") == {table.name: {"a", "b"} for table in TABLES}


async def test_raw_updates_and_deletes_in_one_tenant_touch_only_its_rows(roles: Roles) -> None:
    await _fill(roles.app, "a")
    await _fill(roles.app, "b")
    async with roles.app.unit_of_work("a") as uow:
        for table in TABLES:
            changed = await uow.session.execute(sa.update(table).values(meta={"touched": True}))
            assert changed.rowcount >= 1  # type: ignore[attr-defined]
        deleted = await uow.session.execute(sa.delete(MESSAGES))
        assert deleted.rowcount == 2  # type: ignore[attr-defined]
    async with roles.owner.unit_of_work(read_only=True, all_tenants=True) as uow:
        for table in TABLES:
            rows = (await uow.session.execute(sa.select(table.c.tenant, table.c.meta))).all()
            assert {(tenant, meta == {"touched": True}) for tenant, meta in rows} <= {
                ("a", True),
                ("b", False),
            }
        left = (await uow.session.execute(sa.select(MESSAGES.c.tenant))).scalars().all()
        assert sorted(left) == ["b", "b"]


async def test_raw_inserts_land_in_the_unit_of_works_tenant_and_cannot_name_another(roles: Roles) -> None:
    ids = await _fill(roles.app, "a")
    row = {
        "id": uuid.uuid4(),
        "created_at": sa.func.now(),
        "updated_at": sa.func.now(),
        "meta": {},
        "name": "raw",
        "system": "",
        "core_memory": {},
        "llm_config": {},
        "version": 1,
        "archive_version": 0,
    }
    async with roles.app.unit_of_work("a") as uow:  # no tenant given: the server default is the setting
        await uow.session.execute(sa.insert(AGENTS).values(row))
    with pytest.raises(sa.exc.DBAPIError, match="row-level security"):  # raw SQL: SQLAlchemy's error
        async with roles.app.unit_of_work("a") as uow:
            await uow.session.execute(sa.insert(AGENTS).values({**row, "id": uuid.uuid4(), "tenant": "b"}))
    with pytest.raises(sa.exc.DBAPIError, match="row-level security"):  # raw SQL: SQLAlchemy's error
        async with roles.app.unit_of_work("a") as uow:  # moving a row to another tenant
            await uow.session.execute(sa.update(AGENTS).where(AGENTS.c.id == ids["agent"]).values(tenant="b"))
    async with roles.owner.unit_of_work(read_only=True, all_tenants=True) as uow:
        found = (await uow.session.execute(sa.select(AGENTS.c.tenant, AGENTS.c.name))).all()
    assert sorted(found) == [("a", "raw"), ("a", "sam")]


async def test_a_connection_with_no_tenant_set_sees_nothing_and_writes_nothing(roles: Roles) -> None:
    await _fill(roles.app, "a")
    connection = await asyncpg.connect(
        make_url(roles.dsn).set(username=roles.role).render_as_string(hide_password=False),
        server_settings={"search_path": f"{roles.schema},public"},
    )
    try:
        for table in TABLES:
            assert await connection.fetchval(f"SELECT count(*) FROM {table.name}") == 0
        assert await connection.fetchval("SELECT count(*) FROM agents WHERE tenant = 'a'") == 0
        with pytest.raises(asyncpg.PostgresError):  # NOT NULL: the default is the unset setting
            await connection.execute(
                "INSERT INTO agents (id, created_at, updated_at, meta, name, system, core_memory, "
                "llm_config, version, archive_version) VALUES (gen_random_uuid(), now(), now(), "
                "'{}', 'x', '', '{}', '{}', 1, 0)"
            )
        with pytest.raises(asyncpg.PostgresError, match="row-level security"):
            await connection.execute(
                "INSERT INTO agents (tenant, id, created_at, updated_at, meta, name, system, core_memory, "
                "llm_config, version, archive_version) VALUES ('a', gen_random_uuid(), now(), now(), "
                "'{}', 'x', '', '{}', '{}', 1, 0)"
            )
        # After a unit of work's transaction, its tenant is gone from the connection.
        async with connection.transaction():
            await connection.execute("SELECT set_config('memorm.tenant', 'a', true)")
            assert await connection.fetchval("SELECT count(*) FROM agents") == 1
        assert await connection.fetchval("SELECT count(*) FROM agents") == 0
    finally:
        await connection.close()


async def test_all_tenants_needs_a_role_that_bypasses_row_level_security(roles: Roles) -> None:
    await _fill(roles.app, "a")
    with pytest.raises(ValidationError, match="bypasses row-level security"):
        async with roles.app.unit_of_work(all_tenants=True):
            pass
    async with roles.owner.unit_of_work(all_tenants=True, read_only=True) as uow:
        assert (await uow.session.execute(sa.select(sa.func.count()).select_from(AGENTS))).scalar() == 1


async def test_one_pooled_connection_alternating_tenants_never_shows_another(roles: Roles) -> None:
    app = roles.app.clone(pool_size=1, max_overflow=0)
    try:
        ids = {tenant: await _fill(app, tenant) for tenant in ("a", "b")}
        for turn in range(1_000):
            tenant = "ab"[turn % 2]
            read_only = turn % 4 < 2
            async with app.unit_of_work(tenant, read_only=read_only) as uow:
                seen = set((await uow.session.execute(sa.select(AGENTS.c.tenant))).scalars())
                assert seen == {tenant}
                window = await uow.messages.window(ids[tenant]["session"])
                assert [m.content for m in window] == [f"hello from {tenant}", "hi"]
                other = ids["ba"[turn % 2]]["session"]
                assert (
                    await uow.session.execute(sa.select(SESSIONS.c.id).where(SESSIONS.c.id == other))
                ).all() == []
    finally:
        await app.dispose()


async def test_create_role_is_idempotent_and_refuses_the_tables_owner(roles: Roles) -> None:
    done = await create_role(roles.owner, roles.role)
    assert done[0].startswith(f"role {roles.role} updated")
    admin = await asyncpg.connect(roles.dsn)
    try:
        flags = await admin.fetchrow(
            "SELECT rolsuper, rolbypassrls, rolcanlogin FROM pg_roles WHERE rolname = $1", roles.role
        )
        owner = await admin.fetchval(
            "SELECT tableowner FROM pg_tables WHERE tablename = 'agents' AND schemaname = $1", roles.schema
        )
    finally:
        await admin.close()
    assert tuple(flags) == (False, False, True)
    with pytest.raises(ValidationError, match="owns memorm's tables"):
        await create_role(roles.owner, owner)


_FLAGS = (
    "SELECT rolsuper, rolbypassrls, rolreplication, rolcreaterole, rolcreatedb"
    " FROM pg_roles WHERE rolname = $1"
)
_IN_LINE = "LOGIN NOSUPERUSER NOBYPASSRLS NOREPLICATION NOCREATEROLE NOCREATEDB"


async def test_create_role_takes_from_an_existing_role_all_that_escapes_row_level_security(
    roles: Roles,
) -> None:
    role, schema, suffix = roles.role, roles.schema, uuid.uuid4().hex[:8]
    group, harmless = f"memorm_group_{suffix}", f"memorm_harmless_{suffix}"
    admin = await asyncpg.connect(roles.dsn)
    try:
        owner = await admin.fetchval(
            "SELECT tableowner FROM pg_tables WHERE tablename = 'agents' AND schemaname = $1", schema
        )
        await admin.execute(
            f'ALTER ROLE "{role}" CREATEROLE CREATEDB REPLICATION BYPASSRLS;'
            f'CREATE ROLE "{group}" NOLOGIN; GRANT "{owner}" TO "{group}"; GRANT "{group}" TO "{role}";'
            f'CREATE ROLE "{harmless}" NOLOGIN; GRANT "{harmless}" TO "{role}";'
            f'GRANT "{owner}" TO "{role}";'
            f'GRANT TRUNCATE, REFERENCES, TRIGGER ON "{schema}".agents TO "{role}";'
            f'GRANT SELECT ON "{schema}".messages TO "{role}" WITH GRANT OPTION;'
            f'GRANT CREATE ON SCHEMA "{schema}" TO "{role}";'
        )
        app = await asyncpg.connect(roles.dsn, user=role)
        try:
            await app.execute(f'SET ROLE "{owner}"; RESET ROLE')  # the owner's powers, for the asking

            done = await create_role(roles.owner, role)

            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await app.execute(f'SET ROLE "{owner}"')
        finally:
            await app.close()
        flags = await admin.fetchrow(_FLAGS, role)
        members = await admin.fetch(
            "SELECT r.rolname FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid "
            "JOIN pg_roles u ON u.oid = m.member WHERE u.rolname = $1",
            role,
        )
        privileges = await admin.fetchrow(
            "SELECT has_table_privilege($1, $2 || '.agents', 'TRUNCATE'),"
            " has_table_privilege($1, $2 || '.agents', 'REFERENCES'),"
            " has_table_privilege($1, $2 || '.agents', 'TRIGGER'),"
            " has_table_privilege($1, $2 || '.messages', 'SELECT WITH GRANT OPTION'),"
            " has_schema_privilege($1, $2, 'CREATE'),"
            " has_table_privilege($1, $2 || '.messages', 'SELECT')",
            role,
            schema,
        )
    finally:
        for made in (group, harmless):
            await drop_role(admin, made)
        await admin.close()
    assert tuple(flags) == (False, False, False, False, False)
    assert [row["rolname"] for row in members] == [harmless]  # a harmless group stays
    assert tuple(privileges) == (False, False, False, False, False, True)
    assert done[0] == f"role {role} updated: {_IN_LINE}"
    assert f"removed BYPASSRLS, REPLICATION, CREATEROLE, CREATEDB from role {role}" in done
    assert f"revoked membership in {owner} ({owner} is a superuser)" in done
    assert f"revoked membership in {group} ({group} is a member of {owner}, which is a superuser)" in done
    assert "revoked REFERENCES, TRIGGER, TRUNCATE on agents" in done
    assert "revoked SELECT WITH GRANT OPTION on messages" in done
    assert f"revoked CREATE on schema {schema}" in done
    assert not any(harmless in line for line in done)
    granted = [line for line in done if line.startswith("granted ") and " on " in line]
    assert [line for line in granted if line.endswith(tuple(metadata.tables))] == [
        f"granted SELECT, INSERT, UPDATE, DELETE on {table}" for table in metadata.tables
    ]
    assert "granted SELECT on alembic_version" in done
    await _fill(roles.app, "a")  # memorm works as before, in one tenant at a time
    await _fill(roles.app, "b")
    assert await _tenants_seen(roles.app, "a") == {table.name: {"a"} for table in TABLES}


async def test_create_role_refuses_a_superuser_and_leaves_it_as_it_was(roles: Roles) -> None:
    superuser = f"memorm_super_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(roles.dsn)
    try:
        await admin.execute(f'CREATE ROLE "{superuser}" LOGIN SUPERUSER CREATEDB')
        with pytest.raises(ValidationError, match=f"role '{superuser}' is a superuser"):
            await create_role(roles.owner, superuser)
        assert tuple(await admin.fetchrow(_FLAGS, superuser)) == (True, False, False, False, True)
        granted = await admin.fetchval(
            "SELECT count(*) FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a "
            "JOIN pg_roles r ON r.oid = a.grantee WHERE r.rolname = $1",
            superuser,
        )
        assert granted == 0
    finally:
        await drop_role(admin, superuser)
        await admin.close()


async def test_create_role_refuses_what_it_cannot_revoke_and_changes_nothing(roles: Roles) -> None:
    """TRUNCATE granted to PUBLIC reaches the role past its own grants: refused, all rolled back."""
    admin = await asyncpg.connect(roles.dsn)
    try:
        await admin.execute(
            f'ALTER ROLE "{roles.role}" CREATEDB; GRANT TRUNCATE ON "{roles.schema}".sessions TO PUBLIC'
        )
        with pytest.raises(ValidationError, match=r"may still TRUNCATE on sessions \(granted to PUBLIC"):
            await create_role(roles.owner, roles.role)
        assert tuple(await admin.fetchrow(_FLAGS, roles.role)) == (False, False, False, False, True)
        await admin.execute(f'REVOKE TRUNCATE ON "{roles.schema}".sessions FROM PUBLIC')
        await create_role(roles.owner, roles.role)  # once revoked there, it goes through
        assert tuple(await admin.fetchrow(_FLAGS, roles.role)) == (False, False, False, False, False)
    finally:
        await admin.close()


@pytest.mark.direct  # roles of its own, logging in straight to the server
async def test_create_role_run_by_a_createrole_owner_who_is_no_superuser(store: Store) -> None:
    """The documented administrator: a CREATEROLE role that owns memorm's tables, not a superuser."""
    suffix = uuid.uuid4().hex[:8]
    owner, app, bypassing = f"memorm_owner_{suffix}", f"memorm_app_{suffix}", f"memorm_bypass_{suffix}"
    admin = await asyncpg.connect(store.admin_dsn())
    db = None
    try:
        await admin.execute(
            f'CREATE ROLE "{owner}" LOGIN CREATEROLE; ALTER SCHEMA "{store.schema}" OWNER TO "{owner}";'
            f'CREATE ROLE "{app}" LOGIN CREATEDB CREATEROLE; GRANT "{owner}" TO "{app}";'
            f'CREATE ROLE "{bypassing}" LOGIN BYPASSRLS'
        )
        url = make_url(store.url).set(username=owner).render_as_string(hide_password=False)
        db = Database(url, **store.options)
        await db.upgrade()  # the tables are the owner's

        done = await create_role(db, app)
        assert f"removed CREATEROLE, CREATEDB from role {app}" in done
        assert f"revoked membership in {owner} ({owner} owns memorm's tables)" in done
        assert any(line.startswith("CONNECT on database ") and "granted already" in line for line in done)
        assert tuple(await admin.fetchrow(_FLAGS, app)) == (False, False, False, False, False)
        assert not await admin.fetchval("SELECT pg_has_role($1, $2, 'MEMBER')", app, owner)

        with pytest.raises(ValidationError, match="has BYPASSRLS, which only a superuser may remove"):
            await create_role(db, bypassing)
        assert tuple(await admin.fetchrow(_FLAGS, bypassing)) == (False, True, False, False, False)
    finally:
        if db is not None:
            await db.dispose()
        for made in (app, bypassing, owner):  # the owner last: DROP OWNED takes its schema
            await drop_role(admin, made)
        await admin.close()


async def test_create_role_run_by_many_at_once_makes_every_role(roles: Roles) -> None:
    # Each GRANT CONNECT rewrites the database's catalog row: unserialized, two at once
    # fail with "tuple concurrently updated".
    names = [f"memorm_many_{uuid.uuid4().hex[:8]}" for _ in range(6)]
    try:
        for _ in range(2):  # the second round updates roles that exist
            await asyncio.gather(*(create_role(roles.owner, name) for name in names))
        admin = await asyncpg.connect(roles.dsn)
        try:
            granted = await admin.fetchval(
                "SELECT count(*) FROM pg_roles WHERE rolname = ANY($1::text[])"
                " AND has_database_privilege(rolname, current_database(), 'CONNECT')",
                names,
            )
        finally:
            await admin.close()
        assert granted == len(names)
    finally:
        admin = await asyncpg.connect(roles.dsn)  # DROP OWNED reaches the grants of this database only
        try:
            for name in names:
                await drop_role(admin, name)
        finally:
            await admin.close()


async def test_all_tenants_works_for_a_superuser_after_create_all(store: Store) -> None:
    db = store.database()
    await db.create_all()  # as conftest's `db` fixture does
    try:
        await _fill(db, "a")
        await _fill(db, "b")
        async with db.unit_of_work(read_only=True, all_tenants=True) as uow:
            tenants = set((await uow.session.execute(sa.select(AGENTS.c.tenant))).scalars())
        assert tenants == {"a", "b"}
        assert db.bypasses_rls
    finally:
        await db.dispose()


async def test_a_tenants_transaction_begins_once_whatever_savepoints_it_takes(roles: Roles) -> None:
    """Writes that may conflict run in a SAVEPOINT; the tenant's BEGIN is not sent again for one."""
    notices: list[object] = []

    def listen(dbapi_connection: Any, _record: object) -> None:
        dbapi_connection.driver_connection.add_log_listener(lambda _c, message: notices.append(message))

    sa.event.listen(roles.app.engine.sync_engine, "connect", listen)
    await _fill(roles.app, "acme")  # agents and sessions are created in savepoints
    async with roles.app.unit_of_work("acme", read_only=True) as uow:
        assert await uow.agents.get_by_name("sam") is not None
    assert notices == []  # was: "there is already a transaction in progress", per savepoint


async def test_every_table_is_a_tenant_table_with_row_level_security_after_the_migrations(
    roles: Roles,
) -> None:
    assert {table.name for table in TENANT_TABLES} == set(metadata.tables)
    async with roles.owner.engine.connect() as connection:  # the schema alembic built (0001..head)
        rows = await connection.execute(
            sa.text(
                "SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity, EXISTS ("
                "  SELECT 1 FROM pg_policy p WHERE p.polrelid = c.oid AND p.polname = 'memorm_tenant')"
                " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = :schema AND c.relkind = 'r'"
            ),
            {"schema": roles.schema},
        )
        found = {name: (enabled, forced, policy) for name, enabled, forced, policy in rows}
    assert {name: found.get(name) for name in metadata.tables} == {
        name: (True, True, True) for name in metadata.tables
    }


async def test_the_graph_store_tables_show_each_tenant_its_own_rows(roles: Roles) -> None:
    from memorm.compat.langgraph import MemormStore

    index = {"dims": 2, "embed": lambda texts: [[1.0, 0.5] for _ in texts]}
    for tenant in ("a", "b"):
        view = roles.app.for_tenant(tenant)
        async with view.unit_of_work() as uow:
            agent = await uow.agents.create("sam")
        await MemormStore(view, agent=agent.id, index=index).aput(("notes",), "k", {"by": tenant})
    for tenant in ("a", "b"):
        async with roles.app.unit_of_work(tenant, read_only=True) as uow:
            for table in STORE_TABLES:
                assert set((await uow.session.execute(sa.select(table.c.tenant))).scalars()) == {tenant}
    async with roles.app.unit_of_work("a") as uow:  # raw SQL in one tenant touches its rows only
        changed = await uow.session.execute(sa.update(STORE_ITEMS).values(value={"by": "x"}))
        assert changed.rowcount == 1  # type: ignore[attr-defined]
    await roles.app.delete_tenant("a")
    async with roles.owner.unit_of_work(read_only=True, all_tenants=True) as uow:
        items = (await uow.session.execute(sa.select(STORE_ITEMS.c.tenant, STORE_ITEMS.c.value))).all()
        assert [tuple(row) for row in items] == [("b", {"by": "b"})]
        vectors = (await uow.session.execute(sa.select(STORE_VECTORS.c.tenant))).scalars().all()
        assert vectors == ["b"]
