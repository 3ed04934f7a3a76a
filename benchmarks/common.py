"""What every benchmark module shares: stores, timing, result rows, tables.

A benchmark module is ``benchmarks/<name>.py`` exposing::

    async def run(engines: Sequence[str], *, quick: bool = False) -> list[Row]

It opens its own :func:`store` per engine (a fresh SQLite file, or a fresh
Postgres schema dropped afterwards), times memorm against the raw driver doing
the same work with :func:`timed` / :func:`Samples`, and returns :class:`Row`
objects; ``benchmarks.run`` prints them and writes them as JSON.
"""

from __future__ import annotations

import gc
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy.engine import make_url

from memorm import Database
from memorm.search.normalize import index_words
from memorm.testing import capture_statements
from memorm.types.search_words import encode_tsvector, register_tsvector

__all__ = [
    "ENGINES",
    "POSTGRES_URL",
    "Row",
    "Samples",
    "Store",
    "alternate",
    "asyncpg_dsn",
    "format_seconds",
    "like_memorm",
    "postgres_unavailable",
    "postgres_words",
    "print_goals",
    "print_table",
    "sqlite_words",
    "statements_sent",
    "store",
    "timed",
]

ENGINES = ("sqlite", "postgres")
POSTGRES_URL = os.environ.get("MEMORM_BENCH_POSTGRES_URL", "postgresql+asyncpg://root@127.0.0.1:5432/test")


def asyncpg_dsn(url: str = POSTGRES_URL) -> str:
    """The plain libpq-style DSN asyncpg takes for a SQLAlchemy URL."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def postgres_unavailable() -> str | None:
    """Why the benchmark Postgres cannot be used (None when it can).

    Installs pgvector in ``public`` once: every benchmark schema shares it, and
    dropping a schema must never drop the extension.
    """
    try:
        connection = await asyncpg.connect(asyncpg_dsn(), timeout=5)
    except Exception as error:
        return f"Postgres at {make_url(POSTGRES_URL)!r} unreachable: {error}"
    try:
        await connection.execute("CREATE EXTENSION IF NOT EXISTS vector SCHEMA public")
        await connection.execute("CREATE EXTENSION IF NOT EXISTS btree_gin SCHEMA public")
    except Exception as error:
        return f"Postgres at {make_url(POSTGRES_URL)!r} has no usable pgvector: {error}"
    finally:
        await connection.close()
    return None


# -- stores ---------------------------------------------------------------------------------------


@dataclass
class Store:
    """Where one benchmark's data lives: a SQLite file or a Postgres schema."""

    engine: str
    url: str
    options: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None  # SQLite file
    schema: str | None = None  # Postgres schema

    def database(self, **engine_options: Any) -> Database:
        """A memorm ``Database`` on this store."""
        return Database(self.url, **{**self.options, **engine_options})

    async def raw_sqlite(self) -> Any:
        """An aiosqlite connection set up the way memorm sets up its own.

        Same pragmas (WAL, ``synchronous=NORMAL``, foreign keys, busy timeout) and
        autocommit mode, so transactions begin only on an explicit ``BEGIN``.
        """
        import aiosqlite

        from memorm.connections import SQLITE_BUSY_TIMEOUT_MS

        assert self.path is not None
        connection = await aiosqlite.connect(self.path, isolation_level=None)
        await connection.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        await connection.execute("PRAGMA journal_mode = WAL")
        await connection.execute("PRAGMA synchronous = NORMAL")
        await connection.execute("PRAGMA foreign_keys = ON")
        return connection

    async def raw_postgres(self) -> asyncpg.Connection:
        """A plain asyncpg connection with this store's schema on its search path.

        It has memorm's binary ``tsvector`` codec: raw baselines write the search
        words as memorm does (COPY has no text path for them).
        """
        connection = await asyncpg.connect(asyncpg_dsn(), server_settings=self._raw_settings())
        await register_tsvector(connection)
        return connection

    async def raw_postgres_pool(self, size: int) -> asyncpg.Pool:
        """An asyncpg pool of ``size`` connections, each set up as :meth:`raw_postgres` sets up one.

        A released connection is not reset (asyncpg's default sends ``RESET ALL``
        and more on every release): memorm's pool skips that round trip too,
        its unit of work always ending its own transaction.
        """

        async def keep(connection: asyncpg.Connection) -> None:
            pass

        return await asyncpg.create_pool(
            asyncpg_dsn(),
            min_size=size,
            max_size=size,
            server_settings=self._raw_settings(),
            init=register_tsvector,
            reset=keep,
        )

    def _raw_settings(self) -> dict[str, str]:
        assert self.schema is not None
        # memorm.tenant: rows a raw INSERT writes without a tenant land in memorm's default
        # tenant (the column's server default reads the setting), as memorm's own do.
        return {"search_path": f"{self.schema},public", "memorm.tenant": "default"}


