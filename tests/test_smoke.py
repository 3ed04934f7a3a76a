import pytest

from memorm import Database, Message

pytestmark = pytest.mark.anyio


async def test_append_then_window_returns_messages_in_order(db: Database) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("sam")
        chat = await uow.sessions.create(agent.id)
        await uow.messages.append(
            chat.id, [Message(role="user", content="hi"), {"role": "assistant", "content": "yo"}]
        )
    async with db.unit_of_work() as uow:
        window = await uow.messages.window(chat.id)
    assert [(m.seq, m.content) for m in window] == [(1, "hi"), (2, "yo")]
