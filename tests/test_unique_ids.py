"""An id names one message, or one archival passage, of its tenant, whichever agent holds it (issue 28).

Messages and passages are keyed `(tenant, id, agent_id)` so that Citus can
shard them by agent, which let a caller store an id another agent of the
tenant already had; bare-id calls (`get`, `delete`, `update_text`) then met
both rows.  A unique index on `(tenant, id)` now refuses the second use on
SQLite and Postgres; on a distributed database (`MEMORM_TEST_CITUS=1`), which
cannot hold that index, the writes lock and look up the ids a caller chose.
Migration 0015 refuses a database whose rows already share ids, naming them.
"""

from __future__ import annotations

import copy
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from conftest import Store

from memorm import ArchivalPassage, ConflictError, Database, DatabaseError, Message, NotFoundError
from memorm.models import MESSAGES, PASSAGES, SESSIONS
from memorm.testing import capture_statements
from memorm.transfer import copy_database, export_jsonl, import_jsonl

pytestmark = pytest.mark.anyio

WRITERS = 4  # agents writing one id at once


async def _chats(db: Database, count: int) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """`count` agents with a session each: (agent, session)."""
    made = []
    async with db.unit_of_work() as uow:
        for _ in range(count):
            agent = await uow.agents.create(f"agent-{uuid.uuid4().hex[:8]}")
            made.append((agent.id, (await uow.sessions.create(agent.id)).id))
    return made


async def _holders(db: Database, table: sa.Table, row_id: uuid.UUID) -> list[uuid.UUID]:
    """The agents whose rows of `table` have the id (read with raw SQL, no bare-id call)."""
    async with db.unit_of_work(read_only=True) as uow:
        found = await uow.session.execute(sa.select(table.c.agent_id).where(table.c.id == row_id))
        return sorted(found.scalars())


async def test_a_message_id_another_agent_holds_is_refused_and_bare_id_calls_meet_one_message(
    db: Database,
) -> None:
    (a, chat_a), (_, chat_b) = await _chats(db, 2)
    async with db.unit_of_work() as uow:
        (first,) = await uow.messages.append(chat_a, {"role": "user", "content": "a's"})
    taken = first.id
    async with db.unit_of_work() as uow:  # each refusal comes before any write: the unit goes on
        with pytest.raises(ConflictError, match=rf"^messages\[0\]: a message with id {taken} is stored in"):
            await uow.messages.append(chat_b, Message(id=taken, role="user", content="b's"))
        with pytest.raises(ConflictError, match=rf"^a message with id {taken} exists$"):
            await uow.messages.prepend(chat_b, {"id": taken, "role": "user", "content": "b's"})
        (own,) = await uow.messages.append(chat_b, {"role": "user", "content": "b's own"})
    assert own.seq == 1
    assert await _holders(db, MESSAGES, taken) == [a]
    async with db.unit_of_work() as uow:
        assert (await uow.messages.get(taken)).content == "a's"
        await uow.messages.delete(taken)
        assert [await uow.messages.count(chat) for chat in (chat_a, chat_b)] == [0, 1]


@pytest.mark.parametrize("how", ["model_copy", "copy", "deepcopy"])
async def test_a_copy_of_an_unsent_message_is_refused_in_another_agent(db: Database, how: str) -> None:
    # A new Message's id is memorm's and needs no check when it is first stored; a copy
    # shares it, so both then count as given ids and the second use is looked up.
    (_, chat_a), (_, chat_b) = await _chats(db, 2)
    sent = Message(role="user", content="shared")
    double = {
        "model_copy": sent.model_copy,
        "copy": lambda: copy.copy(sent),
        "deepcopy": lambda: copy.deepcopy(sent),
    }[how]()
    async with db.unit_of_work() as uow:
        await uow.messages.append(chat_a, sent)
    async with db.unit_of_work() as uow:
        with pytest.raises(ConflictError, match=r"is stored in another session$"):
            await uow.messages.append(chat_b, double)
        await uow.messages.append(chat_b, {"role": "user", "content": "goes on"})
    assert len(await _holders(db, MESSAGES, sent.id)) == 1


