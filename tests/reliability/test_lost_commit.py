"""A commit whose acknowledgement is lost, and the retry that must not store a message twice (issue 27).

`tests/fault_proxy.py` sits between asyncpg and Postgres and, armed, lets
a unit of work's `COMMIT` through and closes the connection before the
server's answer comes back.  The unit of work fails with a `MemormError`
though its messages are committed; the server retries the append with the
same message ids on the same `Database` and gets the stored messages back,
with exactly one copy stored.  (SQLite has no connection to lose: its
retries are tested in `tests/test_recall_retry.py`.)
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from conftest import ENGINES, POSTGRES_URL, Store, asyncpg_dsn
from fault_proxy import FaultProxy
from sqlalchemy.engine import make_url

from memorm import ConflictError, Database, Message
from memorm.errors import DatabaseError, MemormError

pytestmark = [pytest.mark.anyio, pytest.mark.reliability]

POSTGRES = pytest.mark.parametrize("engine", [ENGINES[1]], indirect=True)


@pytest.fixture
async def proxied(db: Database, store: Store) -> AsyncIterator[tuple[Database, FaultProxy]]:
    """A `Database` on `db`'s store (its role) that reaches Postgres through a `FaultProxy`."""
    server = make_url(POSTGRES_URL)
    async with FaultProxy(server.host or "127.0.0.1", server.port or 5432) as proxy:
        url = make_url(str(db.url)).set(host="127.0.0.1", port=proxy.port)
        connect_args = {**store.options["connect_args"], "ssl": False}  # plaintext: the proxy reads it
        through = Database(url, **{**store.options, "connect_args": connect_args})
        try:
            yield through, proxy
        finally:
            await through.dispose()


async def stored(store: Store, chat: uuid.UUID) -> tuple[list[tuple[Any, ...]], int]:
    """The session's messages `(id, seq, content)` and its counter, read around memorm and the proxy."""
    admin = await asyncpg.connect(asyncpg_dsn(), server_settings={"search_path": f"{store.schema},public"})
    try:
        found = await admin.fetch(
            "SELECT id, seq, content FROM messages WHERE session_id = $1 ORDER BY seq", chat
        )
        counter = await admin.fetchval("SELECT next_seq FROM sessions WHERE id = $1", chat)
        return [tuple(row) for row in found], int(counter)
    finally:
        await admin.close()


@POSTGRES
@pytest.mark.parametrize("size", [1, 3], ids=["one", "batch"])
async def test_an_append_whose_commit_answer_is_lost_is_committed_and_its_retry_stores_no_second_copy(
    proxied: tuple[Database, FaultProxy], store: Store, size: int
) -> None:
    db, proxy = proxied
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("sam")
        chat = (await uow.sessions.create(agent.id)).id
    # The server gives each message its id up front (a Message carries one), and keeps them.
    messages = [
        Message(role="user", content="what tea?"),
        {"id": uuid.uuid4(), "role": "assistant", "content": "Oolong.", "meta": {"step": 1}},
        Message(role="user", content="thanks", name="ada"),
    ][:size]

    proxy.drop_after_commit()
    with pytest.raises(MemormError) as lost:
        async with db.unit_of_work() as uow:
            await uow.messages.append(chat, copy.deepcopy(messages))
    assert isinstance(lost.value, DatabaseError)
    await proxy.wait_dropped()
    # The caller saw an error, yet the server committed the append.
    first, counter = await stored(store, chat)
    assert [seq for _, seq, _ in first] == list(range(1, size + 1))
    assert counter == size + 1

    # The retry, on the same Database: the stored messages come back, nothing is written.
    async with db.unit_of_work() as uow:
        again = await uow.messages.append(chat, copy.deepcopy(messages))
    assert [(m.id, m.seq, m.content) for m in again] == first
    assert await stored(store, chat) == (first, size + 1)

    # The same ids with other content are a conflict, not a second copy.
    changed = copy.deepcopy(messages)
    changed[-1] = {"id": again[-1].id, "role": again[-1].role, "content": "something else"}
    with pytest.raises(ConflictError, match=r"is stored with another content$"):
        async with db.unit_of_work() as uow:
            await uow.messages.append(chat, changed)
    assert await stored(store, chat) == (first, size + 1)
    assert proxy.dropped == 1
