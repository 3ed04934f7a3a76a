"""Retried appends (issue 27): the same messages again are a no-op, different ones a conflict.

A server whose commit acknowledgement was lost retries the append with the
same message ids.  When the batch is stored as sent, the retry returns the
stored messages (their seq and timestamps) and writes nothing: no row, no
sequence number, not even the session's `updated_at`.  When an id is stored
with other content, in another session, or only part of the batch is, the
retry raises `ConflictError` before anything is written, and a caller that
catches it and commits leaves the database as it was.  The lost
acknowledgement itself is made by a proxy in
`tests/reliability/test_lost_commit.py`.
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from conftest import ENGINES, Store, app_role
from hypothesis import given
from hypothesis import strategies as st

from memorm import ConflictError, Database, DatabaseError, Message, NotFoundError, ValidationError

pytestmark = pytest.mark.anyio

POSTGRES = pytest.mark.parametrize("engine", [ENGINES[1]], indirect=True)
CALL = [{"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "tea"}'}}]


async def new_chat(db: Database, agent: uuid.UUID | None = None) -> tuple[uuid.UUID, uuid.UUID]:
    async with db.unit_of_work() as uow:
        if agent is None:
            agent = (await uow.agents.create(f"sam-{uuid.uuid4().hex[:8]}")).id
        return agent, (await uow.sessions.create(agent)).id


async def rows(db: Database) -> list[tuple[Any, ...]]:
    """Every row of the messages and sessions tables, every column, read with raw SQL."""
    async with db.unit_of_work(read_only=True) as uow:
        found = []
        for query in (
            "SELECT * FROM messages ORDER BY session_id, seq",
            "SELECT * FROM sessions ORDER BY id",
        ):
            found += [tuple(row) for row in await uow.session.execute(sa.text(query))]
        return found


def batch(size: int) -> list[dict[str, Any]]:
    """A batch with caller-chosen ids: text, a name, a tool call and its answer, meta, a token count."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "what tea?", "name": "ada", "meta": {"n": 1, "f": 1.5, "ok": True}},
        {"role": "assistant", "content": None, "tool_calls": CALL, "meta": {"tags": ["a", "b"]}},
        {"role": "tool", "content": "oolong", "tool_call_id": "call_1", "name": "lookup", "token_count": 9},
        {"role": "assistant", "content": "Oolong."},
    ][:size]
    return [{"id": uuid.uuid4(), **message} for message in messages]


def as_models(messages: list[dict[str, Any]]) -> list[Message]:
    """The same messages as `Message` objects, built anew (a new `created_at` each)."""
    return [Message(**copy.deepcopy(message)) for message in messages]


@pytest.mark.parametrize("size", [1, 4], ids=["one", "batch"])
@pytest.mark.parametrize("shape", ["dicts", "models"])
async def test_a_retried_append_of_stored_messages_writes_nothing_and_returns_them_as_stored(
    db: Database, size: int, shape: str
) -> None:
    agent, chat = await new_chat(db)
    sent = batch(size)
    async with db.unit_of_work() as uow:
        first = await uow.messages.append(chat, copy.deepcopy(sent))
    before = await rows(db)
    await anyio.sleep(0.01)  # a retry that wrote anything would stamp a later time
    retry: list[Any] = copy.deepcopy(sent) if shape == "dicts" else as_models(sent)
    async with db.unit_of_work() as uow:
        again = await uow.messages.append(chat, retry)
    assert await rows(db) == before
    assert [m.model_dump() for m in again] == [m.model_dump() for m in first]  # seq, timestamps as stored
    assert [(m.seq, m.session_id, m.agent_id) for m in again] == [
        (n, chat, agent) for n in range(1, size + 1)
    ]
    if shape == "models":
        assert all(got is given for got, given in zip(again, retry, strict=True))  # filled in, as appends do
    async with db.unit_of_work() as uow:  # the numbering goes on where the first append left it
        (after,) = await uow.messages.append(chat, {"role": "user", "content": "next"})
    assert after.seq == size + 1


async def test_concurrent_appenders_retrying_their_messages_store_each_once_without_gaps(
    db: Database,
) -> None:
    _, chat = await new_chat(db)
    seqs: dict[int, list[int]] = {}

    async def appender(task: int) -> None:
        turn = [Message(role="user", content=f"{task}")] if task % 2 else batch(2)
        for _ in range(2):  # the second time, as after a lost acknowledgement
            async with db.unit_of_work() as uow:
                stored = await uow.messages.append(chat, turn)
            seqs.setdefault(task, []).append(stored[-1].seq)

    async with anyio.create_task_group() as tasks:
        for task in range(20):
            tasks.start_soon(appender, task)
    assert all(first == again for first, again in seqs.values())  # the retry got the stored seq
    async with db.unit_of_work() as uow:
        log = await uow.messages.window(chat, limit=100)
        assert (await uow.sessions.get(chat)).next_seq == 31
    assert [m.seq for m in log] == list(range(1, 31))  # 10 single messages, 10 pairs: once each


