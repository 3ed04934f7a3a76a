"""Developer sessions: ``nox -s tests lint migrations bench demo docs``.

Dependencies come from ``[dependency-groups]`` in pyproject.toml.  The Postgres
URL comes from ``MEMORM_TEST_POSTGRES_URL`` (default: the local server's
``test`` database), as in the test suite.
"""

from __future__ import annotations

import os

import nox

nox.options.sessions = ["tests", "lint", "migrations"]
nox.options.reuse_existing_virtualenvs = True

POSTGRES_URL = os.environ.get("MEMORM_TEST_POSTGRES_URL", "postgresql+asyncpg://root@127.0.0.1:5432/test")


def install(session: nox.Session, *groups: str) -> None:
    session.install("-U", "pip")
    session.install("-e", ".", *(f"--group={group}" for group in groups))


@nox.session
@nox.parametrize("engine", ["sqlite", "postgres"])
def tests(session: nox.Session, engine: str) -> None:
    """The test suite on one engine (``nox -s tests`` runs both; engine-free tests run with sqlite)."""
    install(session, "test")
    selected = "postgres" if engine == "postgres" else "not postgres"
    session.run("pytest", "-m", f"{selected} and not long", *session.posargs)


@nox.session
def reliability(session: nox.Session) -> None:
    """The load, fault and hostile-input suite, both engines."""
    install(session, "test")
    session.run("pytest", "tests/reliability", "-m", "reliability", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint and format) and mypy --strict on memorm/."""
    install(session, "lint", "test")  # mypy needs the frameworks the adapters import
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy", "--strict", "memorm")


@nox.session
def migrations(session: nox.Session) -> None:
    """alembic upgrade / check / downgrade / upgrade on both engines, from the command line."""
    install(session)
    session.run("python", "-m", "tests.tools.migration_roundtrip", POSTGRES_URL)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks against the raw drivers, both engines (``-- --engine sqlite`` for one)."""
    install(session, "test")  # LangGraph and its Postgres saver: the langgraph baselines
    session.run("python", "-m", "benchmarks.run", *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """The README's demo on the embedded SQLite default."""
    install(session)
    session.run("memorm", "demo", *session.posargs)


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation site, built strictly (warnings fail) into site/."""
    install(session, "docs")
    # Material for MkDocs prints a large end-of-life banner on every build unless this is set.
    env = {"NO_MKDOCS_2_WARNING": "1"}
    session.run("mkdocs", "build", "--strict", "--site-dir", "site", *session.posargs, env=env)
