"""An export's rows checked against each other and the database they go into, before any is written.

`FileCheck` takes the rows in file order, in batches, and refuses
(`ValidationError` naming the line) what would corrupt the database or fail
halfway through an import:

* a row that is not in id order after the previous row of its table (as
  export writes them), which also catches an id given twice;
* a reference to an agent, session or embedding model that is neither
  earlier in the file nor in the database;
* a message whose `agent_id` is not its session's, or whose `seq` is not
  below its session's `next_seq` (appends take numbers from there);
* a passage whose vector has not its model's dimension or precision;
* a row the database's unique constraints would refuse: an agent name, a
  model name of an agent, a session key of an agent or a message `seq` of
  a session taken by another row, in the file or in the database; or a
  session whose id the database holds under another agent.

A row whose id the database has already is skipped by the import, so the
database's version of it (a session's agent and `next_seq`, a model's
shape) is what later rows are checked against.  Memory grows with agents,
models and sessions, and by 12 bytes per message (its `seq` and line, to
find duplicates at the end); never with texts or vectors.
"""

from __future__ import annotations

import uuid
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import sqlalchemy as sa

from memorm.db import Database
from memorm.errors import ValidationError
from memorm.models import AGENTS, EMBEDDING_MODELS, MESSAGES, SESSIONS
from memorm.transfer.checks import Values, vector_of
from memorm.translate import guarded

__all__ = ["FileCheck", "Numbered", "Pending"]

T = TypeVar("T")
_CHUNK = 1_000  # ids per IN list: far below both engines' limits on bound parameters


def _chunks(items: Sequence[T]) -> Iterable[Sequence[T]]:
    for start in range(0, len(items), _CHUNK):
        yield items[start : start + _CHUNK]


@dataclass
class _Chat:
    """A session as the file's later rows see it."""

    agent_id: uuid.UUID
    next_seq: int
    stored: bool  # the database holds it: its messages' seqs may clash there
    seqs: array[int] = field(default_factory=lambda: array("i"))
    lines: array[int] = field(default_factory=lambda: array("Q"))


Pending = list[tuple[str, int, Values]]  # (where, line, row)
Numbered = tuple[int, str, sa.Table, tuple[Any, ...]]  # (line, where, table, row)


