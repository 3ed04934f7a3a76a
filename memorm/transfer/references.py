"""An export's rows checked against each other and the database they go into, before any is written.

`FileCheck` takes the rows in file order, in batches, and refuses
(`ValidationError` naming the line) what would corrupt the database or fail
halfway through an import:

* a row that is not in (tenant, id) order after the previous row of its
  table (as export writes them), which also catches a key given twice;
* a reference to an agent, session or embedding model of the row's tenant
  that is neither earlier in the file nor in the database (another tenant's
  row of that id is no such thing: keys pair the tenant with the id);
* a message whose `agent_id` is not its session's, or whose `seq` is not
  below its session's `next_seq` (appends take numbers from there);
* a passage whose vector has not its model's dimension or precision;
* a row the database's unique constraints would refuse: an agent name of a
  tenant, a model name of an agent, a session key of an agent or a message
  `seq` of a session taken by another row, in the file or in the database;
  or a session whose id the database holds under another agent;
* a graph-state row whose session is not of its tenant, earlier in the file
  or in the database, or not of the row's agent; a store item whose agent is
  not, or a store vector whose item is not.

Every structure and every lookup is keyed by the tenant too, so a file
holding several tenants, or a database holding other tenants with the same
ids, is checked as the database's keys will see it.  A row whose key the
database has already is skipped by the import, so the database's version of
it (a session's agent and `next_seq`, a model's shape) is what later rows are
checked against.  Memory grows with agents, models, sessions and store
items (their keys, which their vectors are checked against), and by 12 bytes
per message (its `seq` and line, to find duplicates at the end); never with
texts, values or vectors.
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
from memorm.models import AGENTS, EMBEDDING_MODELS, MESSAGES, SESSIONS, STORE_ITEMS
from memorm.transfer.checks import Values, vector_of
from memorm.transfer.lookup import PER_QUERY, matching
from memorm.transfer.scope import Scope, scoped
from memorm.translate import guarded

__all__ = ["FileCheck", "Numbered", "Pending"]

T = TypeVar("T")
Key = tuple[str, uuid.UUID]  # (tenant, id)
ItemKey = tuple[str, uuid.UUID, str, str]  # a store item's (tenant, agent_id, namespace, key)


def _chunks(items: Sequence[T]) -> Iterable[Sequence[T]]:
    for start in range(0, len(items), PER_QUERY):
        yield items[start : start + PER_QUERY]


def _item_key(row: Values) -> ItemKey:
    return (row["tenant"], row["agent_id"], row["namespace"], row["key"])


def _of(tenant: str) -> str:
    """How a message names a tenant."""
    return f"tenant {tenant!r}"


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
    """Cross-row checks of one export against the database `db` it is to be imported into.

    `tenant`: the import's scope (None: every tenant); the database is read in
    units of work of that scope.  `db` None stands for an empty database (no
    memorm schema yet): it holds nothing, and nothing is read.
    """

    def __init__(self, db: Database | None, tenant: Scope = None) -> None:
        self.db = db
        self.tenant = tenant
        self.agents: dict[Key, bool] = {}  # known agents: whether the database holds them
        self.names: dict[tuple[str, str], str] = {}  # (tenant, agent name) in the file: where
        self.models: dict[tuple[str, uuid.UUID, str], tuple[int, str]] = {}  # (tenant, agent, name): shape
        self.chats: dict[Key, _Chat] = {}
        self.keys: dict[tuple[str, uuid.UUID, str], str] = {}  # (tenant, agent, session key): where
        self.items: set[ItemKey] = set()  # store items earlier in the file or found in the database
        self.last: dict[str, Key] = {}

    def order(self, table: sa.Table, values: Values, where: str) -> None:
        """Refuse a row that does not come after the previous row of its table, in (tenant, id) order.

        The LangGraph tables' rows (graph state, store) are exported in the
        order of their text keys as the database's collation sorts them,
        which need not be Python's: they are not checked here, and of a key
        given twice the import keeps the first.
        """
        if "id" not in values:
            return
        last = self.last.get(table.name)
        key = (values["tenant"], values["id"])
        if last is not None and key <= last:
            said = values["id"] if key[0] == last[0] else f"{values['id']} of {_of(key[0])}"
            before = last[1] if key[0] == last[0] else f"{last[1]} of {_of(last[0])}"
            raise ValidationError(
                f"{where}: {table.name}.id: {said} is not after the previous row's {before} "
                "(rows come in (tenant, id) order, each id once per tenant)"
            )
        self.last[table.name] = key

    async def batch(self, table: sa.Table, rows: Pending) -> None:
        """Check a batch of rows of `table` (already checked one by one), in file order."""
        await getattr(self, f"_{table.name}")(rows)

    def finish(self, source: str) -> None:
        """The checks that need the whole file: no `seq` twice in a session."""
        for (_, chat_id), chat in self.chats.items():
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
        if self.db is None:
            return []
        async with scoped(self.db, self.tenant, read_only=True) as uow, guarded(uow.link):
            return [tuple(row) for row in await uow.link.session.execute(statement)]

    async def _stored(
        self,
        columns: Sequence[Any],
        key: Sequence[sa.Column[Any]],
        wanted: Iterable[tuple[Any, ...]],
        *also: sa.ColumnElement[bool],
    ) -> list[tuple[Any, ...]]:
        """Rows (`columns`) of the database whose `key` columns hold a `wanted` tuple (and match `also`)."""
        found: list[tuple[Any, ...]] = []
        for where in matching(key, wanted):
            found += await self._select(sa.select(*columns).where(where, *also))
        return found

    async def _require_agents(self, table: str, rows: Pending) -> None:
        unknown = {(row["tenant"], row["agent_id"]) for _, _, row in rows} - self.agents.keys()
        for tenant, agent_id in await self._stored(
            [AGENTS.c.tenant, AGENTS.c.id], [AGENTS.c.tenant, AGENTS.c.id], unknown
        ):
            self.agents[tenant, agent_id] = True
        for where, _, row in rows:
            if (row["tenant"], row["agent_id"]) not in self.agents:
                raise ValidationError(
                    f"{where}: {table}.agent_id: no agent {row['agent_id']} of {_of(row['tenant'])} "
                    "earlier in the file or in the database"
                )

    # -- tables ------------------------------------------------------------------------------

    async def _agents(self, rows: Pending) -> None:
        keys = [(row["tenant"], row["id"]) for _, _, row in rows]
        by_name = {
            (tenant, name): agent_id
            for agent_id, tenant, name in await self._stored(
                [AGENTS.c.id, AGENTS.c.tenant, AGENTS.c.name],
                [AGENTS.c.tenant, AGENTS.c.name],
                ((row["tenant"], row["name"]) for _, _, row in rows),
            )
        }
        stored = set(await self._stored([AGENTS.c.tenant, AGENTS.c.id], [AGENTS.c.tenant, AGENTS.c.id], keys))
        for (where, _, row), key in zip(rows, keys, strict=True):
            name = (row["tenant"], row["name"])
            if name in self.names:
                raise ValidationError(
                    f"{where}: agents.name: {row['name']!r} is taken by the agent on {self.names[name]}"
                )
            holder = by_name.get(name)
            if holder is not None and holder != row["id"]:
                raise ValidationError(
                    f"{where}: agents.name: the database's agent {holder} is called {row['name']!r}"
                )
            self.names[name] = where
            self.agents[key] = key in stored

    async def _embedding_models(self, rows: Pending) -> None:
        await self._require_agents("embedding_models", rows)
        names = ("id", "tenant", "agent_id", "name", "dim", "precision")
        columns = [EMBEDDING_MODELS.c[name] for name in names]
        owners = {
            (row["tenant"], row["agent_id"])
            for _, _, row in rows
            if self.agents[row["tenant"], row["agent_id"]]
        }
        stored = {
            (tenant, agent_id, name): (model_id, (dim, precision))
            for model_id, tenant, agent_id, name, dim, precision in await self._stored(
                columns, [EMBEDDING_MODELS.c.tenant, EMBEDDING_MODELS.c.agent_id], owners
            )
        }
        for where, _, row in rows:
            key = (row["tenant"], row["agent_id"], row["name"])
            if key in self.models:
                raise ValidationError(
                    f"{where}: embedding_models.name: agent {key[1]} has a model {key[2]!r} already"
                )
            model_id, shape = stored.get(key, (row["id"], (row["dim"], row["precision"])))
            if model_id != row["id"]:
                raise ValidationError(
                    f"{where}: embedding_models.name: the database's model {model_id} of agent {key[1]} "
                    f"is called {key[2]!r}"
                )
            self.models[key] = shape

    async def _sessions(self, rows: Pending) -> None:
        await self._require_agents("sessions", rows)
        columns = [SESSIONS.c.tenant, SESSIONS.c.id, SESSIONS.c.agent_id, SESSIONS.c.next_seq]
        stored = {
            (tenant, session_id): (agent_id, next_seq)
            for tenant, session_id, agent_id, next_seq in await self._stored(
                columns, [SESSIONS.c.tenant, SESSIONS.c.id], ((r["tenant"], r["id"]) for _, _, r in rows)
            )
        }
        keys = {
            (row["tenant"], row["agent_id"], row["key"])
            for _, _, row in rows
            if row["key"] is not None and self.agents[row["tenant"], row["agent_id"]]
        }
        key_columns = [SESSIONS.c.tenant, SESSIONS.c.agent_id, SESSIONS.c.key]
        holders = {
            (tenant, agent_id, key): session_id
            for session_id, tenant, agent_id, key in await self._stored(
                [SESSIONS.c.id, *key_columns], key_columns, keys
            )
        }
        for where, _, row in rows:
            tenant = row["tenant"]
            agent_id, next_seq = stored.get((tenant, row["id"]), (row["agent_id"], row["next_seq"]))
            if agent_id != row["agent_id"]:
                raise ValidationError(
                    f"{where}: sessions.agent_id: the database holds session {row['id']} "
                    f"under agent {agent_id}"
                )
            if row["key"] is not None:
                key = (tenant, agent_id, row["key"])
                holder = holders.get(key, row["id"])
                if key in self.keys or holder != row["id"]:
                    taken = self.keys.get(key) or f"the database's session {holder}"
                    raise ValidationError(f"{where}: sessions.key: {row['key']!r} is taken by {taken}")
                self.keys[key] = where
            self.chats[tenant, row["id"]] = _Chat(agent_id, next_seq, stored=(tenant, row["id"]) in stored)

    async def _require_sessions(self, table: str, rows: Pending) -> None:
        """Refuse a row whose session is not earlier in the file or in the database, or not its agent's."""
        unknown = {(row["tenant"], row["session_id"]) for _, _, row in rows} - self.chats.keys()
        columns = [SESSIONS.c.tenant, SESSIONS.c.id, SESSIONS.c.agent_id, SESSIONS.c.next_seq]
        for tenant, session_id, agent_id, next_seq in await self._stored(
            columns, [SESSIONS.c.tenant, SESSIONS.c.id], unknown
        ):
            self.chats[tenant, session_id] = _Chat(agent_id, next_seq, stored=True)
        for where, _, row in rows:
            chat = self.chats.get((row["tenant"], row["session_id"]))
            if chat is None:
                raise ValidationError(
                    f"{where}: {table}.session_id: no session {row['session_id']} of {_of(row['tenant'])} "
                    "earlier in the file or in the database"
                )
            if row["agent_id"] != chat.agent_id:
                raise ValidationError(
                    f"{where}: {table}.agent_id: {row['agent_id']} is not the agent of session "
                    f"{row['session_id']} ({chat.agent_id})"
                )

    async def _graph_checkpoints(self, rows: Pending) -> None:
        await self._require_sessions("graph_checkpoints", rows)

    async def _graph_writes(self, rows: Pending) -> None:
        await self._require_sessions("graph_writes", rows)

    async def _graph_blobs(self, rows: Pending) -> None:
        await self._require_sessions("graph_blobs", rows)

    async def _graph_store_items(self, rows: Pending) -> None:
        await self._require_agents("graph_store_items", rows)
        self.items.update(_item_key(row) for _, _, row in rows)

    async def _graph_store_vectors(self, rows: Pending) -> None:
        """Refuse a vector whose item is not earlier in the file or in the database."""
        unknown = {_item_key(row) for _, _, row in rows} - self.items
        key = [STORE_ITEMS.c.tenant, STORE_ITEMS.c.agent_id, STORE_ITEMS.c.namespace, STORE_ITEMS.c.key]
        self.items.update(await self._stored(key, key, unknown))
        for where, _, row in rows:
            if _item_key(row) not in self.items:
                raise ValidationError(
                    f"{where}: graph_store_vectors.key: agent {row['agent_id']} of {_of(row['tenant'])} "
                    f"has no item {row['key']!r} in namespace {row['namespace']!r} earlier in the file "
                    "or in the database"
                )

    async def _messages(self, rows: Pending) -> None:
        await self._require_sessions("messages", rows)
        for where, line, row in rows:
            chat = self.chats[row["tenant"], row["session_id"]]
            if row["seq"] >= chat.next_seq:
                raise ValidationError(
                    f"{where}: messages.seq: {row['seq']} is not below its session's next_seq {chat.next_seq}"
                )
            chat.seqs.append(row["seq"])
            chat.lines.append(line)
        await self._stored_seqs(
            [(where, row) for where, _, row in rows if self.chats[row["tenant"], row["session_id"]].stored]
        )

    async def _stored_seqs(self, rows: list[tuple[str, Values]]) -> None:
        """Refuse new messages whose `seq` another message of the database's session has."""
        columns = [MESSAGES.c.id, MESSAGES.c.tenant, MESSAGES.c.session_id, MESSAGES.c.seq]
        for chunk in _chunks(rows):
            wanted = {
                (row["tenant"], row["session_id"], row["seq"]): (where, row["id"]) for where, row in chunk
            }
            seqs = MESSAGES.c.seq.in_(sorted({key[2] for key in wanted}))
            found = await self._stored(
                columns, [MESSAGES.c.tenant, MESSAGES.c.session_id], (key[:2] for key in wanted), seqs
            )
            for message_id, tenant, session_id, seq in found:  # a superset: one row's session, another's seq
                where, file_id = wanted.get((tenant, session_id, seq), ("", message_id))
                if file_id != message_id:
                    raise ValidationError(
                        f"{where}: messages.seq: the database's message {message_id} has seq {seq} "
                        f"in session {session_id}"
                    )

    async def _archival_passages(self, rows: Pending) -> None:
        unknown = {
            (row["tenant"], row["agent_id"], row["embedding_model"]) for _, _, row in rows
        } - self.models.keys()
        columns = [EMBEDDING_MODELS.c[name] for name in ("tenant", "agent_id", "name", "dim", "precision")]
        for tenant, agent_id, name, dim, precision in await self._stored(
            columns, [EMBEDDING_MODELS.c.tenant, EMBEDDING_MODELS.c.agent_id], (key[:2] for key in unknown)
        ):
            self.models.setdefault((tenant, agent_id, name), (dim, precision))
        for where, _, row in rows:
            shape = self.models.get((row["tenant"], row["agent_id"], row["embedding_model"]))
            if shape is None:
                raise ValidationError(
                    f"{where}: archival_passages.embedding_model: agent {row['agent_id']} of "
                    f"{_of(row['tenant'])} has no model {row['embedding_model']!r} earlier in the file "
                    "or in the database"
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
