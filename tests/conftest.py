"""One suite, two engines.

Every test that takes ``db`` runs twice: on a fresh SQLite file (mark
``sqlite``) and on a fresh schema of the Postgres server (mark ``postgres``) at
``MEMORM_TEST_POSTGRES_URL``.  Postgres tests skip when the server is
unreachable, unless ``MEMORM_REQUIRE_POSTGRES=1`` (set by ``.ci/run``), which
turns any skipped Postgres test into a failed run.

``MEMORM_TEST_CITUS=1`` runs the Postgres tests that take ``db`` on the local
Citus cluster instead (``../shared/recipes/citus-cluster``): the URL becomes
a database of the cluster (one per xdist worker), and each test's schema is distributed by agent
(``db.distribute()``) before the test runs.  Tests marked ``single_node``
(they check what a single server does: query plans, one connection's view)
are left out then, and so are tests that build their own database from a URL.

``MEMORM_TEST_PGBOUNCER=1`` puts PgBouncer in transaction mode
(``../shared/recipes/pgbouncer``, port 6432, or ``MEMORM_TEST_PGBOUNCER_PORT``)
between the Postgres tests and the server: each test's store is a database
of its own on the server (copied from a template database with the
extensions, made once per run), reached through PgBouncer with
``Database(transaction_pooling=True)``.  A database, not a schema:
PgBouncer refuses a ``search_path`` startup parameter.  Tests marked
``direct`` (they need what only a connection of their own to the server
gives: its session's settings, LISTEN, a backend's identity) are left out
then.  With ``MEMORM_TEST_POSTGRES_ROLE=app`` too, the application role is
listed in PgBouncer's auth file for the test.

Property-based tests take their example counts from a hypothesis profile,
chosen by ``HYPOTHESIS_PROFILE``: ``dev`` (the default, quick) or ``ci``
(200 examples per property: ``.ci/run`` runs the tests marked ``property``,
which are every property-based test, so too).  Tests set no ``max_examples``
of their own, so the profile applies to all of them.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, settings
from sqlalchemy.engine import make_url

from memorm import Database
from memorm.errors import DatabaseError
from memorm.roles import ROLE_LOCK, create_role

REQUIRE_POSTGRES = os.environ.get("MEMORM_REQUIRE_POSTGRES") == "1"
CITUS = os.environ.get("MEMORM_TEST_CITUS") == "1"
# The machine's recipes (Citus, pg-scratch, PgBouncer): MEMORM_RECIPES (.ci/run sets it), else
# beside the checkout.
RECIPES = Path(os.environ.get("MEMORM_RECIPES") or Path(__file__).resolve().parents[2] / "shared" / "recipes")
CITUS_RECIPE = RECIPES / "citus-cluster" if (RECIPES / "citus-cluster").is_file() else None
# One suite database per xdist worker: the workers' tests then never share a schema pool.
CITUS_SUITE_DATABASE = "memorm_suite" + (
    f"_{os.environ['PYTEST_XDIST_WORKER']}" if "PYTEST_XDIST_WORKER" in os.environ else ""
)


@contextmanager
def _one_worker_at_a_time() -> Iterator[None]:
    """Hold the run's lock on setting up the cluster's suite databases (a no-op off Citus).

    xdist's workers starting together on a new machine made their databases, and then
    their extensions, at once: one failed with "tuple concurrently updated" (Citus
    propagates both to every node), and every test of that worker errored.
    """
    if not CITUS:
        yield
        return
    with open(Path(tempfile.gettempdir()) / "memorm-citus-setup.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _citus_suite_url() -> str:
    """The suite's database on the Citus cluster (made on every node by the recipe; reused)."""
    if CITUS_RECIPE is None:
        raise RuntimeError("MEMORM_TEST_CITUS=1 but the citus-cluster recipe was not found")

    async def few_shards(url: str) -> None:  # 4 shards a table, not 32: each test distributes a schema
        connection = await asyncpg.connect(url, timeout=10)
        try:
            await connection.execute(f"ALTER DATABASE {CITUS_SUITE_DATABASE} SET citus.shard_count = 4")
        finally:
            await connection.close()

    with _one_worker_at_a_time():
        made = subprocess.run(
            [str(CITUS_RECIPE), "newdb", CITUS_SUITE_DATABASE], capture_output=True, text=True, check=True
        )
        url = make_url(made.stdout.strip().splitlines()[-1])
        asyncio.run(few_shards(url.render_as_string(hide_password=False)))
    return url.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)


