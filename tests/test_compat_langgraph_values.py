"""Graph state naming a callable not allowed is refused, never called: by MemormSaver and ``memorm import``.

Each test stores (or imports) a value whose msgpack names ``os.mkdir`` of a
directory under ``tmp_path``, the way LangGraph's serializer names the types
it builds; LangGraph's default reader would make the directory.  memorm must
refuse the value, say where it is and what it names, and the directory must
never appear.  A graph's own types load once allowed.  On both engines (and
under the application role with ``MEMORM_TEST_POSTGRES_ROLE=app``: the import
is of one tenant).
"""

from __future__ import annotations

import asyncio
import base64
import json
import operator
import re
import uuid
from pathlib import Path
from typing import Annotated, Any

import ormsgpack
import pytest
import sqlalchemy as sa
from cli_run import usage_error
from langgraph._internal import _serde
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from pydantic import BaseModel
from typing_extensions import TypedDict

from memorm import Database, ValidationError
from memorm.cli import main
from memorm.compat.langgraph import MemormSaver, StrictSerializer
from memorm.errors import UnsafeValueError
from memorm.models import GraphBlob, GraphCheckpoint, GraphWrite
from memorm.transfer import export_jsonl, import_jsonl

pytestmark = pytest.mark.anyio

THREAD = {"configurable": {"thread_id": "t"}}
GRAPH_TABLES = {"graph_checkpoints": GraphCheckpoint, "graph_writes": GraphWrite, "graph_blobs": GraphBlob}


class Note(BaseModel):
    """A type of the graph's own, in its state."""

    text: str


class State(TypedDict):
    notes: Annotated[list[Note], operator.add]
    count: int


def _note(state: State) -> dict[str, Any]:
    return {"notes": [Note(text=f"n{state['count']}")], "count": state["count"] + 1}


def _ask(state: State) -> dict[str, Any]:
    return {"notes": [Note(text=f"asked:{interrupt('ok?')}")]}


def graph() -> StateGraph[State]:
    """START -> note -> ask (waits for a human: pending writes) -> END."""
    builder = StateGraph(State)
    builder.add_node("note", _note)
    builder.add_node("ask", _ask)
    builder.add_edge(START, "note")
    builder.add_edge("note", "ask")
    builder.add_edge("ask", END)
    return builder


def mkdir(path: Path) -> bytes:
    """A value LangGraph's default reader loads by calling os.mkdir(path)."""
    return ormsgpack.packb(ormsgpack.Ext(0, ormsgpack.packb(("os", "mkdir", str(path)))))


async def _paused(db: Database, name: str = "graph") -> uuid.UUID:
    """An agent whose thread "t" waits at the interrupt (so it has pending writes)."""
    async with db.unit_of_work() as uow:
        agent = (await uow.agents.create(name)).id
    saver = MemormSaver(db, agent=agent, allowed_types=[Note])
    paused = await graph().compile(checkpointer=saver).ainvoke({"notes": [], "count": 1}, THREAD)
    assert paused["__interrupt__"][0].value == "ok?"
    return agent


_WHERE = {
    "graph_checkpoints": r"checkpoint '[^']+' of thread 't'",
    "graph_writes": r"a write to '[^']+' of checkpoint '[^']+' of thread 't'",
    "graph_blobs": r"channel 'count' of checkpoint '[^']+' of thread 't'",
}