async def like_memorm(connection: Any) -> None:
    """Give another library's aiosqlite connection memorm's journal settings (WAL, `synchronous=NORMAL`).

    SQLite's defaults (a rollback journal, `synchronous=FULL`) sync the file
    on every commit; memorm's settings do not.  A baseline compared with
    memorm gets the same, or the comparison times fsync.
    """
    await connection.execute("PRAGMA journal_mode = WAL")
    await connection.execute("PRAGMA synchronous = NORMAL")


def sqlite_words(text: str) -> str:
    """The ``search_words`` memorm stores for ``text`` on SQLite: what a raw baseline writes too."""
    return b" ".join(index_words(text)).decode()


def postgres_words(text: str) -> bytes:
    """The ``search_words`` memorm stores for ``text`` on Postgres: a binary ``tsvector``."""
    return encode_tsvector(index_words(text))


@asynccontextmanager
async def store(engine: str) -> AsyncIterator[Store]:
    """A fresh, empty store: a SQLite file in a temp dir, or a new Postgres schema."""
    if engine == "sqlite":
        with tempfile.TemporaryDirectory(prefix="memorm-bench-") as tmp:
            path = Path(tmp) / "bench.db"
            yield Store(engine, f"sqlite+aiosqlite:///{path}", path=path)
        return
    if engine != "postgres":
        raise ValueError(f"unknown engine {engine!r}")
    schema = f"bench_{uuid.uuid4().hex[:16]}"
    admin = await asyncpg.connect(asyncpg_dsn())
    try:
        await admin.execute("CREATE EXTENSION IF NOT EXISTS vector SCHEMA public")
        await admin.execute("CREATE EXTENSION IF NOT EXISTS btree_gin SCHEMA public")
        await admin.execute(f'CREATE SCHEMA "{schema}"')
        yield Store(
            engine,
            POSTGRES_URL,
            {"connect_args": {"server_settings": {"search_path": f"{schema},public"}}},
            schema=schema,
        )
    finally:
        await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await admin.close()


@contextmanager
def statements_sent(db: Database, containing: str) -> Iterator[list[tuple[str, Any]]]:
    """The statements (SQL, parameters) ``db`` sends inside the block whose SQL contains ``containing``.

    For EXPLAINing what memorm sent, or counting statements
    (`memorm.testing.capture_statements`: the driver's and SQLAlchemy's).  Example::

        with statements_sent(db, "<=>") as sent:
            await search(db, ...)
        (statement, parameters), = sent
    """
    with capture_statements(db, containing) as sent:
        yield sent


# -- timing ---------------------------------------------------------------------------------------


@dataclass
class Samples:
    """Wall-clock seconds of repeated runs of one operation."""

    seconds: list[float] = field(default_factory=list)

    def add(self, seconds: float) -> None:
        self.seconds.append(seconds)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def summary(self) -> dict[str, float | int]:
        ordered = sorted(self.seconds)
        return {
            "n": len(ordered),
            "median": statistics.median(ordered),
            "min": ordered[0],
            "p90": ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))],
            "mean": statistics.fmean(ordered),
        }


async def timed(fn: Callable[[], Awaitable[Any]], samples: Samples, *, collect: bool = False) -> Any:
    """Await ``fn()`` once, adding its wall time to ``samples``; returns its result.

    ``collect=True`` runs a full garbage collection first (outside the timing),
    so that large benchmarks do not pay for the previous repetition's garbage.
    """
    if collect:
        gc.collect()
    start = time.perf_counter()
    result = await fn()
    samples.add(time.perf_counter() - start)
    return result