POSTGRES_URL = (
    _citus_suite_url()
    if CITUS
    else os.environ.get("MEMORM_TEST_POSTGRES_URL", "postgresql+asyncpg://root@127.0.0.1:5432/test")
)
PGBOUNCER = os.environ.get("MEMORM_TEST_PGBOUNCER") == "1"
PGBOUNCER_PORT = int(os.environ.get("MEMORM_TEST_PGBOUNCER_PORT", "6432"))
if PGBOUNCER and CITUS:
    raise RuntimeError("MEMORM_TEST_PGBOUNCER=1 and MEMORM_TEST_CITUS=1 cannot be combined")
# Examples share the test's database (a function-scoped fixture) on purpose; each
# one runs real statements on both engines, so no per-example deadline.
_PROPERTIES: dict[str, Any] = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
}
settings.register_profile("dev", max_examples=30, **_PROPERTIES)
settings.register_profile("ci", max_examples=200, print_blob=True, **_PROPERTIES)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

ENGINES = [
    pytest.param("sqlite", marks=pytest.mark.sqlite),
    pytest.param("postgres", marks=pytest.mark.postgres),
]


def asyncpg_dsn(url: str = POSTGRES_URL) -> str:
    """The plain libpq-style DSN asyncpg takes for a SQLAlchemy URL."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


_postgres_state: dict[str, str | None] = {}


def postgres_unavailable() -> str | None:
    """Why Postgres cannot be used (None when it can); checked once per run."""
    if "reason" not in _postgres_state:

        async def probe() -> None:
            connection = await asyncpg.connect(asyncpg_dsn(), timeout=5)
            try:
                # Installed once in public: per-test schemas share it, and a
                # test dropping its schema must never drop the extension.
                with _one_worker_at_a_time():
                    await connection.execute("CREATE EXTENSION IF NOT EXISTS vector SCHEMA public")
                    await connection.execute("CREATE EXTENSION IF NOT EXISTS btree_gin SCHEMA public")
            finally:
                await connection.close()
            if PGBOUNCER:  # and PgBouncer in front of it
                pooler = _pgbouncer_url(str(make_url(POSTGRES_URL).database))
                await (await asyncpg.connect(asyncpg_dsn(pooler), statement_cache_size=0, timeout=5)).close()

        try:
            asyncio.run(probe())
            _postgres_state["reason"] = None
        except Exception as error:  # unreachable server, missing pgvector…
            _postgres_state["reason"] = f"Postgres at {make_url(POSTGRES_URL)!r} unusable: {error}"
    return _postgres_state["reason"]


@dataclass
class Store:
    """Where one test's data lives: a SQLite file or a Postgres schema."""

    engine: str
    url: str
    options: dict[str, Any] = field(default_factory=dict)
    schema: str | None = None
    # The schema comes from the pool, created (and on Citus distributed) already.
    ready: bool = False
    # The schema may go back to the pool after the test (see `_keep_schema`).
    pooled: bool = False
    # MEMORM_TEST_PGBOUNCER=1: the store's own database (its tables in `public`).
    own_database: str | None = None

    def database(self, **engine_options: Any) -> Database:
        """Another ``Database`` on the same store (its own engine and pool; through PgBouncer with
        ``transaction_pooling=True`` under MEMORM_TEST_PGBOUNCER=1, which ``options`` carries)."""
        return Database(self.url, **{**self.options, **engine_options})

    def admin_dsn(self) -> str:
        """An asyncpg DSN of the store's database on the server itself, never through PgBouncer
        (a schema store's DSN: set its search_path to reach the schema)."""
        if self.own_database is None:
            return asyncpg_dsn()
        url = make_url(POSTGRES_URL).set(database=self.own_database)
        return asyncpg_dsn(url.render_as_string(hide_password=False))