class FileCheck:
    """Cross-row checks of one export against the database `db` it is to be imported into."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.agents: dict[uuid.UUID, bool] = {}  # known agents: whether the database holds them
        self.names: dict[str, str] = {}  # agent names in the file: where
        self.models: dict[tuple[uuid.UUID, str], tuple[int, str]] = {}  # (agent, name): (dim, precision)
        self.chats: dict[uuid.UUID, _Chat] = {}
        self.keys: dict[tuple[uuid.UUID, str], str] = {}  # session keys in the file: where
        self.last: dict[str, uuid.UUID] = {}

    def order(self, table: sa.Table, values: Values, where: str) -> None:
        """Refuse a row that does not come after the previous row of its table."""
        last = self.last.get(table.name)
        if last is not None and values["id"] <= last:
            raise ValidationError(
                f"{where}: {table.name}.id: {values['id']} is not after the previous row's {last} "
                "(rows come in id order, each id once)"
            )
        self.last[table.name] = values["id"]

    async def batch(self, table: sa.Table, rows: Pending) -> None:
        """Check a batch of rows of `table` (already checked one by one), in file order."""
        await getattr(self, f"_{table.name}")(rows)

    def finish(self, source: str) -> None:
        """The checks that need the whole file: no `seq` twice in a session."""
        for chat_id, chat in self.chats.items():
            if len(chat.seqs) < 2:
                continue
            seqs = np.frombuffer(chat.seqs, dtype=np.int32)
            order = np.lexsort((np.frombuffer(chat.lines, dtype=np.uint64), seqs))
            same = np.flatnonzero(seqs[order][1:] == seqs[order][:-1])
            if len(same):
                first, second = (int(chat.lines[order[i]]) for i in (same[0], same[0] + 1))
                raise ValidationError(
                    f"{source}:{second}: messages.seq: {seqs[order[same[0]]]} is taken in session "
                    f"{chat_id} by the message on line {first}"
                )

    # -- lookups -----------------------------------------------------------------------------

    async def _select(self, statement: sa.Select[Any]) -> list[tuple[Any, ...]]:
        async with self.db.unit_of_work(read_only=True) as uow, guarded(uow.session):
            return [tuple(row) for row in await uow.session.execute(statement)]

    async def _stored(self, columns: Sequence[Any], key: Any, wanted: Iterable[Any]) -> list[tuple[Any, ...]]:
        """Rows (`columns`) of the database whose `key` is one of `wanted`."""
        found: list[tuple[Any, ...]] = []
        for chunk in _chunks(sorted(set(wanted))):
            found += await self._select(sa.select(*columns).where(key.in_(chunk)))
        return found

    async def _require_agents(self, table: str, rows: Pending) -> None:
        unknown = {row["agent_id"] for _, _, row in rows} - self.agents.keys()
        for (agent_id,) in await self._stored([AGENTS.c.id], AGENTS.c.id, unknown):
            self.agents[agent_id] = True
        for where, _, row in rows:
            if row["agent_id"] not in self.agents:
                raise ValidationError(
                    f"{where}: {table}.agent_id: no agent {row['agent_id']} earlier in the file "
                    "or in the database"
                )

    # -- tables ------------------------------------------------------------------------------

    async def _agents(self, rows: Pending) -> None:
        ids = {row["id"] for _, _, row in rows}
        by_name = {
            name: agent_id
            for agent_id, name in await self._stored(
                [AGENTS.c.id, AGENTS.c.name], AGENTS.c.name, (row["name"] for _, _, row in rows)
            )
        }
        stored = {agent_id for (agent_id,) in await self._stored([AGENTS.c.id], AGENTS.c.id, ids)}
        for where, _, row in rows:
            name = row["name"]
            if name in self.names:
                raise ValidationError(
                    f"{where}: agents.name: {name!r} is taken by the agent on {self.names[name]}"
                )
            holder = by_name.get(name)
            if holder is not None and holder != row["id"]:
                raise ValidationError(
                    f"{where}: agents.name: the database's agent {holder} is called {name!r}"
                )
            self.names[name] = where
            self.agents[row["id"]] = row["id"] in stored

    async def _embedding_models(self, rows: Pending) -> None:
        await self._require_agents("embedding_models", rows)
        columns = [EMBEDDING_MODELS.c[name] for name in ("id", "agent_id", "name", "dim", "precision")]
        owners = {row["agent_id"] for _, _, row in rows if self.agents[row["agent_id"]]}
        stored = {
            (agent_id, name): (model_id, (dim, precision))
            for model_id, agent_id, name, dim, precision in await self._stored(
                columns, EMBEDDING_MODELS.c.agent_id, owners
            )
        }
        for where, _, row in rows:
            key = (row["agent_id"], row["name"])
            if key in self.models:
                raise ValidationError(
                    f"{where}: embedding_models.name: agent {key[0]} has a model {key[1]!r} already"
                )
            model_id, shape = stored.get(key, (row["id"], (row["dim"], row["precision"])))
            if model_id != row["id"]:
                raise ValidationError(
                    f"{where}: embedding_models.name: the database's model {model_id} of agent {key[0]} "
                    f"is called {key[1]!r}"
                )
            self.models[key] = shape

    async def _sessions(self, rows: Pending) -> None:
        await self._require_agents("sessions", rows)
        columns = [SESSIONS.c.id, SESSIONS.c.agent_id, SESSIONS.c.next_seq]
        stored = {
            row[0]: row[1:]
            for row in await self._stored(columns, SESSIONS.c.id, (r["id"] for _, _, r in rows))
        }
        keys = {row["key"] for _, _, row in rows if row["key"] is not None and self.agents[row["agent_id"]]}
        holders = {
            (agent_id, key): session_id
            for session_id, agent_id, key in await self._stored(
                [SESSIONS.c.id, SESSIONS.c.agent_id, SESSIONS.c.key], SESSIONS.c.key, keys
            )
        }
        for where, _, row in rows:
            agent_id, next_seq = stored.get(row["id"], (row["agent_id"], row["next_seq"]))
            if agent_id != row["agent_id"]:
                raise ValidationError(
                    f"{where}: sessions.agent_id: the database holds session {row['id']} "
                    f"under agent {agent_id}"
                )
            if row["key"] is not None:
                key = (agent_id, row["key"])
                holder = holders.get(key, row["id"])
                if key in self.keys or holder != row["id"]:
                    taken = self.keys.get(key) or f"the database's session {holder}"
                    raise ValidationError(f"{where}: sessions.key: {row['key']!r} is taken by {taken}")
                self.keys[key] = where
            self.chats[row["id"]] = _Chat(agent_id, next_seq, stored=row["id"] in stored)

    async def _messages(self, rows: Pending) -> None:
        unknown = {row["session_id"] for _, _, row in rows} - self.chats.keys()
        columns = [SESSIONS.c.id, SESSIONS.c.agent_id, SESSIONS.c.next_seq]
        for session_id, agent_id, next_seq in await self._stored(columns, SESSIONS.c.id, unknown):
            self.chats[session_id] = _Chat(agent_id, next_seq, stored=True)
        for where, line, row in rows:
            chat = self.chats.get(row["session_id"])
            if chat is None:
                raise ValidationError(
                    f"{where}: messages.session_id: no session {row['session_id']} earlier in the file "
                    "or in the database"
                )
            if row["agent_id"] != chat.agent_id:
                raise ValidationError(
                    f"{where}: messages.agent_id: {row['agent_id']} is not the agent of session "
                    f"{row['session_id']} ({chat.agent_id})"
                )
            if row["seq"] >= chat.next_seq:
                raise ValidationError(
                    f"{where}: messages.seq: {row['seq']} is not below its session's next_seq {chat.next_seq}"
                )
            chat.seqs.append(row["seq"])
            chat.lines.append(line)
        await self._stored_seqs(
            [(where, row) for where, _, row in rows if self.chats[row["session_id"]].stored]
        )

    async def _stored_seqs(self, rows: list[tuple[str, Values]]) -> None:
        """Refuse new messages whose `seq` another message of the database's session has."""
        for chunk in _chunks(rows):
            wanted = {(row["session_id"], row["seq"]): (where, row["id"]) for where, row in chunk}
            found = await self._select(
                sa.select(MESSAGES.c.id, MESSAGES.c.session_id, MESSAGES.c.seq).where(
                    MESSAGES.c.session_id.in_(sorted({key[0] for key in wanted})),
                    MESSAGES.c.seq.in_(sorted({key[1] for key in wanted})),
                )
            )
            for message_id, session_id, seq in found:  # a superset: pairs of one row's session, another's seq
                where, file_id = wanted.get((session_id, seq), ("", message_id))
                if file_id != message_id:
                    raise ValidationError(
                        f"{where}: messages.seq: the database's message {message_id} has seq {seq} "
                        f"in session {session_id}"
                    )

    async def _archival_passages(self, rows: Pending) -> None:
        unknown = {(row["agent_id"], row["embedding_model"]) for _, _, row in rows} - self.models.keys()
        columns = [EMBEDDING_MODELS.c[name] for name in ("agent_id", "name", "dim", "precision")]
        for agent_id, name, dim, precision in await self._stored(
            columns, EMBEDDING_MODELS.c.agent_id, (key[0] for key in unknown)
        ):
            self.models.setdefault((agent_id, name), (dim, precision))
        for where, _, row in rows:
            shape = self.models.get((row["agent_id"], row["embedding_model"]))
            if shape is None:
                raise ValidationError(
                    f"{where}: archival_passages.embedding_model: agent {row['agent_id']} has no model "
                    f"{row['embedding_model']!r} earlier in the file or in the database"
                )
            dim, precision = shape
            vector, half = vector_of(row)
            if len(vector) != dim or row["embedding_dim"] != dim:
                raise ValidationError(
                    f"{where}: archival_passages.embedding: model {row['embedding_model']!r} stores "
                    f"{dim}-d vectors, got {len(vector)}-d (embedding_dim {row['embedding_dim']})"
                )
            if half != (precision == "float16"):
                column = "embedding_half" if precision == "float16" else "embedding"
                raise ValidationError(
                    f"{where}: archival_passages.{column}: model {row['embedding_model']!r} stores "
                    f"{precision} vectors there"
                )
