"""Stored graph state names no code memorm runs: the check (`memorm.graph_values`) and `StrictSerializer`.

A LangGraph value is msgpack whose extensions name a module, a callable and
its arguments; LangGraph's default reader calls them.  Here crafted values
name `os.mkdir` (of a directory under ``tmp_path``) in each way LangGraph's
reader would call it: the check refuses each, and the directory is never
made.  What LangGraph's graphs really store passes and loads as LangGraph
loads it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import decimal
import enum
import json
import uuid
from pathlib import Path
from typing import Any

import ormsgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage, ToolMessage
from langgraph.checkpoint.serde._msgpack import SAFE_MSGPACK_METHODS, SAFE_MSGPACK_TYPES
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.types import Command, Interrupt, Send
from pydantic import BaseModel

from memorm import graph_values
from memorm.compat.langgraph import StrictSerializer
from memorm.errors import UnsafeValueError, ValidationError
from memorm.graph_values import SAFE_METHODS, SAFE_TYPES, allowed_types, check_value
from memorm.msgpack_read import MalformedError, read


def ext(code: int, *fields: Any) -> ormsgpack.Ext:
    return ormsgpack.Ext(code, ormsgpack.packb(fields))


def packed(value: Any) -> bytes:
    return ormsgpack.packb(value)


def crafted(path: Path) -> dict[str, tuple[str, bytes]]:
    """Values that make LangGraph's reader call os.mkdir(path), each its own way."""
    where = str(path)
    mkdir = ext(0, "os", "mkdir", where)
    return {
        "one argument": ("msgpack", packed(mkdir)),
        "arguments": ("msgpack", packed(ext(1, "os", "mkdir", [where]))),
        "keywords": ("msgpack", packed(ext(2, "os", "mkdir", {"path": where}))),
        "pydantic v1": ("msgpack", packed(ext(4, "os", "mkdir", {"path": where}))),
        "pydantic v2": ("msgpack", packed(ext(5, "os", "mkdir", {"path": where}, "model_validate_json"))),
        "a method": ("msgpack", packed(ext(3, "os", "mkdir", where, "__call__"))),
        "in a list": ("msgpack", packed({"messages": [1, [mkdir]]})),
        "in a nested map": ("msgpack", packed({"a": {"b": mkdir}})),
        "in a Send's argument": ("msgpack", packed(ext(1, "langgraph.types", "Send", ["node", mkdir]))),
        "in a delta snapshot": ("msgpack", packed(ormsgpack.Ext(7, packed(mkdir)))),
        "in a numpy array's payload": ("msgpack", packed(ext(6, "<f8", [1], "C", mkdir))),
        "in old json": (
            "json",
            json.dumps({"lc": 2, "type": "constructor", "id": ["os", "mkdir"], "args": [where]}).encode(),
        ),
    }


CASES = list(crafted(Path("x")))
# The values LangGraph's permissive reader (its default) really calls: the threat, shown.
CALLED_BY_LANGGRAPH = set(CASES) - {"a method", "in old json"}


