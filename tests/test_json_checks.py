"""JSON checks: the fast path (`_plain_json`) agrees with the full walk (`_check_json`).

`check_json` first tries a walk that builds no field names; only when it
says no does the full walk run, to name what is wrong.  The fast path must
never accept what the full walk refuses, and should accept every plain
value the full walk accepts (else the common case is slow, not wrong).
"""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from memorm.errors import ValidationError
from memorm.validation import INT64_MAX, MAX_JSON_DEPTH, _check_json, _plain_json

SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=st.characters(codec=None, blacklist_categories=()), max_size=5),  # NUL, surrogates too
    st.sampled_from([object(), b"bytes", {1, 2}, 1j]),
)
KEY = st.one_of(st.text(max_size=3), st.integers(0, 2), st.just("a\x00"), st.just("\ud800"))
VALUE = st.recursive(
    SCALAR,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(KEY, inner, max_size=3),
    ),
    max_leaves=12,
)


def full_walk_accepts(value: object) -> bool:
    try:
        _check_json(value, "meta", 0)
    except ValidationError:
        return False
    return True


@given(value=VALUE)
def test_fast_path_accepts_exactly_what_the_full_walk_accepts(value: object) -> None:
    assert _plain_json(value, 0) == full_walk_accepts(value)


def test_depth_limit_is_the_same_on_both_paths() -> None:
    for depth in (MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1):
        for leaf in ({}, [], 1):
            value: object = leaf
            for _ in range(depth):
                value = {"a": value}
            assert _plain_json(value, 0) == full_walk_accepts(value), (depth, leaf)


def test_edges() -> None:
    for value in (INT64_MAX, INT64_MAX + 1, math.inf, "ok", "\x00", {"k": [1, 2.5, None, True]}):
        assert _plain_json(value, 0) == full_walk_accepts(value), value