def usable_engine(name: str) -> str:
    """`name`, once usable: without a server, Postgres tests skip (fail under MEMORM_REQUIRE_POSTGRES=1)."""
    if name == "postgres":
        reason = postgres_unavailable()
        if reason is not None:
            if REQUIRE_POSTGRES:
                pytest.fail(f"MEMORM_REQUIRE_POSTGRES=1 but {reason}")
            pytest.skip(reason)
    return name


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return usable_engine(request.param)


@pytest.fixture
async def store(engine: str, tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    """An empty store (no schema) for one test; for a test on `db`, perhaps a pooled schema (below)."""
    if engine == "sqlite":
        yield Store(engine, f"sqlite+aiosqlite:///{tmp_path / 'memorm.db'}")
        return
    if PGBOUNCER:
        name = f"t_{uuid.uuid4().hex[:16]}"
        await admin_execute(f'CREATE DATABASE "{name}" TEMPLATE "{await _pgbouncer_template()}"')
        try:
            yield Store(
                engine,
                _pgbouncer_url(name),
                {"transaction_pooling": True, "connect_args": {"server_settings": {}}},
                "public",
                own_database=name,
            )
        finally:
            await admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        return
    pooled = CITUS or "db" in request.fixturenames  # a test on `db` takes memorm's schema as it comes
    reused = _schema_pool.pop() if pooled and _schema_pool else None
    schema = reused or f"t_{uuid.uuid4().hex[:16]}"
    admin = await asyncpg.connect(asyncpg_dsn())
    try:
        if reused is None:
            await admin.execute(f'CREATE SCHEMA "{schema}"')
        yield Store(
            engine,
            POSTGRES_URL,
            {"connect_args": {"server_settings": {"search_path": f"{schema},public"}}},
            schema,
            ready=reused is not None,
            pooled=pooled,
        )
    finally:
        if not (pooled and await _keep_schema(admin, schema)):
            await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await admin.close()


# -- Postgres: each schema is created once, then emptied and reused ---------------
# Creating memorm's schema costs about a hundred DDL statements (110 ms; on Citus,
# distributing it, seconds); emptying its tables (TRUNCATE) a fraction of that.  A
# schema goes back to the pool only if the test left it as it was made; otherwise
# it is dropped.  On one server, "as made" is read off the catalogs' own bookkeeping
# (`_CATALOG_MARK`: how many catalog rows describe the schema, and the newest
# transaction that wrote one), in a few milliseconds: any DDL the test ran (an index,
# a column, a grant, a dropped policy) writes or deletes a row.  On Citus, where
# shards live on the workers, the schema's whole shape (tables, columns, indexes,
# constraints, policies, triggers, distribution) is compared with the first
# distributed schema's.  Emptied, a schema's planner statistics go too, so no test
# plans with another's data.  Only tests on the `db` fixture take a pooled schema:
# a test on `store` gets an empty one.

_schema_pool: list[str] = []
_pristine_shape: list[str] = []
_catalog_marks: dict[str, tuple[int, int]] = {}  # schema -> its `_CATALOG_MARK` as pooled

_CATALOG_MARK = """
SELECT count(*), coalesce(max(x::text::bigint), 0) FROM (
    SELECT xmin AS x FROM pg_namespace WHERE oid = $1::regnamespace
    UNION ALL SELECT xmin FROM pg_class WHERE relnamespace = $1::regnamespace
    UNION ALL SELECT a.xmin FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        WHERE c.relnamespace = $1::regnamespace
    UNION ALL SELECT xmin FROM pg_constraint WHERE connamespace = $1::regnamespace
    UNION ALL SELECT i.xmin FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
        WHERE c.relnamespace = $1::regnamespace
    UNION ALL SELECT d.xmin FROM pg_attrdef d JOIN pg_class c ON c.oid = d.adrelid
        WHERE c.relnamespace = $1::regnamespace
    UNION ALL SELECT p.xmin FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid
        WHERE c.relnamespace = $1::regnamespace
    UNION ALL SELECT t.xmin FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        WHERE c.relnamespace = $1::regnamespace
) written
"""


async def _catalog_mark(admin: asyncpg.Connection, schema: str) -> tuple[int, int] | None:
    """How many catalog rows describe `schema`, and the newest transaction that wrote one (None: gone)."""
    if await admin.fetchval("SELECT 1 FROM pg_namespace WHERE nspname = $1", schema) is None:
        return None
    count, newest = await admin.fetchrow(_CATALOG_MARK, schema)
    return int(count), int(newest)


_SHAPE = """
SELECT coalesce(string_agg(item, E'\n' ORDER BY item), '') FROM (
    SELECT 'index ' || indexdef AS item FROM pg_indexes WHERE schemaname = $1
    UNION ALL
    SELECT 'constraint ' || c.relname || ' ' || k.conname || ' ' || pg_get_constraintdef(k.oid)
    FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid WHERE k.connamespace = $1::regnamespace
    UNION ALL
    SELECT 'column ' || c.relname || ' ' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
        || ' ' || a.attnotnull || ' ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
    FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
    LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
    WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('r', 'p')
        AND a.attnum > 0 AND NOT a.attisdropped
    UNION ALL
    SELECT 'table ' || relname || ' ' || relrowsecurity || ' ' || relforcerowsecurity
    FROM pg_class WHERE relnamespace = $1::regnamespace AND relkind IN ('r', 'p', 'v', 'm', 'S')
    UNION ALL
    SELECT 'policy ' || tablename || ' ' || policyname || ' '
        || coalesce(qual, '') || coalesce(with_check, '')
    FROM pg_policies WHERE schemaname = $1
    UNION ALL
    SELECT 'trigger ' || t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
    WHERE c.relnamespace = $1::regnamespace AND NOT t.tgisinternal
    {distributed}
) shape
"""
_DISTRIBUTED_SHAPE = """UNION ALL
    SELECT 'distributed ' || (logicalrelid::regclass)::text || ' ' || colocationid::text
    FROM pg_dist_partition WHERE logicalrelid::regclass::text LIKE $1 || '.%'"""
_SHAPE = _SHAPE.format(distributed=_DISTRIBUTED_SHAPE if CITUS else "")


async def _schema_shape(admin: asyncpg.Connection, schema: str) -> str | None:
    """The schema's shape with its name taken out (None once it is gone)."""
    if await admin.fetchval("SELECT 1 FROM pg_namespace WHERE nspname = $1", schema) is None:
        return None
    shape = str(await admin.fetchval(_SHAPE, schema))
    return shape.replace(f'"{schema}".', "").replace(f"{schema}.", "")


async def _remember_shape(admin: asyncpg.Connection, schema: str) -> None:
    """Record a freshly made schema as made (on Citus: the process's first distributed one's shape)."""
    if not CITUS:
        mark = await _catalog_mark(admin, schema)
        assert mark, f"schema {schema} is gone"
        _catalog_marks[schema] = mark
        return
    if not _pristine_shape:
        shape = await _schema_shape(admin, schema)
        assert shape, f"schema {schema} has no shape"
        _pristine_shape.append(shape)


async def _keep_schema(admin: asyncpg.Connection, schema: str) -> bool:
    """Empty `schema` and pool it, when the test left it as made; else False."""
    if CITUS:
        shape = await _schema_shape(admin, schema)
        if shape is None or not _pristine_shape or shape != _pristine_shape[0]:
            return False
    else:
        made = _catalog_marks.pop(schema, None)
        if made is None or await _catalog_mark(admin, schema) != made:
            return False
    tables = await admin.fetch(
        "SELECT tablename FROM pg_tables WHERE schemaname = $1 AND tablename <> 'alembic_version'", schema
    )
    if not tables:
        return False
    await admin.execute(
        "TRUNCATE " + ", ".join(f'"{schema}"."{row["tablename"]}"' for row in tables) + " CASCADE"
    )
    if not CITUS:  # the planner's statistics of the test's rows (Citus keeps them on the workers)
        await admin.execute(_FORGET_STATISTICS, schema)
        mark = await _catalog_mark(admin, schema)  # TRUNCATE gave the tables new files: new rows
        assert mark is not None
        _catalog_marks[schema] = mark
    _schema_pool.append(schema)
    return True


_FORGET_STATISTICS = """
DELETE FROM pg_statistic WHERE starelid IN (SELECT oid FROM pg_class WHERE relnamespace = $1::regnamespace)
"""


def _drop_schema_pool() -> None:
    async def drop() -> None:
        admin = await asyncpg.connect(asyncpg_dsn())
        try:
            while _schema_pool:
                await admin.execute(f'DROP SCHEMA IF EXISTS "{_schema_pool.pop()}" CASCADE')
        finally:
            await admin.close()

    if _schema_pool:
        asyncio.run(drop())


# -- MEMORM_TEST_PGBOUNCER=1: a database per test, through PgBouncer ---------------
# Each test's database is copied from a template that has the extensions (CREATE
# DATABASE ... TEMPLATE: a few milliseconds, where CREATE EXTENSION costs hundreds).
# One template per run (xdist's workers share the controller's run id), dropped at the
# end by the controller; nobody ever connects to it once it is made, since CREATE
# DATABASE refuses a template that has sessions.

_pgbouncer_templates: list[str] = []


def _pgbouncer_url(database: str, username: str | None = None) -> str:
    url = make_url(POSTGRES_URL).set(host="127.0.0.1", port=PGBOUNCER_PORT, database=database)
    if username is not None:
        url = url.set(username=username)
    return url.render_as_string(hide_password=False)


async def _pgbouncer_template() -> str:
    """The run's template database (pgvector and btree_gin installed), made on first use."""
    name = f"memorm_tpl_{os.environ['MEMORM_TEST_RUN']}"
    if _pgbouncer_templates:
        return name
    admin = await asyncpg.connect(asyncpg_dsn())
    try:
        if not await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            # Made under a name of its own, then renamed: another worker never copies a half-made one.
            draft = f"{name}_{uuid.uuid4().hex[:8]}"
            await admin.execute(f'CREATE DATABASE "{draft}"')
            draft_url = make_url(POSTGRES_URL).set(database=draft).render_as_string(hide_password=False)
            connection = await asyncpg.connect(asyncpg_dsn(draft_url))
            try:
                await connection.execute("CREATE EXTENSION vector; CREATE EXTENSION btree_gin")
            finally:
                await connection.close()
            for attempt in range(50):
                try:
                    await admin.execute(f'ALTER DATABASE "{draft}" RENAME TO "{name}"')
                    break
                # Another worker's came first (a rename racing another's trips the catalog's
                # unique index rather than the name check).
                except (asyncpg.DuplicateDatabaseError, asyncpg.UniqueViolationError):
                    await admin.execute(f'DROP DATABASE "{draft}" WITH (FORCE)')
                    break
                except asyncpg.ObjectInUseError:  # our session to it has not quite left
                    if attempt == 49:
                        raise
                    await asyncio.sleep(0.1)
    finally:
        await admin.close()
    _pgbouncer_templates.append(name)
    return name


def _pgbouncer_drop_template(config: pytest.Config) -> None:
    if not PGBOUNCER or hasattr(config, "workerinput"):  # the controller drops it, once workers are done
        return
    name = f"memorm_tpl_{os.environ['MEMORM_TEST_RUN']}"
    asyncio.run(admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def pgbouncer_user(role: str, *, listed: bool, port: int = PGBOUNCER_PORT) -> None:
    """List (or unlist) `role` in the auth file of the recipe's PgBouncer on `port`, and make
    PgBouncer reread it (SIGHUP).

    The recipe's PgBouncer trusts every user it lists, and only those.
    """
    folder = Path(f"/etc/pgbouncer-memorm-{port}")
    line = f'"{role}" ""\n'
    with open(folder / "userlist.txt", "r+") as userlist:
        fcntl.flock(userlist, fcntl.LOCK_EX)  # other workers add and remove theirs
        lines = [kept for kept in userlist.readlines() if kept != line]
        if listed:
            lines.append(line)
        userlist.seek(0)
        userlist.truncate()
        userlist.writelines(lines)
        userlist.flush()
        os.kill(int((folder / "pgbouncer.pid").read_text()), signal.SIGHUP)


async def pgbouncer_admits(url: str) -> None:
    """Wait until PgBouncer (rereading its auth file) lets `url`'s user in."""
    for attempt in range(100):
        try:
            connection = await asyncpg.connect(asyncpg_dsn(url), statement_cache_size=0, timeout=5)
        except asyncpg.PostgresError:
            if attempt == 99:
                raise
            await asyncio.sleep(0.05)
        else:
            await connection.close()
            return


# MEMORM_TEST_POSTGRES_ROLE=app: the ``db`` fixture's Postgres database connects as
# an application role subject to row-level security (memorm db create-role), not
# as the superuser, which Postgres exempts from it.  .ci/run runs the chat-path
# test files so too.
APP_ROLE = os.environ.get("MEMORM_TEST_POSTGRES_ROLE") == "app"


def _left_out(item: pytest.Item) -> bool:
    """Whether this run leaves `item` out (the application role's run, or the Citus run)."""
    if APP_ROLE and "owner" in item.keywords and "postgres" in item.keywords:
        return True
    if PGBOUNCER and "direct" in item.keywords and "postgres" in item.keywords:
        return True
    if CITUS:  # only Postgres tests on the suite's distributed schemas
        # The db fixture, or the SDK suites' backend, LangGraph's store suite and graph suite (a
        # Database from probes.tagged_database, for a saver, a store or both).
        uses_db = {"db", "backend", "_memorm_store", "graph_database"} & set(
            getattr(item, "fixturenames", ())
        )
        return "postgres" not in item.keywords or "single_node" in item.keywords or not uses_db
    return False


def pytest_configure(config: pytest.Config) -> None:
    # One id per run, inherited by xdist's workers (started after this): names the run's
    # PgBouncer template database.
    os.environ.setdefault("MEMORM_TEST_RUN", uuid.uuid4().hex[:12])


def pytest_sessionstart(session: pytest.Session) -> None:
    """Once per run (not per xdist worker): clean the test database's catalogs."""
    if not hasattr(session.config, "workerinput") and not CITUS:
        _vacuum_catalogs()


# The catalogs each test's schema is written to and deleted from (a hundred-odd rows of
# pg_attribute per schema).  This machine's server runs without autovacuum, so their dead
# rows pile up run after run (1.8 million in pg_attribute after a day's runs) and every
# catalog scan reads them: the conftest's own queries on the catalogs took 70 ms instead
# of 1, memorm's create_all 110 ms instead of 75.  A VACUUM of them takes seconds.
_CATALOGS = (
    "pg_class",
    "pg_attribute",
    "pg_attrdef",
    "pg_constraint",
    "pg_depend",
    "pg_shdepend",
    "pg_index",
    "pg_type",
    "pg_namespace",
    "pg_policy",
    "pg_trigger",
    "pg_rewrite",
    "pg_statistic",
    "pg_description",
    "pg_init_privs",
)


def _vacuum_catalogs() -> None:
    """VACUUM the catalogs of the test database (if it is reachable and the role may: else nothing)."""

    async def vacuum() -> None:
        connection = await asyncpg.connect(asyncpg_dsn(), timeout=5)
        try:
            # A VACUUM ends by updating the database's own pg_database row in place (its
            # frozen xid), and a `GRANT CONNECT ON DATABASE` at that moment (`create_role`,
            # in another run on this server) fails with "tuple concurrently updated": hold
            # the lock `create_role` takes for its grants.
            await connection.execute("SELECT pg_advisory_lock($1)", ROLE_LOCK)
            await connection.execute("VACUUM " + ", ".join(f"pg_catalog.{name}" for name in _CATALOGS))
        finally:
            await connection.close()  # and with it the advisory lock

    with contextlib.suppress(Exception):  # no server (the Postgres tests then say so) or no right
        asyncio.run(vacuum())


def pytest_itemcollected(item: pytest.Item) -> None:
    """Mark property-based tests ``property``: ``.ci/run`` runs them again with 200 examples each."""
    if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
        item.add_marker(pytest.mark.property)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under the application role, leave out the Postgres tests that need the tables' owner;
    on Citus, every test but the Postgres ones on a ``db``."""
    left_out = [item for item in items if _left_out(item)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if not _left_out(item)]


@asynccontextmanager
async def app_role(store: Store) -> AsyncIterator[tuple[Database, Database, str]]:
    """`(owner, app, role)` on a Postgres store: row-level security really runs for `app`.

    `owner` connects as the test superuser (which bypasses row-level security)
    and migrates the schema; `app` connects as `role`, a new application role
    made by `memorm.tenants.create_role`.  Afterwards both are disposed, and
    the schema and the role dropped.
    """

    owner = store.database()
    await owner.upgrade()
    role = f"memorm_app_{uuid.uuid4().hex[:10]}"
    await create_app_role(owner, role)
    url = make_url(store.url).set(username=role).render_as_string(hide_password=False)
    if PGBOUNCER:
        pgbouncer_user(role, listed=True)
        await pgbouncer_admits(url)
    app = Database(url, **store.options)
    try:
        yield owner, app, role
    finally:
        await app.dispose()
        await owner.dispose()
        await _drop_role(store, role)


async def _drop_role(store: Store, role: str) -> None:
    """Drop the store's schema (its database under MEMORM_TEST_PGBOUNCER=1) and a role made for it."""
    admin = await asyncpg.connect(asyncpg_dsn())
    try:
        if store.own_database is not None:  # the role's grants go with it
            await admin.execute(f'DROP DATABASE IF EXISTS "{store.own_database}" WITH (FORCE)')
        else:
            await admin.execute(f'DROP SCHEMA IF EXISTS "{store.schema}" CASCADE')
        await drop_role(admin, role)
    finally:
        await admin.close()
        if PGBOUNCER:
            pgbouncer_user(role, listed=False)


async def drop_role(admin: asyncpg.Connection, role: str) -> None:
    """Drop a role a test made, with what it was granted."""
    for attempt in range(5):
        try:  # the role's grant on the database is a catalog row other test runs may be updating
            async with admin.transaction():
                # Not while `create_role` grants (its GRANT CONNECT would fail, not wait).
                await admin.execute("SELECT pg_advisory_xact_lock($1)", ROLE_LOCK)
                await admin.execute(f'DROP OWNED BY "{role}"; DROP ROLE IF EXISTS "{role}"')
            return
        except asyncpg.InternalServerError as error:
            if "concurrently updated" not in str(error) or attempt == 4:
                raise
            await asyncio.sleep(0.1)


async def create_app_role(database: Database, role: str) -> None:
    """`create_role`, again if a VACUUM elsewhere updated the database's row as it granted CONNECT.

    A VACUUM (a scrub test's, in another run on this server) ends with an in-place update
    of the database's pg_database row, and a GRANT on the database at that moment fails
    ("tuple concurrently updated") instead of waiting; `create_role` changes nothing then.
    """
    for attempt in range(5):
        try:
            await create_role(database, role)
            return
        except DatabaseError as error:
            if "concurrently updated" not in str(error) or attempt == 4:
                raise
            await asyncio.sleep(0.1)


# -- SQLite: each test's file is a copy of one that create_all made ------------------
# create_all costs about 100 ms on SQLite; copying its result, under a millisecond.  One
# template per process (each xdist worker makes its own), removed at exit.

_sqlite_template: list[Path] = []


async def _sqlite_schema(url: str) -> None:
    """Give the new SQLite file at `url` memorm's schema, as ``Database.create_all`` makes it."""
    if not _sqlite_template:
        folder = Path(tempfile.mkdtemp(prefix="memorm-template-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        template = folder / "memorm.db"
        made = Database(f"sqlite+aiosqlite:///{template}")
        try:
            await made.create_all()
        finally:
            await made.dispose()  # the file is whole: WAL checkpointed, no -wal beside it
        _sqlite_template.append(template)
    _copy_new(_sqlite_template[0], make_url(url).database)


def _copy_new(template: Path, path: str | None) -> None:
    """Copy `template` to `path`, which must not exist yet (a test's store is new)."""
    assert path is not None, "a SQLite URL names its file"
    with open(template, "rb") as source, open(path, "xb") as target:
        shutil.copyfileobj(source, target)


@pytest.fixture
async def db(store: Store) -> AsyncIterator[Database]:
    """A ``Database`` with memorm's schema created, on SQLite and on Postgres."""
    if store.engine == "sqlite":
        await _sqlite_schema(store.url)
    database = store.database()
    if store.engine == "postgres" and not store.ready:  # ready: a pooled Citus schema
        await database.create_all()
        if CITUS:
            await database.distribute()
        if store.pooled:
            admin = await asyncpg.connect(asyncpg_dsn())
            try:
                await _remember_shape(admin, str(store.schema))
            finally:
                await admin.close()
    if not (APP_ROLE and store.engine == "postgres"):
        try:
            yield database
        finally:
            await database.dispose()
        return
    role = f"memorm_app_{uuid.uuid4().hex[:10]}"
    await create_app_role(database, role)
    await database.dispose()
    url = make_url(store.url).set(username=role).render_as_string(hide_password=False)
    if PGBOUNCER:
        pgbouncer_user(role, listed=True)
        await pgbouncer_admits(url)
    app = Database(url, **store.options)
    try:
        yield app
    finally:
        await app.dispose()
        await _drop_role(store, role)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# -- MEMORM_REQUIRE_POSTGRES: a skipped Postgres test fails the run -------------

_skipped_postgres: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # An expected failure reports as "skipped" too (with wasxfail); it did run.
    if report.skipped and not hasattr(report, "wasxfail") and "postgres" in report.keywords:
        _skipped_postgres.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _drop_schema_pool()
    _pgbouncer_drop_template(session.config)
    if REQUIRE_POSTGRES and _skipped_postgres:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if REQUIRE_POSTGRES and _skipped_postgres:
        terminalreporter.write_line(
            f"MEMORM_REQUIRE_POSTGRES=1: {len(_skipped_postgres)} Postgres tests skipped "
            f"(first: {_skipped_postgres[0]}); failing the run",
            red=True,
        )


# -- shared helpers -------------------------------------------------------------


async def count_rows(db: Database, table: str, **where: uuid.UUID) -> int:
    """Rows of ``table`` (matching ``column=uuid`` filters), counted with raw SQL in a fresh unit of work."""
    import sqlalchemy as sa

    from memorm.types import UUIDType

    sql = f"SELECT count(*) FROM {table}"
    if where:
        sql += " WHERE " + " AND ".join(f"{column} = :{column}" for column in where)
    statement = sa.text(sql).bindparams(
        *(sa.bindparam(column, value, type_=UUIDType()) for column, value in where.items())
    )
    async with db.unit_of_work(read_only=True) as uow:
        return int((await uow.session.execute(statement)).scalar_one())


# -- plain URLs: for code that takes a URL, not a Database (the CLI, docs, apps) ---


async def admin_execute(sql: str) -> None:
    """Run one statement on the Postgres server as the test user (CREATE/DROP DATABASE…)."""
    connection = await asyncpg.connect(asyncpg_dsn())
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


@contextmanager
def throwaway_postgres(prefix: str = "memorm_t") -> Iterator[str]:
    """The URL of a new, empty Postgres database, dropped afterwards.

    A URL cannot carry a search_path, so code that opens its own Database from
    a URL gets a database of its own instead of a schema.
    """
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    asyncio.run(admin_execute(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        asyncio.run(admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def plain_url(engine: str, tmp_path: Path) -> Iterator[str]:
    """An empty database's URL on each engine: a SQLite file, or a throwaway Postgres database."""
    if engine == "sqlite":
        yield f"sqlite:///{tmp_path / 'plain.db'}"
        return
    with throwaway_postgres() as url:
        yield url