async def test_a_new_messages_append_sends_what_a_dict_without_an_id_sends(db: Database) -> None:
    # memorm's own ids are new by construction: the chat path checks nothing more for them
    # (on a distributed database, no lock and no read of every shard).
    ((_, chat),) = await _chats(db, 1)
    async with db.unit_of_work() as uow:
        await uow.messages.append(chat, {"role": "system", "content": "warm"})  # the session's agent known

    async def sent(message: Any) -> list[str]:
        with capture_statements(db) as statements:
            async with db.unit_of_work() as uow:
                await uow.messages.append(chat, message)
        return [sql for sql, _ in statements]

    as_dict = await sent({"role": "user", "content": "hi"})
    assert await sent(Message(role="user", content="hi")) == as_dict
    chosen = await sent({"id": uuid.uuid4(), "role": "user", "content": "hi"})
    assert any("pg_advisory_xact_lock" in sql for sql in chosen) == db.distributed


async def test_a_passage_id_another_agent_holds_is_refused_and_bare_id_calls_meet_one_passage(
    db: Database,
) -> None:
    (a, _), (b, _) = await _chats(db, 2)
    async with db.unit_of_work() as uow:
        first = await uow.passages.add(a, "a's fact", [1.0, 0.0])
    taken = first.id
    given: list[Any] = [
        {"id": taken, "text": "b's fact", "embedding": [0.0, 1.0]},
        ArchivalPassage(id=taken, text="b's fact", embedding=[0.0, 1.0], embedding_dim=2),
    ]
    async with db.unit_of_work() as uow:
        for item in given:
            with pytest.raises(ConflictError, match=rf"^an archival passage with id {taken} exists$"):
                await uow.passages.add_many(b, [{"text": "new", "embedding": [1.0, 1.0]}, item])
        await uow.passages.add(b, "b's own", [0.0, 1.0])
    assert await _holders(db, PASSAGES, taken) == [a]
    async with db.unit_of_work() as uow:
        assert (await uow.passages.update_text(taken, "a's new fact", [1.0, 0.5])).agent_id == a
        await uow.passages.delete(taken)
        assert [await uow.passages.count(agent) for agent in (a, b)] == [0, 1]
        with pytest.raises(NotFoundError):
            await uow.passages.get(taken)


async def _at_once(db: Database, write: Any) -> list[str]:
    """Run `write(uow, n)` for each of `WRITERS` writers at once; what became of each.

    Each holds its transaction open a moment after writing, so the others meet
    it.  A writer failed with `DatabaseError` (it raced another's commit: its
    unit of work rolled back) runs again, as the error says to.
    """
    outcomes: dict[int, str] = {}

    async def writer(n: int) -> None:
        for _ in range(3):
            try:
                async with db.unit_of_work() as uow:
                    await write(uow, n)
                    await anyio.sleep(0.05)
            except ConflictError:
                outcomes[n] = "refused"
                return
            except DatabaseError:
                continue
            outcomes[n] = "stored"
            return
        outcomes[n] = "failed"

    async with anyio.create_task_group() as tasks:
        for n in range(WRITERS):
            tasks.start_soon(writer, n)
    return sorted(outcomes.values())


@pytest.mark.parametrize("size", [1, 3], ids=["one", "batch"])
async def test_agents_appending_one_message_id_at_once_store_it_once(db: Database, size: int) -> None:
    chats = await _chats(db, WRITERS)
    taken = uuid.uuid4()

    async def append(uow: Any, n: int) -> None:
        batch = [{"role": "user", "content": f"{n}.{i}"} for i in range(size - 1)]
        await uow.messages.append(chats[n][1], [*batch, {"id": taken, "role": "user", "content": f"{n}"}])

    assert await _at_once(db, append) == ["refused"] * (WRITERS - 1) + ["stored"]
    assert len(await _holders(db, MESSAGES, taken)) == 1


