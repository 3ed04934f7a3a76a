"""``memorm demo``: an agent, a conversation with a tool call, and what memorm stores."""

from __future__ import annotations

from memorm.db import Database
from memorm.models import Message

__all__ = ["run_demo"]

_SCRIPT: list[dict[str, object]] = [
    {"role": "system", "content": "You are Sam, a concise assistant with a long memory."},
    {"role": "user", "content": "Hi Sam, I'm Ada. What's the weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {
        "role": "tool",
        "content": '{"temp_c": 18, "sky": "clear"}',
        "tool_call_id": "call_1",
        "name": "get_weather",
    },
    {"role": "assistant", "content": "It's 18 °C and clear in Paris, Ada."},
    {"role": "user", "content": "Great, remember that I like cycling."},
    {"role": "assistant", "content": "Noted: you like cycling."},
]


async def run_demo(url: str | None = None) -> None:
    """Upgrade the schema, hold a scripted chat, and print what was stored."""
    async with Database(url) as db:
        print(f"database: {db.url.render_as_string(hide_password=True)}  ({db.dialect})")
        await db.upgrade()
        async with db.unit_of_work() as uow:
            agent = await uow.agents.get_by_name("sam")
            if agent is None:
                agent = await uow.agents.create(
                    "sam",
                    system="You are Sam.",
                    core_memory={"persona": "Sam, concise and friendly.", "human": "unknown"},
                )
            chat = await uow.sessions.create(agent.id, title="demo chat")
            stored = await uow.messages.append(chat.id, [Message(**turn) for turn in _SCRIPT])
            agent = await uow.agents.update_core_memory(agent.id, "human", "Ada; likes cycling")
        print(f"\nagent {agent.name} (version {agent.version})")
        for label, text in agent.core_memory.items():
            print(f"  core memory [{label}]: {text}")
        print(f"\nsession {chat.id}: {len(stored)} messages appended")
        async with db.unit_of_work(read_only=True) as uow:
            window = await uow.messages.window(chat.id, limit=5)
            total = await uow.messages.count(chat.id)
            sessions = await uow.sessions.list(agent.id, limit=1)
        print(f"\nlast {len(window)} of {total} messages:")
        for message in window:
            text = message.content
            if message.tool_calls:
                text = "(calls " + ", ".join(call["function"]["name"] for call in message.tool_calls) + ")"
            print(f"  #{message.seq:<3} {message.role:<9} {text}")
        print(f"\nsam has {sessions.total} session(s) in this database; run the demo again to add one.")
