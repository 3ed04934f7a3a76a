"""Bulk rows are converted column by column (`memorm.driver._convert`): exactly as value by value.

Rows are tuples in column order or dicts holding the columns; a single row
takes its own path (value by value), checked by the same property.

The column-wise path converts a column of one repeated value once; equal
values that would not convert alike (`{"a": 1} == {"a": True}`) must not be
taken for one value.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.dialects.postgresql import asyncpg
from sqlalchemy.dialects.sqlite import aiosqlite

from memorm.driver import _convert, _processors, _with_derived
from memorm.models import MESSAGES

COLUMNS = ("tenant", "id", "created_at", "meta", "role", "content", "tool_calls", "token_count")
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
SHARED = {"id": uuid.UUID(int=7), "created_at": NOW, "meta": {"a": 1}}

JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(-2, 2), st.text(max_size=3))
META = st.dictionaries(st.sampled_from("ab"), JSON_LEAF, max_size=2)
VALUE = {
    "tenant": st.sampled_from(["default", "t2"]),
    "id": st.one_of(st.just(SHARED["id"]), st.builds(uuid.uuid4)),
    "created_at": st.one_of(st.just(NOW), st.integers(0, 3).map(lambda hours: NOW + timedelta(hours=hours))),
    "meta": st.one_of(st.just(SHARED["meta"]), META),
    "role": st.sampled_from(["user", "assistant"]),
    "content": st.one_of(st.none(), st.text(max_size=8)),
    "tool_calls": st.one_of(st.none(), st.lists(META, max_size=2)),
    "token_count": st.integers(0, 100),
}
ROW = st.tuples(*(VALUE[name] for name in COLUMNS))


def one_by_one(
    processors: Any, rows: list[tuple[Any, ...]], sources: tuple[int, ...]
) -> list[tuple[Any, ...]]:
    converted = []
    for row in rows:
        values = list(row) + ["" if row[at] is None else row[at] for at in sources]
        converted.append(
            tuple(v if p is None or v is None else p(v) for p, v in zip(processors, values, strict=True))
        )
    return converted


@given(rows=st.lists(ROW, min_size=1, max_size=8))
def test_column_wise_conversion_equals_value_by_value(rows: list[tuple[Any, ...]]) -> None:
    for dialect in (aiosqlite.dialect(), asyncpg.dialect()):
        names, sources = _with_derived(MESSAGES, COLUMNS)
        processors = _processors(dialect, MESSAGES, names)
        expected = one_by_one(processors, rows, sources)
        assert _convert(processors, rows, sources) == expected
        # A repository's checked rows, handed over as dicts holding the columns (and more).
        keyed = [{**dict(zip(COLUMNS, row, strict=True)), "other": object()} for row in rows]
        assert _convert(processors, keyed, sources, COLUMNS) == expected


def test_equal_json_that_serialises_differently_is_converted_per_row() -> None:
    dialect = aiosqlite.dialect()
    names, sources = _with_derived(MESSAGES, ("meta",))
    processors = _processors(dialect, MESSAGES, names)
    rows = [({"a": 1},), ({"a": True},), ({"a": 1.0},)]
    assert [row[0] for row in _convert(processors, rows, sources)] == [
        '{"a": 1}',
        '{"a": true}',
        '{"a": 1.0}',
    ]