@pytest.mark.parametrize("table", list(GRAPH_TABLES))
async def test_a_saver_refuses_a_stored_value_naming_a_callable_and_never_calls_it(
    db: Database, tmp_path: Path, table: str
) -> None:
    agent = await _paused(db)
    target = tmp_path / "made"
    model = GRAPH_TABLES[table]
    async with db.unit_of_work() as uow:  # what anyone who can write the table can do
        update = sa.update(model).values(value_type="msgpack", value=mkdir(target))
        if model is GraphBlob:
            update = update.where(GraphBlob.channel == "count")
        assert (await uow.session.execute(update)).rowcount > 0
    saver = MemormSaver(db, agent=agent, allowed_types=[Note])
    refused = (
        rf"^{_WHERE[table]}: it names os\.mkdir, neither a type LangGraph's graphs store nor one allowed"
    )
    with pytest.raises(UnsafeValueError, match=refused):
        await saver.aget_tuple(THREAD)
    with pytest.raises(UnsafeValueError, match=refused):
        [item async for item in saver.alist(THREAD)]
    with pytest.raises(UnsafeValueError, match=refused):
        await graph().compile(checkpointer=saver).ainvoke(Command(resume="yes"), THREAD)
    assert not target.exists()


async def test_a_graphs_own_types_load_once_allowed(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = await _paused(db)
    notes = [Note(text="n1")]
    by_default = graph().compile(checkpointer=MemormSaver(db, agent=agent))
    name = re.escape(f"{Note.__module__}.Note")
    with pytest.raises(UnsafeValueError, match=rf"^channel 'notes' of checkpoint .*: it names {name}, "):
        await by_default.aget_state(THREAD)
    for allowed in (Note, (Note.__module__, "Note"), f"{Note.__module__}.Note"):
        saver = MemormSaver(db, agent=agent, allowed_types=[allowed])
        assert (await graph().compile(checkpointer=saver).aget_state(THREAD)).values["notes"] == notes
    # LANGGRAPH_STRICT_MSGPACK=true: graph.compile() allows its state schema's types (saver.with_allowlist).
    monkeypatch.setattr(_serde, "STRICT_MSGPACK_ENABLED", True)
    strict = graph().compile(checkpointer=MemormSaver(db, agent=agent))
    done = await strict.ainvoke(Command(resume="yes"), THREAD)
    assert done["notes"] == [*notes, Note(text="asked:yes")]


class _Xor:
    """A toy cipher (LangGraph's CipherProtocol): the test needs no key, only a second layer."""

    def encrypt(self, plaintext: bytes) -> tuple[str, bytes]:
        return "xor", bytes(byte ^ 0x5A for byte in plaintext)

    def decrypt(self, ciphername: str, ciphertext: bytes) -> bytes:
        return bytes(byte ^ 0x5A for byte in ciphertext)


async def test_a_serializer_that_would_run_code_is_refused_and_an_encrypted_strict_one_checks(
    db: Database, tmp_path: Path
) -> None:
    agent = uuid.uuid4()
    for permissive in (
        JsonPlusSerializer(allowed_msgpack_modules=True),  # LangGraph's default (without its env flag)
        JsonPlusSerializer(allowed_json_modules=True, allowed_msgpack_modules=None),
        EncryptedSerializer(_Xor(), JsonPlusSerializer(allowed_msgpack_modules=True)),
    ):
        with pytest.raises(
            ValidationError, match=r"calls any callable a stored value names.*StrictSerializer"
        ):
            MemormSaver(db, agent=agent, serde=permissive)
    with pytest.raises(ValidationError, match="pickle"):
        MemormSaver(
            db, agent=agent, serde=EncryptedSerializer(_Xor(), JsonPlusSerializer(pickle_fallback=True))
        )
    with pytest.raises(ValidationError, match=r"allowed_types: with serde, give them to that serializer"):
        MemormSaver(db, agent=agent, serde=StrictSerializer(), allowed_types=[Note])
    MemormSaver(db, agent=agent, serde=JsonPlusSerializer(allowed_msgpack_modules=None))  # LangGraph's strict

    async with db.unit_of_work() as uow:
        agent = (await uow.agents.create("secret")).id
    encrypted = EncryptedSerializer(_Xor(), StrictSerializer(allowed_types=[Note]))
    saver = MemormSaver(db, agent=agent, serde=encrypted)
    await graph().compile(checkpointer=saver).ainvoke({"notes": [], "count": 1}, THREAD)
    assert (await saver.aget_tuple(THREAD)) is not None
    target = tmp_path / "made"
    async with db.unit_of_work() as uow:
        update = sa.update(GraphBlob).where(GraphBlob.channel == "count")
        kind, value = _Xor().encrypt(mkdir(target))
        await uow.session.execute(update.values(value_type=f"msgpack+{kind}", value=value))
    with pytest.raises(UnsafeValueError, match=r"^channel 'count' .*: it names os\.mkdir"):
        await saver.aget_tuple(THREAD)
    assert not target.exists()


def _records(file: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines()]


def _write(file: Path, records: list[dict[str, Any]]) -> Path:
    file.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return file


async def _tenant_rows(db: Database) -> int:
    async with db.unit_of_work("acme", read_only=True) as uow:
        return len((await uow.agents.list()).items)


async def test_an_import_refuses_a_graph_value_naming_a_callable_by_line_and_writes_nothing(
    db: Database, tmp_path: Path
) -> None:
    await _paused(db.for_tenant("acme"))
    exported = tmp_path / "acme.jsonl"
    await export_jsonl(db, exported, tenant="acme")
    records = _records(exported)
    await db.delete_tenant("acme")
    target = tmp_path / "made"
    for table in GRAPH_TABLES:
        at = next(n for n, record in enumerate(records) if record.get("table") == table)
        crafted = [dict(record) for record in records]
        row = {
            **crafted[at]["row"],
            "value_type": "msgpack",
            "value": base64.b64encode(mkdir(target)).decode(),
        }
        crafted[at] = {**crafted[at], "row": row}
        file = _write(tmp_path / f"{table}.jsonl", crafted)
        refused = rf"^{re.escape(str(file))}:{at + 1}: {table}\.value: it names os\.mkdir, "
        with pytest.raises(UnsafeValueError, match=refused):
            await import_jsonl(db, file, tenant="acme", allowed_types=[Note])
        assert await _tenant_rows(db) == 0
    assert not target.exists()

    # The graph's own type is refused too, until allowed; then the thread resumes in the import.
    name = re.escape(f"{Note.__module__}.Note")
    with pytest.raises(UnsafeValueError, match=rf":\d+: graph_(blobs|writes)\.value: it names {name}, "):
        await import_jsonl(db, exported, tenant="acme")
    assert await _tenant_rows(db) == 0
    report = await import_jsonl(db, exported, tenant="acme", allowed_types=[Note])
    assert report.inserted["graph_blobs"] > 0
    async with db.unit_of_work("acme", read_only=True) as uow:
        agent = await uow.agents.get_by_name("graph")
    assert agent is not None
    saver = MemormSaver(db.for_tenant("acme"), agent=agent.id, allowed_types=[Note])
    done = await graph().compile(checkpointer=saver).ainvoke(Command(resume="yes"), THREAD)
    assert done["notes"] == [Note(text="n1"), Note(text="asked:yes")]


def test_memorm_import_refuses_in_one_line_and_allow_type_admits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, destination = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"

    async def fill() -> None:
        async with Database(source) as db:
            await db.upgrade()
            await _paused(db)

    asyncio.run(fill())
    file = tmp_path / "memory.jsonl"
    assert main(["export", source, str(file)]) == 0
    capsys.readouterr()
    assert main(["import", destination, str(file)]) == 1
    err = capsys.readouterr().err
    assert re.fullmatch(
        rf"memorm: error: {re.escape(str(file))}:\d+: graph_(blobs|writes)\.value: it names "
        rf"{re.escape(Note.__module__)}\.Note, .* --allow-type MODULE\.NAME on the import commands\)\n",
        err,
    ), err
    assert main(["import", destination, str(file), "--allow-type", f"{Note.__module__}.Note"]) == 0
    assert re.search(r"^imported [1-9]\d* graph_blobs$", capsys.readouterr().out, re.MULTILINE)
    error = usage_error(capsys, "import", destination, str(file), "--allow-type", "Note")
    assert "argument --allow-type: expected MODULE.NAME (e.g. mypkg.models.Profile), got 'Note'" in error