async def test_agents_adding_one_passage_id_at_once_store_it_once(db: Database) -> None:
    chats = await _chats(db, WRITERS)
    taken = uuid.uuid4()

    async def add(uow: Any, n: int) -> None:
        await uow.passages.add_many(chats[n][0], [{"id": taken, "text": f"{n}", "embedding": [1.0, n]}])

    assert await _at_once(db, add) == ["refused"] * (WRITERS - 1) + ["stored"]
    assert len(await _holders(db, PASSAGES, taken)) == 1


async def _share_ids(db: Database) -> tuple[uuid.UUID, uuid.UUID, uuid.UUID]:
    """At revision 0014, rows of a second agent with a message id and a passage id of the first.

    What a database could come to hold before revision 0015.  Returns
    (the message id, the passage id, the second agent).
    """
    (a, chat_a), (b, chat_b) = await _chats(db, 2)
    async with db.unit_of_work() as uow:
        (message,) = await uow.messages.append(chat_a, {"role": "user", "content": "a's"})
        passage = await uow.passages.add(a, "a's fact", [1.0, 0.0])
        await uow.passages.add(b, "b's fact", [0.0, 1.0])  # b's embedding model
    await db.downgrade("0014")
    async with db.engine.begin() as connection:
        for table, row_id in ((MESSAGES, message.id), (PASSAGES, passage.id)):
            replaced = {"agent_id": b, "session_id": chat_b}  # the same row, of b (and its session)
            values = [sa.literal(replaced[c.name], c.type) if c.name in replaced else c for c in table.c]
            copied = sa.select(*values).where(table.c.id == row_id)
            await connection.execute(sa.insert(table).from_select([c.name for c in table.c], copied))
        await connection.execute(sa.update(SESSIONS).where(SESSIONS.c.id == chat_b).values(next_seq=2))
    return message.id, passage.id, b


async def test_an_upgrade_over_shared_ids_names_them_changes_nothing_and_runs_once_they_are_gone(
    store: Store, tmp_path: Path
) -> None:
    async with store.database() as db:
        await db.upgrade()
        message, passage, b = await _share_ids(db)
        with pytest.raises(ConflictError) as refused:
            await db.upgrade()
        said = str(refused.value)
        assert f"messages id {message} (tenant 'default', agents " in said
        assert f"archival_passages id {passage} (tenant 'default', agents " in said
        assert said.endswith("then upgrade again; nothing was changed")
        assert await db.current_revision() == "0014"
        # The fixes docs/migrations.md gives: a new id for one message, the passage deleted.
        async with db.engine.begin() as connection:
            await connection.execute(
                sa.update(MESSAGES)
                .where(MESSAGES.c.id == message, MESSAGES.c.agent_id == b)
                .values(id=uuid.uuid4())
            )
            await connection.execute(
                sa.delete(PASSAGES).where(PASSAGES.c.id == passage, PASSAGES.c.agent_id == b)
            )
        await db.upgrade()
        async with db.unit_of_work() as uow:
            assert (await uow.messages.get(message)).content == "a's"
        # export, import and copy carry every row of the upgraded database.
        async with Database(f"sqlite+aiosqlite:///{tmp_path / 'copy.db'}") as copied:
            report = await copy_database(db, copied)
            assert report.problems == []
            assert (report.inserted["messages"], report.inserted["archival_passages"]) == (2, 2)
        exported = await export_jsonl(db, tmp_path / "memory.jsonl")
        assert (exported["messages"], exported["archival_passages"]) == (2, 2)
        async with Database(f"sqlite+aiosqlite:///{tmp_path / 'imported.db'}") as imported:
            report = await import_jsonl(imported, tmp_path / "memory.jsonl")
            assert (report.inserted["messages"], report.inserted["archival_passages"]) == (2, 2)
