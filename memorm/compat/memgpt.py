"""MemGPT-style memory classes over one [`Database`][memorm.db.Database].

MemGPT (now Letta) gives an agent three memories: *core* memory in the prompt
(`Agent.core_memory`), *recall* memory — the full conversation log, searched
by text or date — and *archival* memory, embedded passages searched by
similarity.  These classes keep MemGPT's method names and `(results, total)`
return shapes; every call is one unit of work on the shared database, so a
crash leaves either the whole change or none of it.

Results are dicts; `timestamp` is the row's own ISO-8601 UTC time, `total`
the true number of matches (not the page length), and `start` an offset into
a deterministic order, so pages are stable.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from datetime import date
from typing import Any

from memorm.db import Database
from memorm.embeddings import Embedder
from memorm.errors import ValidationError
from memorm.models import ArchivalPassage, Message
from memorm.repositories.message_input import MessageInput, check_batch
from memorm.validation import MAX_COUNT, check_int, check_json_object, check_list, check_text

__all__ = ["ArchivalMemory", "PersistenceManager", "RecallMemory", "chunk_text", "from_openai"]

DEFAULT_PAGE = 10
CHUNK_CHARS = 2000
EMBED_BATCH = 64
CONVERSATION_ROLES = ("user", "assistant", "tool")  # recall search leaves the system prompt out
_OPENAI_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def chunk_text(text: str, *, max_chars: int = CHUNK_CHARS) -> list[str]:
    """Split `text` into chunks of at most `max_chars`, at paragraph, then sentence, then word breaks."""
    chunks: list[str] = []
    for paragraph in (p.strip() for p in text.split("\n\n")):
        pieces = [paragraph] if len(paragraph) <= max_chars else _SENTENCE_END.split(paragraph)
        current = ""
        for piece in pieces:
            while len(piece) > max_chars:  # a sentence longer than a chunk: cut at a word break
                cut = piece.rfind(" ", 0, max_chars)
                cut = cut if cut > 0 else max_chars
                chunks.append(piece[:cut].strip())
                piece = piece[cut:].strip()
            if current and len(current) + 1 + len(piece) > max_chars:
                chunks.append(current)
                current = piece
            else:
                current = f"{current} {piece}".strip()
        if current:
            chunks.append(current)
    return [chunk for chunk in chunks if chunk]


def from_openai(message: MessageInput) -> MessageInput:
    """An OpenAI-style message dict as memorm takes it; fields memorm has no column for go to `meta`."""
    if isinstance(message, Message) or not isinstance(message, Mapping):
        return message
    known = {key: message[key] for key in _OPENAI_FIELDS if key in message}
    if known.get("content", "") is None and known.get("role") != "assistant":
        known["content"] = ""  # None is for assistant messages (that only call tools)
    extra = {key: value for key, value in message.items() if key not in _OPENAI_FIELDS}
    meta = check_json_object(extra.pop("meta", None), "meta")
    if extra:
        meta["openai"] = extra
    return {**known, "meta": meta} if meta else known


def _openai_messages(messages: object) -> list[MessageInput]:
    return [from_openai(m) for m in check_list(messages, "messages", "messages (dicts or Message objects)")]


async def _embed(embedder: Embedder, texts: list[str]) -> list[list[float]]:
    """One vector per text (the vectors themselves are checked where they are stored)."""
    vectors = check_list(await embedder.embed(texts), "embedder", "vectors")
    if len(vectors) != len(texts):
        raise ValidationError(f"embedder: {len(vectors)} vectors for {len(texts)} texts")
    return vectors


def _page(count: int | None, start: int | None) -> tuple[int, int]:
    return (DEFAULT_PAGE if count is None else count), (0 if start is None else start)


def _message_result(message: Message) -> dict[str, Any]:
    return {
        "id": str(message.id),
        "role": message.role,
        "content": message.content,
        "name": message.name,
        "tool_calls": message.tool_calls,
        "tool_call_id": message.tool_call_id,
        "session_id": str(message.session_id),
        "timestamp": message.created_at.isoformat(),
    }


def _passage_result(passage: ArchivalPassage, score: float | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {
        "id": str(passage.id),
        "content": passage.text,
        "timestamp": passage.created_at.isoformat(),
        "meta": passage.meta,
    }
    if score is not None:
        result["score"] = score
    return result


def _as_date(value: str | date, field: str) -> date:
    if isinstance(value, date):
        return value
    try:
        return date.fromisoformat(value)
    except (TypeError, ValueError):
        raise ValidationError(f"{field}: expected a date as YYYY-MM-DD, got {value!r}") from None


class ArchivalMemory:
    """An agent's archival memory: text chunked, embedded in batches, searched by similarity."""

    def __init__(self, db: Database, agent_id: uuid.UUID | str, embedder: Embedder) -> None:
        self.db = db
        self.agent_id = agent_id
        self.embedder = embedder

    async def insert(self, text: str, *, meta: Mapping[str, Any] | None = None) -> list[uuid.UUID]:
        """Store `text` (chunked if long); returns the new passages' ids."""
        chunks = chunk_text(check_text(text, "text") or "")
        tags = check_json_object(meta, "meta")
        vectors: list[list[float]] = []
        for first in range(0, len(chunks), EMBED_BATCH):
            vectors += await _embed(self.embedder, chunks[first : first + EMBED_BATCH])
        items = [
            {
                "text": chunk,
                "embedding": vector,
                "embedding_model": self.embedder.model,
                "meta": dict(tags),
            }
            for chunk, vector in zip(chunks, vectors, strict=True)
        ]
        async with self.db.unit_of_work() as uow:
            stored = await uow.passages.add_many(self.agent_id, items)
        return [passage.id for passage in stored]

    async def search(
        self, query: str, count: int | None = None, start: int | None = None
    ) -> tuple[list[dict[str, Any]], int]:
        """Passages most similar to `query`: one page of results, and the number of passages ranked."""
        limit, offset = _page(count, start)
        [vector] = await _embed(self.embedder, [check_text(query, "query") or ""])
        async with self.db.unit_of_work(read_only=True) as uow:
            hits = await uow.passages.search(
                self.agent_id, vector, k=limit, offset=offset, embedding_model=self.embedder.model
            )
            total = await uow.passages.count(self.agent_id, embedding_model=self.embedder.model)
        return [_passage_result(hit.passage, hit.score) for hit in hits], total

    async def count(self) -> int:
        """How many passages this memory holds."""
        async with self.db.unit_of_work(read_only=True) as uow:
            return await uow.passages.count(self.agent_id, embedding_model=self.embedder.model)


