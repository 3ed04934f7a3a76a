"""``memorm demo``: a tour of what memorm stores and answers, on the SQLite default.

Idempotent: each run adds a new session to the same agent; nothing fails on
an earlier run's data.  Needs no network: embeddings come from
:class:`~memorm.embeddings.HashingEmbedder`.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timezone

from memorm.db import Database
from memorm.embeddings import HashingEmbedder
from memorm.models import Message

__all__ = ["run_demo"]

CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
SCRIPT: list[dict[str, object]] = [
    {"role": "system", "content": "You are Sam, a concise assistant with a long memory."},
    {"role": "user", "content": "Hi Sam, I'm Ada. What's the weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {
        "role": "tool",
        "content": '{"temp_c": 18, "sky": "clear"}',
        "tool_call_id": "call_1",
        "name": "get_weather",
    },
    {"role": "assistant", "content": "It's 18 °C and clear in Paris, Ada."},
    {"role": "user", "content": "Great. Remember that I like cycling along the Seine."},
    {"role": "assistant", "content": "Noted: you like cycling along the Seine."},
    {"role": "user", "content": "What should I pack for a cycling trip?"},
    {"role": "assistant", "content": "A light rain jacket, a repair kit, water, and sunscreen."},
]
FACTS = [
    "Ada likes cycling along the Seine.",
    "Ada's favourite tea is genmaicha.",
    "Ada works as a structural engineer in Lyon.",
    "Ada is planning a cycling trip to the Alps in June.",
]
WIDTH = 72


def _title(text: str) -> None:
    print(f"\n── {text} " + "─" * max(0, WIDTH - len(text) - 4))


def _line(message: Message) -> str:
    text = message.content
    if message.tool_calls:
        text = "→ calls " + ", ".join(call["function"]["name"] for call in message.tool_calls)
    text = text if len(text) <= WIDTH - 22 else text[: WIDTH - 25] + "..."
    return f"  #{message.seq:<3} {message.role:<9} {text}"


def _print_messages(messages: Iterable[Message]) -> None:
    for message in messages:
        print(_line(message))


async def run_demo(db: Database) -> None:
    """Upgrade ``db``'s schema, hold a scripted chat, store archival facts, and show what memorm answers."""
    embedder = HashingEmbedder(dim=256)
    print(f"memorm demo on {db.url.render_as_string(hide_password=True)} ({db.dialect})")
    await db.upgrade()
    async with db.unit_of_work() as uow:
        agent = await uow.agents.get_by_name("sam") or await uow.agents.create(
            "sam",
            system="You are Sam.",
            core_memory={"persona": "Sam, concise and friendly.", "human": "unknown"},
        )
        chat = await uow.sessions.create(
            agent.id, title=f"demo {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S}"
        )
        stored = await uow.messages.append(chat.id, SCRIPT)
        agent = await uow.agents.update_core_memory(agent.id, "human", "Ada; likes cycling")
        if await uow.passages.count(agent.id, embedding_model=embedder.model) == 0:
            vectors = await embedder.embed(FACTS)
            await uow.passages.add_many(
                agent.id,
                [
                    {"text": fact, "embedding": vector, "embedding_model": embedder.model}
                    for fact, vector in zip(FACTS, vectors, strict=True)
                ],
            )

    _title(f"agent {agent.name}, version {agent.version}")
    for label, text in agent.core_memory.items():
        print(f"  core memory [{label}]: {text}")
    print(f"  session {chat.id}: {len(stored)} messages appended, with a tool call and its answer")

    async with db.unit_of_work(read_only=True) as uow:
        context = await uow.messages.context(chat.id, max_tokens=80)
        found = await uow.messages.search(agent.id, "cycling", limit=3)
        today = datetime.now(timezone.utc).date()
        dated = await uow.messages.between(agent.id, today, today, session_id=chat.id, limit=3)
        [query] = await embedder.embed(["what does Ada enjoy doing outdoors"])
        hits = await uow.passages.search(agent.id, query, k=3, embedding_model=embedder.model)

    _title("context window under 80 tokens (system pinned, newest that fit)")
    _print_messages(context)
    _title(f"full-text recall search 'cycling': {found.total} matches in all sessions")
    _print_messages(found.items)
    _title(f"date search, today (UTC) in this session: {dated.total} messages, first 3")
    _print_messages(dated.items)
    _title("archival similarity search: 'what does Ada enjoy doing outdoors'")
    for hit in hits:
        print(f"  {hit.score:6.3f}  {hit.passage.text}")

    async with db.unit_of_work() as uow:
        deleted = await uow.messages.trim(chat.id, keep_last=2)
        kept = await uow.messages.window(chat.id)
    _title(f"trim to the newest 2 (system kept): {deleted} deleted")
    _print_messages(kept)

    async with db.unit_of_work(read_only=True) as uow:
        sessions = await uow.sessions.list(agent.id, limit=1)
        passages = await uow.passages.count(agent.id)
        messages = 0
        for page in range(0, sessions.total, 1000):
            for session in (await uow.sessions.list(agent.id, limit=1000, offset=page)).items:
                messages += await uow.messages.count(session.id)
    _title("rows")
    print(f"  agents 1 · sessions {sessions.total} · messages {messages} · passages {passages}")
    print("\nRun it again: each run adds a session to the same agent.")
