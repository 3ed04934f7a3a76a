"""`memorm demo`: a tour of what memorm stores and answers, on the SQLite default.

Idempotent: each run adds a session ("demo run N") to the same agent, and the
archival facts are stored once; output that spans sessions says which
session each line comes from.  Needs no network: embeddings come from
[`HashingEmbedder`][memorm.embeddings.HashingEmbedder], a word-hashing stand-in for an
embedding model, so the archival queries share words with the facts they
should find.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime, timezone

from memorm.db import Database
from memorm.embeddings import HashingEmbedder
from memorm.models import Message
from memorm.uow import UnitOfWork

__all__ = ["run_demo"]

CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
SCRIPT: list[dict[str, object]] = [
    {"role": "system", "content": "You are Sam, a concise assistant with a long memory."},
    {"role": "user", "content": "Hi Sam, I'm Ada. What's the weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},  # as OpenAI sends it
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
    "Ada likes cycling along the Seine on Sunday mornings.",
    "Ada's favourite tea is genmaicha, a green tea with roasted rice.",
    "Ada works as a structural engineer in Lyon.",
    "Ada is planning a cycling trip to the Alps in June.",
]
# Each query shares words with the facts it should find: words are all the stand-in embedder sees.
QUERIES = ["cycling trip", "favourite tea"]
EMBEDDER_NOTE = """\
  These scores come from memorm's HashingEmbedder, a stand-in for an
  embedding model: it hashes each text's words (and word pairs) into {dim}
  numbers, with no model download and no network. A passage scores by the
  words it shares with the query (none: about 0); meaning plays no part, so
  "work" misses "works" and "outdoors" misses "cycling". Use a real
  embedding model in your application (anything that is a memorm.Embedder)."""
WIDTH = 72


def _title(text: str) -> None:
    print(f"\n── {text} " + "─" * max(0, WIDTH - len(text) - 4))


def _line(message: Message, label: str = "") -> str:
    text = message.content or ""
    if message.tool_calls:
        text = "→ calls " + ", ".join(call["function"]["name"] for call in message.tool_calls)
    head = f"  {label}#{message.seq:<3} {message.role:<9} "
    room = WIDTH - len(head)
    return head + (text if len(text) <= room else text[: room - 3] + "...")


def _print_messages(messages: Iterable[Message], labels: dict[uuid.UUID, str] | None = None) -> None:
    for message in messages:
        print(_line(message, f"{labels[message.session_id]} " if labels else ""))


async def _session_title(uow: UnitOfWork, session_id: uuid.UUID) -> str:
    return (await uow.sessions.get(session_id)).title or str(session_id)


async def run_demo(db: Database) -> None:
    """Upgrade `db`'s schema, hold a scripted chat, store archival facts, and show what memorm answers."""
    embedder = HashingEmbedder(dim=256)
    print(f"memorm demo on {db.url.render_as_string(hide_password=True)} ({db.dialect})")
    await db.upgrade()
    async with db.unit_of_work() as uow:
        agent = await uow.agents.get_by_name("sam") or await uow.agents.create(
            "sam",
            system="You are Sam.",
            core_memory={"persona": "Sam, concise and friendly.", "human": "unknown"},
        )
        run = (await uow.sessions.list(agent.id, limit=1)).total + 1
        chat = await uow.sessions.create(agent.id, title=f"demo run {run}")
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
    print(f"  session '{chat.title}' ({chat.id}): {len(stored)} messages appended,")
    print("  with a tool call and its answer")

    async with db.unit_of_work(read_only=True) as uow:
        context = await uow.messages.context(chat.id, max_tokens=80)
        found = await uow.messages.search(agent.id, "cycling", limit=3)
        titles = {sid: await _session_title(uow, sid) for sid in {m.session_id for m in found.items}}
        today = datetime.now(timezone.utc).date()
        dated = await uow.messages.between(agent.id, today, today, session_id=chat.id, limit=3)
        vectors = await embedder.embed(QUERIES)
        hits = [
            await uow.passages.search(agent.id, vector, k=2, embedding_model=embedder.model)
            for vector in vectors
        ]

    _title("context window under 80 tokens (system pinned, newest that fit)")
    _print_messages(context)
    _title(f"full-text recall search 'cycling': best 3 of {found.total}, all sessions")
    _print_messages(found.items, titles)
    _title(f"date search, today (UTC) in '{chat.title}': {dated.total} messages, first 3")
    _print_messages(dated.items)
    _title("archival similarity search (a stand-in embedder), best 2 each")
    for query, best in zip(QUERIES, hits, strict=True):
        print(f"  query '{query}':")
        for hit in best:
            print(f"    {hit.score:6.3f}  {hit.passage.text}")
    print(EMBEDDER_NOTE.format(dim=embedder.dim))

    async with db.unit_of_work() as uow:
        deleted = await uow.messages.trim(chat.id, keep_last=2)
        kept = await uow.messages.window(chat.id)
    _title(f"trim '{chat.title}' to the newest 2 (system kept): {deleted} deleted")
    _print_messages(kept)

    async with db.unit_of_work(read_only=True) as uow:
        agents = await uow.agents.list(limit=1)
        sessions = await uow.sessions.list(agent.id, limit=1)
        passages = await uow.passages.count(agent.id)
        messages = 0
        for page in range(0, sessions.total, 1000):
            for session in (await uow.sessions.list(agent.id, limit=1000, offset=page)).items:
                messages += await uow.messages.count(session.id)
    _title("rows")
    print(f"  agent {agent.name}: sessions {sessions.total} · messages {messages} · passages {passages}")
    print(f"  agents in the database: {agents.total}")
    print("\nRun it again: each run adds a session ('demo run N') to the same agent,")
    print("and recall search finds the earlier runs' messages too.")
