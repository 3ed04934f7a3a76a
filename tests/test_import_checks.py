"""``memorm import`` checks the whole file before writing: a bad row is refused by line, nothing written.

An export of two agents (``_populate``: sessions with tool calls, float32 and
float16 models) is corrupted one way per test, then imported into a database
(each engine) that already holds a resident agent.  The import must raise a
``ValidationError`` naming the corrupted line, and every table's checksum must
be what it was before.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import math
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from memorm import Database, ValidationError
from memorm.cli import main
from memorm.transfer import digest_database, export_jsonl, import_jsonl
from tests.test_cli_transfer import _populate, dump

pytestmark = pytest.mark.anyio

Records = list[dict[str, Any]]


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Records:
    """The records of a clean export, one per line (header first, end record last)."""
    folder = tmp_path_factory.mktemp("export")
    url, file = f"sqlite:///{folder / 'source.db'}", folder / "memory.jsonl"

    async def build() -> None:
        await _populate(url)
        async with Database(url) as db:
            await export_jsonl(db, file)

    asyncio.run(build())
    return [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines()]


class Resident:
    """What the destination holds before the import: ids a corrupted file may point at."""

    agent: uuid.UUID
    session: uuid.UUID


async def _resident(db: Database) -> Resident:
    resident = Resident()
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("resident")
        chat = await uow.sessions.create(agent.id, key="key-0")
        await uow.messages.append(chat.id, [{"role": "user", "content": "already here"}])
        await uow.passages.add(agent.id, "fact", [1.0, 0.0])  # model "default", 2-d
    resident.agent, resident.session = agent.id, chat.id
    return resident


def _index(records: Records, table: str, nth: int = 0) -> int:
    """Where the ``nth`` row of ``table`` is in ``records``."""
    found = [i for i, record in enumerate(records) if record.get("table") == table]
    return found[nth]


def _row(records: Records, table: str, nth: int = 0, **changes: Any) -> int:
    """Change the ``nth`` row of ``table``; its index."""
    at = _index(records, table, nth)
    records[at]["row"].update(changes)
    return at


def _passage(records: Records, model: str, **changes: Any) -> int:
    at = next(
        i
        for i, record in enumerate(records)
        if record.get("table") == "archival_passages" and record["row"]["embedding_model"] == model
    )
    records[at]["row"].update(changes)
    return at


def _ids(records: Records, table: str) -> list[str]:
    return [record["row"]["id"] for record in records if record.get("table") == table]


def _swap(records: Records, table: str) -> int:
    first = _index(records, table, 0)
    records[first], records[first + 1] = records[first + 1], records[first]
    return first + 1


def _seq_again(records: Records) -> int:
    """The session's last message takes the seq of its first."""
    first = records[_index(records, "messages", 0)]["row"]
    return _row(records, "messages", 3, seq=first["seq"])


def _foreign_message(records: Records) -> int:
    """A message in agent-1's session that names agent-0: agent-0's searches would find it."""
    agent_0 = records[_index(records, "agents", 0)]["row"]["id"]
    return _row(records, "messages", 5, agent_id=agent_0)


Corrupt = Callable[[Records, Resident], int]

