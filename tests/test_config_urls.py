"""A database URL is checked when it is read: a Postgres parameter asyncpg cannot take is a ValidationError.

asyncpg's `connect` takes a URL's parameters as keyword arguments, as text:
`?options=…` (libpq's) raised a raw `TypeError` at the first connection
(`db.upgrade()`, `memorm db upgrade`), `?timeout=10` a `TypeError` for the
text where it wants a number.
"""

from __future__ import annotations

import pytest
from cli_run import memorm
from conftest import POSTGRES_URL, REQUIRE_POSTGRES, postgres_unavailable
from sqlalchemy.engine import make_url

from memorm import Database, ValidationError
from memorm.config import POSTGRES_URL_PARAMETERS, resolve_url

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ("options=-c%20statement_timeout%3D5000", "server_settings"),
        ("sslmode=require", r"\?ssl=require"),
        ("application_name=app", "connect_args"),
        ("timeout=10", "connect_args"),
        ("ssl=maybe", "expected one of disable"),
        ("port=x", "whole number"),
        ("prepared_statement_cache_size=-1", "whole number"),
        ("ssl=require&ssl=disable", "give it once"),
    ],
)
def test_a_postgres_url_parameter_asyncpg_cannot_take_is_refused_when_the_url_is_read(
    query: str, words: str
) -> None:
    with pytest.raises(ValidationError, match=words):
        Database(f"postgresql://me@db.internal/memorm?{query}")


def test_the_parameters_asyncpg_takes_as_text_pass() -> None:
    url = resolve_url(
        "postgresql://me@db.internal/memorm?ssl=require&target_session_attrs=read-write"
        "&prepared_statement_cache_size=0&host=a:5432&host=b:5433"
    )
    assert set(url.query) <= set(POSTGRES_URL_PARAMETERS)


def test_memorm_says_a_bad_url_parameter_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    bad = "postgresql://me@db.internal/memorm?options=-c%20statement_timeout%3D5000"
    code, _, err = memorm(capsys, "db", "upgrade", "--url", bad)
    assert code == 1
    assert err.startswith("memorm: error: the URL's 'options' parameter is not one memorm's driver takes")
    assert err.count("\n") == 1


@pytest.mark.postgres
async def test_a_url_with_parameters_asyncpg_takes_reaches_postgres() -> None:
    reason = postgres_unavailable()
    if reason is not None:
        if REQUIRE_POSTGRES:
            pytest.fail(reason)
        pytest.skip(reason)
    url = make_url(POSTGRES_URL).update_query_dict({"ssl": "disable", "target_session_attrs": "any"})
    async with Database(url) as db, db.engine.connect() as connection:
        assert await connection.exec_driver_sql("SELECT 1") is not None