class RecallMemory:
    """An agent's conversation log across its sessions, searched by text or by date."""

    def __init__(self, db: Database, agent_id: uuid.UUID | str) -> None:
        self.db = db
        self.agent_id = agent_id

    async def text_search(
        self, query: str, count: int | None = None, start: int | None = None
    ) -> tuple[list[dict[str, Any]], int]:
        """Messages containing every word of `query`, most relevant first."""
        limit, offset = _page(count, start)
        async with self.db.unit_of_work(read_only=True) as uow:
            page = await uow.messages.search(
                self.agent_id, query, roles=CONVERSATION_ROLES, limit=limit, offset=offset
            )
        return [_message_result(message) for message in page.items], page.total

    async def date_search(
        self,
        start_date: str | date,
        end_date: str | date,
        count: int | None = None,
        start: int | None = None,
    ) -> tuple[list[dict[str, Any]], int]:
        """Messages from `start_date` to `end_date` (`YYYY-MM-DD`, end day included), oldest first."""
        limit, offset = _page(count, start)
        first, last = _as_date(start_date, "start_date"), _as_date(end_date, "end_date")
        async with self.db.unit_of_work(read_only=True) as uow:
            page = await uow.messages.between(
                self.agent_id, first, last, roles=CONVERSATION_ROLES, limit=limit, offset=offset
            )
        return [_message_result(message) for message in page.items], page.total


class PersistenceManager:
    """Keeps one agent session's in-context messages and core memory in the database.

    Each method is one unit of work.  Messages are `Message` objects or
    OpenAI-style dicts (`role`, `content`, `name`, `tool_calls`,
    `tool_call_id`; other fields are kept in `meta["openai"]`).
    """

    def __init__(self, db: Database, agent_id: uuid.UUID | str, session_id: uuid.UUID | str) -> None:
        self.db = db
        self.agent_id = agent_id
        self.session_id = session_id

    async def init(self, agent_state: Mapping[str, Any]) -> None:
        """Persist an agent's starting state: `system`, `core_memory` and `messages` (each optional).

        Initial messages are stored only into an empty session, so calling
        `init` again on restart does not duplicate them.
        """
        if not isinstance(agent_state, Mapping):
            raise ValidationError(f"agent_state: expected a dict, got {type(agent_state).__name__}")
        messages = _openai_messages(agent_state.get("messages") or ())
        check_batch(messages)  # checked even when the session has messages and they are not stored
        async with self.db.unit_of_work() as uow:
            if agent_state.get("core_memory") is not None:
                await uow.agents.update(self.agent_id, core_memory=agent_state["core_memory"])
            if messages and await uow.messages.count(self.session_id) == 0:
                await uow.messages.append(self.session_id, messages)
            if agent_state.get("system") is not None:
                await uow.messages.replace_system(self.session_id, agent_state["system"])

    async def trim_messages(self, num: int) -> int:
        """Drop the `num` oldest messages after the system message, never splitting a tool call.

        Returns how many were dropped (more than `num` when the cut would
        otherwise orphan tool answers).
        """
        check_int(num, "num", minimum=0, maximum=MAX_COUNT)
        async with self.db.unit_of_work() as uow:
            total = await uow.messages.count(self.session_id)
            head = await uow.messages.window(self.session_id, limit=1, after_seq=-(2**31))
            body = total - (1 if head and head[0].role == "system" else 0)
            return await uow.messages.trim(self.session_id, keep_last=max(0, body - num))

    async def prepend_to_messages(self, messages: Sequence[MessageInput]) -> list[Message]:
        """Insert messages right after the system message."""
        rows = _openai_messages(messages)
        async with self.db.unit_of_work() as uow:
            return await uow.messages.prepend(self.session_id, rows)

    async def append_to_messages(self, messages: Sequence[MessageInput]) -> list[Message]:
        """Append messages to the session."""
        rows = _openai_messages(messages)
        async with self.db.unit_of_work() as uow:
            return await uow.messages.append(self.session_id, rows)

    async def swap_system_message(self, message: MessageInput | str) -> Message:
        """Replace the system message (a string, a `Message` or a dict with `content`)."""
        if isinstance(message, str):
            content = message
        elif isinstance(message, Message):
            content = message.content or ""
        elif isinstance(message, Mapping):
            content = message.get("content") or ""
        else:
            raise ValidationError(
                f"message: expected a string, Message or dict, got {type(message).__name__}"
            )
        async with self.db.unit_of_work() as uow:
            return await uow.messages.replace_system(self.session_id, content)

    async def update_memory(self, core_memory: Mapping[str, str]) -> None:
        """Replace the agent's core memory blocks."""
        async with self.db.unit_of_work() as uow:
            await uow.agents.update(self.agent_id, core_memory=core_memory)