@pytest.fixture(params=["ormsgpack", "memorm"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The check reads with LangGraph's ormsgpack, or without it (memorm installed without LangGraph)."""
    if request.param == "memorm":
        monkeypatch.setattr(graph_values, "_ormsgpack", None)
    return str(request.param)


@pytest.mark.parametrize("case", CASES)
def test_a_value_naming_a_callable_not_allowed_is_refused_and_never_called(
    tmp_path: Path, case: str, reader: str
) -> None:
    target = tmp_path / "made"
    kind, data = crafted(target)[case]
    with pytest.raises(UnsafeValueError, match=r"os\.mkdir"):
        check_value(kind, data)
    with pytest.raises(UnsafeValueError, match=r"it names os\.mkdir.*allowed_types="):
        StrictSerializer().loads_typed((kind, data))
    assert not target.exists()
    if case in CALLED_BY_LANGGRAPH:
        control = tmp_path / "control"
        JsonPlusSerializer(allowed_msgpack_modules=True).loads_typed(crafted(control)[case])
        assert control.is_dir()  # the same bytes, read by LangGraph's default reader


def test_a_pickle_and_langchains_other_objects_are_refused() -> None:
    with pytest.raises(UnsafeValueError, match="pickle"):
        check_value("pickle", b"\x80\x04N.")
    with pytest.raises(UnsafeValueError, match="pickle"):
        check_value("pickle+aes", b"ciphertext")
    secret = {"lc": 1, "type": "secret", "id": ["OPENAI_API_KEY"]}
    with pytest.raises(UnsafeValueError, match="secret"):
        check_value("json", json.dumps({"value": secret}).encode())
    model = {"lc": 1, "type": "constructor", "id": ["langchain", "llms", "openai", "OpenAI"], "kwargs": {}}
    with pytest.raises(UnsafeValueError, match="OpenAI"):
        check_value("json", json.dumps(model).encode())
    message = {"lc": 1, "type": "constructor", "id": ["langchain", "schema", "messages", "HumanMessage"]}
    old = json.dumps({**message, "kwargs": {"content": "hi"}}).encode()
    check_value("json", old)
    assert StrictSerializer().loads_typed(("json", old)) == HumanMessage("hi")


def test_values_that_name_nothing_pass_and_bad_bytes_are_a_validation_error(reader: str) -> None:
    for kind, data in (
        ("null", b""),
        ("bytes", b"\x00"),
        ("empty", None),
        ("msgpack+aes", b"?"),
        ("mine", b""),
    ):
        check_value(kind, data)
    with pytest.raises(ValidationError, match="not the msgpack its type says"):
        check_value("msgpack", packed([1, 2])[:-1])
    with pytest.raises(ValidationError, match="not the JSON"):
        check_value("json", b"{")
    with pytest.raises(ValidationError, match="would not write"):
        check_value("msgpack", packed(ormsgpack.Ext(0, packed("os.mkdir"))))
    with pytest.raises(UnsafeValueError, match="type 42"):
        check_value("msgpack", packed(ormsgpack.Ext(42, packed(1))))
    deep = b"\x91" * 2000 + b"\xc0"
    with pytest.raises(ValidationError, match="not the msgpack its type says"):
        check_value("msgpack", deep)


def test_memorms_list_is_langgraphs_strict_list() -> None:
    assert SAFE_TYPES == SAFE_MSGPACK_TYPES
    assert SAFE_METHODS == SAFE_MSGPACK_METHODS


class Profile(BaseModel):
    name: str
    since: datetime.date


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Mood(enum.Enum):
    HAPPY = "happy"


def test_allowed_types_admit_a_graphs_own_types_in_each_form() -> None:
    values = [Profile(name="ann", since=datetime.date(2020, 1, 2)), Point(1, 2), Mood.HAPPY]
    for value in values:
        kind, data = StrictSerializer().dumps_typed(value)
        with pytest.raises(UnsafeValueError, match=type(value).__name__):
            StrictSerializer().loads_typed((kind, data))
        for allowed in (
            type(value),
            (type(value).__module__, type(value).__name__),
            f"{__name__}.{type(value).__name__}",
        ):
            assert StrictSerializer(allowed_types=[allowed]).loads_typed((kind, data)) == value
    # LangGraph's hook (graph.compile() under LANGGRAPH_STRICT_MSGPACK) adds to the list.
    serde = StrictSerializer()
    grown = serde.with_msgpack_allowlist([(Point.__module__, "Point")])
    assert isinstance(grown, StrictSerializer)
    assert grown.loads_typed(serde.dumps_typed(Point(3, 4))) == Point(3, 4)
    assert serde.with_msgpack_allowlist([("uuid", "UUID")]) is serde  # nothing new
    for bad in ("Point", ("a",), ("a", ""), 5, "a.b\x00"):
        with pytest.raises(ValidationError, match=r"allowed_types\[0\]: expected a class"):
            allowed_types([bad])  # type: ignore[list-item]
    with pytest.raises(ValidationError, match="expected a list"):
        allowed_types("mod.Name")


# -- what LangGraph's graphs store passes, and loads as LangGraph loads it -------------------

_plain = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)
_safe = st.sampled_from(
    [
        HumanMessage("hi", id="1"),
        AIMessage("yo", tool_calls=[{"name": "f", "args": {"a": 1}, "id": "c"}]),
        ToolMessage("done", tool_call_id="c"),
        RemoveMessage(id="1"),
        Send("node", {"k": [1]}),
        Command(resume="yes", goto=[Send("n", 1)]),
        Interrupt(value={"q": 1}, id="i"),
        datetime.datetime(2024, 5, 6, 7, 8, tzinfo=datetime.timezone(datetime.timedelta(hours=2))),
        datetime.date(2024, 1, 1),
        datetime.timedelta(seconds=5),
        uuid.UUID(int=7),
        decimal.Decimal("1.25"),
        {1, 2},
        frozenset({"a"}),
        Path("/tmp/a"),
    ]
)
_state = st.recursive(
    _plain | _safe,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=60, deadline=None)
@given(value=_state)
def test_what_langgraphs_graphs_store_loads_as_langgraph_loads_it(value: Any) -> None:
    langgraph = JsonPlusSerializer()
    stored = langgraph.dumps_typed(value)
    assert StrictSerializer().loads_typed(stored) == langgraph.loads_typed(stored)


@settings(max_examples=100, deadline=None)
@given(value=_plain)
def test_the_reader_reads_what_ormsgpack_writes(value: Any) -> None:
    def pairs(found: Any) -> Any:  # ormsgpack's dicts, as the reader gives maps: lists of pairs
        if isinstance(found, dict):
            return [(key, pairs(item)) for key, item in found.items()]
        if isinstance(found, list):
            return [pairs(item) for item in found]
        return found

    assert read(ormsgpack.packb(value)) == pairs(ormsgpack.unpackb(ormsgpack.packb(value)))


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=64))
def test_any_bytes_pass_or_raise_a_memorm_error(data: bytes) -> None:
    for kind in ("msgpack", "json"):
        with contextlib.suppress(ValidationError):
            check_value(kind, data)
    with contextlib.suppress(MalformedError):
        read(data)
    with pytest.MonkeyPatch.context() as patch:  # and without LangGraph's reader
        patch.setattr(graph_values, "_ormsgpack", None)
        with contextlib.suppress(ValidationError):
            check_value("msgpack", data)