async def test_a_retry_in_the_same_unit_of_work_returns_the_messages_it_appended(db: Database) -> None:
    _, chat = await new_chat(db)
    sent = batch(3)
    async with db.unit_of_work() as uow:
        first = await uow.messages.append(chat, copy.deepcopy(sent))
        again = await uow.messages.append(chat, copy.deepcopy(sent))
        assert [m.seq for m in again] == [m.seq for m in first] == [1, 2, 3]
    async with db.unit_of_work() as uow:
        assert await uow.messages.count(chat) == 3
        assert (await uow.sessions.get(chat)).next_seq == 4


async def test_a_retry_without_a_token_count_keeps_the_stored_estimate(db: Database) -> None:
    _, chat = await new_chat(db)
    message = {"id": uuid.uuid4(), "role": "user", "content": "x" * 400}
    async with db.unit_of_work() as uow:
        (first,) = await uow.messages.append(chat, dict(message))
    async with db.unit_of_work() as uow:
        # A counter that changed since (a new tokenizer) does not make the retry a conflict.
        uow.messages.token_counter = lambda row: 1
        (again,) = await uow.messages.append(chat, dict(message))
    assert again.token_count == first.token_count != 1
    async with db.unit_of_work() as uow:
        (same,) = await uow.messages.append(chat, {**message, "token_count": first.token_count})
    assert same.seq == 1


CHANGES: dict[str, Any] = {
    "content": lambda m: {**m, "content": "green tea?"},
    "role": lambda m: {**m, "role": "assistant"},
    "name": lambda m: {**m, "name": "bob"},
    "no name": lambda m: {**m, "name": None},
    "meta": lambda m: {**m, "meta": {**m["meta"], "n": 2}},
    "meta type": lambda m: {**m, "meta": {**m["meta"], "n": True}},  # Python's == would say equal
    "meta key": lambda m: {**m, "meta": {**m["meta"], "extra": None}},
    "token count": lambda m: {**m, "token_count": 123},
}


@pytest.mark.parametrize("change", CHANGES)
async def test_a_retry_with_other_content_under_a_stored_id_raises_conflict_and_writes_nothing(
    db: Database, change: str
) -> None:
    _, chat = await new_chat(db)
    sent = batch(4)
    async with db.unit_of_work() as uow:
        await uow.messages.append(chat, copy.deepcopy(sent))
    before = await rows(db)
    changed = [CHANGES[change](sent[0]), *copy.deepcopy(sent[1:])]
    # Caught and committed: nothing of the append stays (no row, no sequence number).
    async with db.unit_of_work() as uow:
        with pytest.raises(ConflictError) as caught:
            await uow.messages.append(chat, changed)
    assert str(caught.value).startswith(
        f"messages[0]: a message with id {sent[0]['id']} is stored with another"
    )
    assert await rows(db) == before


@pytest.mark.parametrize("change", ["tool_calls", "tool_call_id"])
async def test_a_retry_with_another_tool_call_raises_conflict(db: Database, change: str) -> None:
    _, chat = await new_chat(db)
    sent = batch(3)
    async with db.unit_of_work() as uow:
        await uow.messages.append(chat, copy.deepcopy(sent))
    changed = copy.deepcopy(sent)
    if change == "tool_calls":
        changed[1]["tool_calls"][0]["function"]["arguments"] = '{"q": "coffee"}'
    else:
        changed[2]["tool_call_id"] = "call_2"
    with pytest.raises(ConflictError, match=f"is stored with another {change}$"):
        async with db.unit_of_work() as uow:
            await uow.messages.append(chat, changed)