async def alternate(
    operations: tuple[Callable[[], Awaitable[Any]], Callable[[], Awaitable[Any]]], reps: int
) -> tuple[Samples, Samples]:
    """Time two operations `reps` times each, alternating (which goes first too); their samples."""
    first, second = Samples(), Samples()
    for turn in range(reps):
        pairs = ((operations[0], first), (operations[1], second))[:: 1 if turn % 2 else -1]
        for operation, samples in pairs:
            await timed(operation, samples)
    return first, second


# -- results --------------------------------------------------------------------------------------


@dataclass
class Row:
    """One line of a results table: memorm against the raw driver for one operation.

    ``rows`` is how many rows one timed run handles (for rows/s); ``target`` the
    largest acceptable memorm/raw ratio; rows without a raw baseline (checks such
    as "flat latency") put their verdict in ``status`` and ``note``.  ``goal``
    names the goal the row measures, as the issue that set it words it; rows
    sharing a goal meet it together (:func:`print_goals`).
    """

    module: str
    engine: str
    operation: str
    memorm: Samples | None = None
    raw: Samples | None = None
    rows: int | None = None
    target: float | None = None
    note: str = ""
    status: str | None = None
    goal: str = ""

    @property
    def ratio(self) -> float | None:
        if self.memorm is None or self.raw is None:
            return None
        return self.memorm.median / self.raw.median

    @property
    def verdict(self) -> str:
        if self.status is not None:
            return self.status
        ratio = self.ratio
        if ratio is None or self.target is None:
            return ""
        return "PASS" if ratio <= self.target else "MISS"

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["memorm"] = None if self.memorm is None else self.memorm.summary()
        data["raw"] = None if self.raw is None else self.raw.summary()
        data["ratio"] = self.ratio
        data["status"] = self.verdict
        for side in ("memorm", "raw"):
            samples = getattr(self, side)
            if samples is not None and self.rows:
                data[f"{side}_rows_per_s"] = self.rows / samples.median
        return data


def format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.0f} µs"


def _rate(rows: int | None, samples: Samples | None) -> str:
    if not rows or samples is None:
        return "-"
    return f"{rows / samples.median:,.0f}"


def print_table(title: str, rows: Sequence[Row]) -> None:
    """Print ``rows`` as an aligned text table under ``title``."""
    header = ("operation", "memorm", "raw", "ratio", "target", "status", "memorm rows/s", "raw rows/s")
    lines = [
        (
            row.operation,
            format_seconds(row.memorm.median if row.memorm else None),
            format_seconds(row.raw.median if row.raw else None),
            "-" if row.ratio is None else f"{row.ratio:.2f}x",
            "-" if row.target is None else f"<= {row.target:g}x",
            row.verdict or "-",
            _rate(row.rows, row.memorm),
            _rate(row.rows, row.raw),
        )
        for row in rows
    ]
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *lines, strict=True)]
    left = {0, 5}  # text columns; numbers align right

    def render(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.ljust(width) if index in left else cell.rjust(width)
            for index, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    print(f"\n{title}")
    print(render(header))
    print(render(["-" * width for width in widths]))
    for line in lines:
        print(render(line))
    for row in rows:
        if row.note:
            print(f"  * {row.operation}: {row.note}")


def print_goals(rows: Sequence[Row]) -> None:
    """Print each goal of ``rows`` as met or missed per engine, with its worst ratio.

    A goal is met on an engine when every row measuring it there passed.
    """
    goals = list(dict.fromkeys(row.goal for row in rows if row.goal))
    if not goals:
        return
    engines = list(dict.fromkeys(row.engine for row in rows if row.goal))
    cells = []
    for goal in goals:
        line = [goal]
        for engine in engines:
            judged = [row for row in rows if row.goal == goal and row.engine == engine and row.verdict]
            if not judged:
                line.append("-")
                continue
            met = all(row.verdict == "PASS" for row in judged)
            ratios = [row.ratio for row in judged if row.ratio is not None]
            worst = f" ({max(ratios):.2f}x)" if ratios else ""
            line.append(("met" if met else "MISSED") + worst)
        cells.append(line)
    header = ["goal", *engines]
    widths = [max(len(line[index]) for line in [header, *cells]) for index in range(len(header))]
    print("\n== goals (worst ratio of each goal's rows) ==")
    for line in [header, ["-" * width for width in widths], *cells]:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())