CASES: dict[str, tuple[Corrupt, str]] = {
    # The two: a vector shorter than its model breaks every later search of the agent ...
    "vector length": (
        lambda r, _: _passage(r, "default", embedding=[0.1, -0.2]),
        "stores 3-d vectors, got 2-d",
    ),
    # ... and a message naming another agent than its session's leaks into that agent's search.
    "message of another agent": (lambda r, _: _foreign_message(r), "is not the agent of session"),
    "NUL in text": (lambda r, _: _row(r, "messages", 1, content="a\x00b"), "messages.content: NUL"),
    "lone surrogate": (
        lambda r, _: _row(r, "agents", 0, system="\ud800"),
        "agents.system: not valid unicode",
    ),
    "unknown role": (lambda r, _: _row(r, "messages", 1, role="robot"), "messages.role: 'robot'"),
    "meta not an object": (lambda r, _: _row(r, "sessions", 0, meta=[1]), "sessions.meta: expected a dict"),
    "NaN in meta": (lambda r, _: _row(r, "agents", 1, meta={"x": math.nan}), "not a JSON number"),
    "NaN in a vector": (
        lambda r, _: _passage(r, "default", embedding=[math.nan, 0.0, 0.0]),
        "embedding: NaN",
    ),
    "text in a vector": (lambda r, _: _passage(r, "default", embedding=["0.1", 0.0, 0.0]), "must be numbers"),
    "float16 overflow": (lambda r, _: _passage(r, "half", embedding_half=[7e4, 0.0, 0.0, 0.0]), "float16"),
    "vector in the other precision's column": (
        lambda r, _: _passage(r, "half", embedding=[0.5, 0.25, -1.5, 3.0], embedding_half=None),
        "stores float16 vectors there",
    ),
    "embedding_dim not the model's": (
        lambda r, _: _passage(r, "default", embedding_dim=5),
        "embedding_dim 5",
    ),
    "unknown model": (lambda r, _: _passage(r, "default", embedding_model="nope"), "has no model 'nope'"),
    "session of an unknown agent": (
        lambda r, _: _row(r, "sessions", 0, agent_id=str(uuid.uuid4())),
        "agent_id: no agent",
    ),
    "message of an unknown session": (
        lambda r, _: _row(r, "messages", 0, session_id=str(uuid.uuid4())),
        "no session",
    ),
    "bad uuid": (lambda r, _: _row(r, "messages", 2, session_id="not-a-uuid"), "messages.session_id"),
    "id not a string": (
        lambda r, _: _row(r, "sessions", 0, agent_id=5),
        "sessions.agent_id: expected a UUID",
    ),
    "null id": (lambda r, _: _row(r, "agents", 1, id=None), "agents.id: must not be null"),
    "naive timestamp": (lambda r, _: _row(r, "messages", 2, created_at="2024-03-01T09:00:00"), "no timezone"),
    "seq twice in a session": (lambda r, _: _seq_again(r), "is taken in session"),
    "seq at next_seq": (lambda r, _: _row(r, "messages", 3, seq=5), "not below its session's next_seq 5"),
    "agent name twice": (lambda r, _: _row(r, "agents", 1, name="agent-0"), "is taken by the agent on"),
    "rows out of id order": (lambda r, _: _swap(r, "messages"), "is not after the previous row"),
    "an id twice": (
        lambda r, _: _row(r, "archival_passages", 1, id=_ids(r, "archival_passages")[0]),
        "is not after the previous row",
    ),
    "bool for an integer": (lambda r, _: _row(r, "agents", 0, version=True), "agents.version"),
    "integer past its column": (
        lambda r, _: _row(r, "messages", 2, token_count=2**40),
        "expected an integer from",
    ),
    "tool_calls not a list of dicts": (
        lambda r, _: _row(r, "messages", 2, tool_calls={"id": 1}),
        "tool_calls",
    ),
    "next_seq below 1": (lambda r, _: _row(r, "sessions", 1, next_seq=0), "sessions.next_seq"),
    "model of no dimension": (lambda r, _: _row(r, "embedding_models", 0, dim=0), "embedding_models.dim"),
    "model precision": (lambda r, _: _row(r, "embedding_models", 1, precision="float64"), "precision"),
    "negative retention": (lambda r, _: _row(r, "agents", 0, retention=-5), "agents.retention"),
    "core memory not text": (lambda r, _: _row(r, "agents", 0, core_memory={"human": 5}), "core_memory"),
    "empty session key": (lambda r, _: _row(r, "sessions", 0, key=""), "sessions.key"),
    "blank agent name": (lambda r, _: _row(r, "agents", 1, name="  "), "agents.name"),
    "empty tenant": (lambda r, _: _row(r, "sessions", 1, tenant=""), "sessions.tenant: must not be empty"),
    # Against the database the file goes into:
    "agent name of the database's": (
        lambda r, _: _row(r, "agents", 0, name="resident"),
        "the database's agent",
    ),
    "session held by another agent": (
        lambda r, db: _row(r, "sessions", 1, id=str(db.session)),
        "the database holds session",
    ),
    "session key of the database's": (
        lambda r, db: _row(r, "sessions", 1, agent_id=str(db.agent), key="key-0"),
        "sessions.key: 'key-0' is taken by the database's session",
    ),
    "seq of the database's message": (
        lambda r, db: _row(r, "messages", 4, session_id=str(db.session), agent_id=str(db.agent), seq=1),
        "has seq 1 in session",
    ),
    "vector of the database's model": (
        lambda r, db: _passage(r, "default", agent_id=str(db.agent)),
        "stores 2-d vectors, got 3-d",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_corrupt_export_is_refused_by_line_with_nothing_written(
    db: Database, export: Records, tmp_path: Path, case: str
) -> None:
    resident = await _resident(db)
    corrupt, problem = CASES[case]
    records = json.loads(json.dumps(export))
    line = corrupt(records, resident) + 1
    file = tmp_path / "corrupt.jsonl"
    file.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    before = await digest_database(db)
    with pytest.raises(ValidationError) as refused:
        await import_jsonl(db, file, batch_size=2)
    assert str(refused.value).startswith(f"{file}:{line}: "), refused.value
    assert problem in str(refused.value)
    assert await digest_database(db) == before
    # The file as exported imports (so the refusal was the corruption's doing).
    clean = tmp_path / "clean.jsonl"
    clean.write_text("".join(json.dumps(record) + "\n" for record in export), encoding="utf-8")
    report = await import_jsonl(db, clean, batch_size=2)
    assert report.inserted["messages"] == 8


async def test_a_file_whose_rows_the_database_has_imports_again_without_refusal(
    db: Database, export: Records, tmp_path: Path
) -> None:
    # Rows skipped by id are checked against the database's own copies: a
    # second import of the same file is not refused for their seqs or names.
    file = tmp_path / "memory.jsonl"
    file.write_text("".join(json.dumps(record) + "\n" for record in export), encoding="utf-8")
    first = await import_jsonl(db, file, batch_size=3)
    again = await import_jsonl(db, file, batch_size=3)
    assert (
        first.inserted
        == again.skipped
        == {
            "agents": 2,
            "embedding_models": 4,
            "sessions": 2,
            "messages": 8,
            "archival_passages": 6,
            "graph_checkpoints": 0,
            "graph_writes": 0,
            "graph_blobs": 0,
            "graph_store_items": 0,
            "graph_store_vectors": 0,
        }
    )


async def test_bytes_that_are_no_utf8_or_no_gzip_stream_are_refused_by_line(
    db: Database, export: Records, tmp_path: Path
) -> None:
    lines = [json.dumps(record).encode() + b"\n" for record in export]
    before = await digest_database(db)
    file = tmp_path / "latin1.jsonl"
    file.write_bytes(b"".join([*lines[:4], lines[4].replace(b'"row"', b'"r\xe9w"'), *lines[5:]]))
    with pytest.raises(ValidationError, match=f"^{file}:5: not UTF-8 text$"):
        await import_jsonl(db, file)
    deep = tmp_path / "deep.jsonl"
    deep.write_bytes(b"".join([*lines[:2], b"[" * 100_000 + b"\n", *lines[2:]]))
    with pytest.raises(ValidationError, match=f"^{deep}:3: JSON nested too deeply$"):
        await import_jsonl(db, deep)
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(b"".join(lines))[:-30])
    with pytest.raises(ValidationError, match=r"unreadable \(Compressed file ended"):
        await import_jsonl(db, cut)
    assert await digest_database(db) == before


def test_the_cli_refuses_a_corrupt_file_in_one_line_naming_it(
    export: Records, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'memorm.db'}"
    assert main(["db", "upgrade", "--url", url]) == 0
    records = json.loads(json.dumps(export))
    line = _foreign_message(records) + 1
    file = tmp_path / "memory.jsonl"
    file.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    capsys.readouterr()
    assert main(["import", url, str(file)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"memorm: error: {file}:{line}: messages.agent_id: "), err
    assert err.count("\n") == 1
    assert "is not the agent of session" in err
    assert all(rows == [] for rows in dump(url).values())