async def test_a_partly_stored_or_reordered_batch_raises_conflict_and_the_unit_of_work_goes_on(
    db: Database,
) -> None:
    _, chat = await new_chat(db)
    sent = batch(3)
    async with db.unit_of_work() as uow:
        await uow.messages.append(chat, copy.deepcopy(sent[:2]))
    before = await rows(db)
    async with db.unit_of_work() as uow:
        with pytest.raises(ConflictError, match=r"^messages\[2\]: .* is not stored, but messages\[0\] is"):
            await uow.messages.append(chat, copy.deepcopy(sent))  # one more than was stored
        with pytest.raises(ConflictError, match=r"^messages\[0\]: .* is not stored, but messages\[1\] is"):
            await uow.messages.append(chat, [{"role": "user", "content": "new"}, copy.deepcopy(sent[1])])
        with pytest.raises(ConflictError, match="stored in another order"):
            await uow.messages.append(chat, copy.deepcopy(sent[1::-1]))
    assert await rows(db) == before
    async with db.unit_of_work() as uow:  # carrying on after the conflicts: no gap
        await uow.messages.append(chat, {"role": "user", "content": "hi"})
        with pytest.raises(ConflictError):
            await uow.messages.append(chat, copy.deepcopy(sent))
        (later,) = await uow.messages.append(chat, {"role": "user", "content": "later"})
    assert later.seq == 4


async def test_an_id_stored_in_another_session_of_the_agent_raises_conflict(db: Database) -> None:
    agent, chat = await new_chat(db)
    _, other = await new_chat(db, agent)
    sent = batch(1)
    async with db.unit_of_work() as uow:
        await uow.messages.append(chat, copy.deepcopy(sent))
    before = await rows(db)
    with pytest.raises(ConflictError, match=r"is stored in another session$"):
        async with db.unit_of_work() as uow:
            await uow.messages.append(other, copy.deepcopy(sent))
    for missing in (copy.deepcopy(sent), batch(3), Message(role="user")):  # no session: as before
        with pytest.raises(NotFoundError):
            async with db.unit_of_work() as uow:
                await uow.messages.append(uuid.uuid4(), missing)
    assert await rows(db) == before


@pytest.mark.parametrize("size", [1, 2], ids=["one", "batch"])
async def test_an_id_another_agents_message_has_raises_conflict_and_writes_nothing(
    db: Database, size: int
) -> None:
    # An id names one message of the tenant, whichever agent holds it (issue 28).
    _, chat = await new_chat(db)
    _, other = await new_chat(db)
    sent = batch(size)
    async with db.unit_of_work() as uow:
        await uow.messages.append(chat, copy.deepcopy(sent))
    before = await rows(db)
    async with db.unit_of_work() as uow:  # caught: the unit of work goes on
        with pytest.raises(
            ConflictError, match=r"^messages\[0\]: a message with id .* is stored in another session$"
        ):
            await uow.messages.append(other, copy.deepcopy(sent))
        with pytest.raises(ConflictError, match=r"^messages\[1\]: .* is stored in another session$"):
            await uow.messages.append(other, [{"role": "user", "content": "new"}, copy.deepcopy(sent[-1])])
    assert await rows(db) == before
    async with db.unit_of_work() as uow:
        (fresh,) = await uow.messages.append(other, {"role": "user", "content": "hi"})
        assert fresh.seq == 1  # the refused appends took no number
        assert (await uow.messages.get(sent[0]["id"])).session_id == chat


async def test_a_batch_repeating_an_id_is_refused_before_anything_is_written(db: Database) -> None:
    _, chat = await new_chat(db)
    before = await rows(db)
    message_id = uuid.uuid4()
    with pytest.raises(
        ValidationError, match=rf"^messages\[2\]\.id: {message_id} is messages\[0\]'s id too$"
    ):
        async with db.unit_of_work() as uow:
            await uow.messages.append(
                chat,
                [
                    {"id": message_id, "role": "user"},
                    {"role": "user"},
                    Message(id=message_id, role="assistant"),
                ],
            )
    assert await rows(db) == before


async def test_a_batch_of_more_ids_than_the_counter_checks_is_read_first(db: Database) -> None:
    _, chat = await new_chat(db)
    sent = [{"id": uuid.uuid4(), "role": "user", "content": f"m{n}"} for n in range(300)]
    async with db.unit_of_work() as uow:
        await uow.messages.append(chat, copy.deepcopy(sent))
    before = await rows(db)
    async with db.unit_of_work() as uow:
        again = await uow.messages.append(chat, copy.deepcopy(sent))
    assert [m.seq for m in again] == list(range(1, 301))
    changed = copy.deepcopy(sent)
    changed[299]["content"] = "other"
    with pytest.raises(ConflictError, match=r"^messages\[299\]: .* is stored with another content$"):
        async with db.unit_of_work() as uow:
            await uow.messages.append(chat, changed)
    assert await rows(db) == before


MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant", "tool"]),
        "content": st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20),
        "name": st.none() | st.sampled_from(["ada", "bob"]),
        "meta": st.dictionaries(
            st.sampled_from(["a", "b"]), st.none() | st.booleans() | st.integers(-2, 2) | st.floats(-2, 2)
        ),
    }
)
FIELD = st.sampled_from(["role", "content", "name", "meta"])


