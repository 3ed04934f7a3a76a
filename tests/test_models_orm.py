"""memorm's row objects are SQLModel tables: the ORM's state is made on demand and works as usual."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import postgresql
from sqlmodel import select

from memorm import Database
from memorm.models import Agent, AgentName, ArchivalPassage, Message, Session, hydrate, hydrate_all
from memorm.types import VectorType

pytestmark = pytest.mark.anyio

STATE = "_sa_instance_state"


@pytest.fixture
def init_calls() -> Iterator[list[dict[str, Any]]]:
    """The keyword arguments each `Message()` hands the ORM's `init` event, while this test listens."""
    calls: list[dict[str, Any]] = []

    def listener(target: Any, args: Any, kwargs: dict[str, Any]) -> None:
        kwargs.setdefault("name", "from-listener")  # a listener may change the arguments
        calls.append(dict(kwargs))

    event.listen(Message, "init", listener)
    try:
        yield calls
    finally:
        event.remove(Message, "init", listener)


@pytest.mark.parametrize("model", [Agent, Session, Message, ArchivalPassage])
def test_a_new_row_makes_its_orm_state_when_the_orm_first_asks(model: type[Any]) -> None:
    row = model()
    assert STATE not in vars(row)
    state = sa.inspect(row)
    assert state.transient
    assert state.object is row
    assert vars(row)[STATE] is state  # stored: the next ask finds the same state
    assert sa.inspect(row) is state


@pytest.mark.parametrize("model", [Agent, Session, Message, ArchivalPassage])
def test_calling_a_table_builds_the_row_its_init_builds(model: type[Any]) -> None:
    """The one-call constructor (`_RowType.__call__`) and `__init__` make the same row."""
    given = {"meta": {"k": [1]}, "not_a_field": 1}  # names that are not fields are ignored, as SQLModel does
    called = model(**given)
    initialised = model.__new__(model)
    initialised.__init__(**given)
    assert called.__pydantic_fields_set__ == initialised.__pydantic_fields_set__ == {"meta"}
    assert called.__pydantic_extra__ is None
    assert called.__pydantic_private__ is None
    assert called.model_dump().keys() == initialised.model_dump().keys() == model.model_fields.keys()
    assert called.meta is given["meta"]
    assert called.id != initialised.id
    assert called.id.version == 7
    assert called.created_at.tzinfo is not None
    assert not hasattr(called, "not_a_field")
    fresh = [model() for _ in range(3)]
    assert all(row.meta == {} for row in fresh)
    assert len({id(row.meta) for row in fresh}) == 3
    with pytest.raises(TypeError):
        model({"meta": {}})  # pydantic's rule: keyword arguments only


def test_a_hydrated_row_makes_its_state_on_demand_and_a_copy_gets_its_own() -> None:
    message = hydrate(Message, {"role": "user", "content": "hi", "meta": {}})
    assert STATE not in vars(message)
    twin = copy.copy(message)
    assert sa.inspect(twin).object is twin
    assert sa.inspect(message).object is message
    assert sa.inspect(twin) is not sa.inspect(message)


def test_hydrate_all_builds_what_hydrate_builds_row_by_row() -> None:
    names = ("role", "content", "meta")
    rows = [("extra", "user", "hi", {"n": 1}), ("extra", "assistant", "yo", {})]
    built = hydrate_all(Message, names, rows, offset=1)
    assert [m.model_dump(include=set(names)) for m in built] == [
        hydrate(Message, dict(zip(names, row[1:], strict=True))).model_dump(include=set(names))
        for row in rows
    ]
    assert built[0].meta is rows[0][3]
    assert STATE not in vars(built[0])  # state on demand, as hydrate's
    assert sa.inspect(built[1]).object is built[1]
    assert built[0].__pydantic_fields_set__ == set()
    assert built[0].__pydantic_fields_set__ is not built[1].__pydantic_fields_set__
    (name,) = hydrate_all(
        AgentName, ("name", "agent_id"), [("n", built[0].id)]
    )  # not a memorm row: state now
    assert vars(name)[STATE].object is name
    with pytest.raises(ValueError, match="zip"):  # a row of the wrong width is a bug, not a short row
        hydrate_all(Message, names, [("user", "hi")])


def test_other_tables_keep_the_orms_own_constructor() -> None:
    name = AgentName(name="n", agent_id=Message().id)
    assert vars(name)[STATE].object is name


def test_the_orms_init_event_reaches_its_listeners_and_may_change_the_arguments(
    init_calls: list[dict[str, Any]],
) -> None:
    message = Message(role="user", content="hi")
    assert init_calls == [{"role": "user", "content": "hi", "name": "from-listener"}]
    assert message.name == "from-listener"
    assert vars(message)[STATE] is sa.inspect(message)  # the state came first, as the ORM makes it


async def test_appended_messages_work_with_the_orm_session_of_the_unit_of_work(db: Database) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("orm")
        chat = await uow.sessions.create(agent.id)
        given = [{"role": "user", "content": "one", "meta": {"k": 1}}, Message(role="assistant", content="2")]
        appended = await uow.messages.append(chat.id, given)
        assert all(STATE not in vars(message) for message in appended)
        # An object the ORM adds itself, numbered by hand, beside memorm's appends.
        uow.session.add(Message(session_id=chat.id, agent_id=agent.id, seq=100, role="user", content="three"))
        await uow.session.flush()
        merged = await uow.session.merge(appended[0])  # memorm's row, known to the ORM by its key
        merged.content = "one, edited"
        await uow.session.flush()
    async with db.unit_of_work(read_only=True) as uow:
        window = await uow.messages.window(chat.id)
        assert [(m.seq, m.content, m.meta) for m in window] == [
            (1, "one, edited", {"k": 1}),
            (2, "2", {}),
            (100, "three", {}),
        ]
        assert sa.inspect(window[0]).transient  # read by memorm: not in the ORM's session
        loaded = (await uow.session.scalars(select(Message).where(Message.session_id == chat.id))).all()
        assert sorted(m.content for m in loaded) == ["2", "one, edited", "three"]
        assert all(sa.inspect(m).persistent for m in loaded)


async def test_passages_loaded_by_the_orm_carry_their_embeddings_as_lists(db: Database) -> None:
    vectors = [[0.5, -1.25, 2.0], [0.0, 0.25, 1.0]]
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("vectors")
        added = await uow.passages.add_many(agent.id, [{"text": str(v), "embedding": v} for v in vectors])
        loaded = (
            await uow.session.scalars(select(ArchivalPassage).where(ArchivalPassage.agent_id == agent.id))
        ).all()
    by_id = {passage.id: passage.embedding for passage in loaded}
    assert [by_id[passage.id] for passage in added] == vectors
    assert all(type(embedding) is list for embedding in by_id.values())


@pytest.mark.parametrize(("text", "values"), [("[1,2.5,-3e-05]", [1.0, 2.5, -3e-05]), ("[]", [])])
def test_a_postgres_vector_read_as_text_becomes_a_list(text: str, values: list[float]) -> None:
    """Without pgvector's binary codec on the connection, asyncpg hands over the text form."""
    process = VectorType().result_processor(postgresql.dialect(), None)
    assert process is not None
    assert process(text) == values
    assert process(None) is None