@given(sent=st.lists(MESSAGE, min_size=1, max_size=4), changes=st.lists(st.tuples(st.integers(0, 3), FIELD)))
async def test_a_retry_is_a_no_op_exactly_when_every_message_is_the_same(
    db: Database, sent: list[dict[str, Any]], changes: list[tuple[int, str]]
) -> None:
    _, chat = await new_chat(db)
    sent = [{"id": uuid.uuid4(), **message} for message in sent]
    async with db.unit_of_work() as uow:
        first = await uow.messages.append(chat, copy.deepcopy(sent))
    before = await rows(db)
    retry = copy.deepcopy(sent)
    for index, field in changes:
        message = retry[index % len(retry)]
        message[field] = {
            "role": "system",
            "content": message["content"] + "!",
            "name": None if message["name"] else "eve",
            "meta": {**message["meta"], "c": 1},
        }[field]
    same = retry == sent and all(  # 1, 1.0 and True are equal to Python: not to the check
        [type(value) for value in a["meta"].values()] == [type(value) for value in b["meta"].values()]
        for a, b in zip(retry, sent, strict=True)
    )
    async with db.unit_of_work() as uow:
        if same:
            again = await uow.messages.append(chat, retry)
            assert [m.model_dump() for m in again] == [m.model_dump() for m in first]
        else:
            with pytest.raises(ConflictError):
                await uow.messages.append(chat, retry)
    assert await rows(db) == before


@POSTGRES
async def test_retries_under_row_level_security_are_no_ops_or_conflicts(store: Store) -> None:
    async with app_role(store) as (_, app, _):
        _, chat = await new_chat(app)
        sent = batch(2)
        async with app.unit_of_work() as uow:
            await uow.messages.append(chat, copy.deepcopy(sent))
            await uow.messages.append(chat, copy.deepcopy(sent[:1]))  # the one-statement path too
        _, elsewhere = await new_chat(app.for_tenant("other"))
        async with app.unit_of_work("other") as uow:  # another tenant's ids never meet these
            await uow.messages.append(elsewhere, copy.deepcopy(sent))
        before = await rows(app)
        async with app.unit_of_work() as uow:
            again = await uow.messages.append(chat, copy.deepcopy(sent))
            assert [m.seq for m in again] == [1, 2]
            (alone,) = await uow.messages.append(chat, copy.deepcopy(sent[0]))
            assert alone.seq == 1
            with pytest.raises(ConflictError):
                await uow.messages.append(chat, {**sent[1], "content": "changed"})
        assert await rows(app) == before


@POSTGRES
@pytest.mark.parametrize("size", [1, 2], ids=["one", "batch"])
async def test_a_retry_racing_the_first_attempt_finds_it_stored_or_fails_to_be_retried(
    db: Database, size: int
) -> None:
    # The first attempt holds the session's row until it commits; the retry waits for it.
    # One message (one statement, the session locked before the INSERT checks its key)
    # then finds it stored; a batch's check (made before the wait) cannot see it, and the
    # INSERT that meets it fails the retry with DatabaseError, to be retried again.  So
    # does one message on Citus, where it is appended as a batch is; there the retry's check
    # goes through the coordinator to a worker and may come after the first attempt
    # committed, and then it finds the messages stored as a later retry would.
    _, chat = await new_chat(db)
    sent = batch(size)
    appended = anyio.Event()
    outcome: list[Any] = []

    async def retry() -> None:
        await appended.wait()
        try:
            async with db.unit_of_work() as uow:
                outcome.append(await uow.messages.append(chat, copy.deepcopy(sent)))
        except DatabaseError as error:
            outcome.append(error)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(retry)
        async with db.unit_of_work() as uow:
            first = await uow.messages.append(chat, copy.deepcopy(sent))
            appended.set()
            await anyio.sleep(1 if db.distributed else 0.3)  # the retry waits for the lock
    (result,) = outcome
    if (size == 1 and not db.distributed) or (db.distributed and isinstance(result, list)):
        assert [m.model_dump() for m in result] == [m.model_dump() for m in first]
    else:
        assert isinstance(result, DatabaseError)
        assert "stored by another unit of work meanwhile" in str(result)
        async with db.unit_of_work() as uow:
            again = await uow.messages.append(chat, copy.deepcopy(sent))
        assert [m.seq for m in again] == list(range(1, size + 1))
    async with db.unit_of_work() as uow:
        assert (await uow.sessions.get(chat)).next_seq == size + 1
        assert await uow.messages.count(chat) == size
