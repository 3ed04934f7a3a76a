"""LangChain on memorm: a chat message history and a vector store (extra ``langchain``).

* :class:`MemormChatMessageHistory` — a ``BaseChatMessageHistory`` over
  ``uow.sessions`` and ``uow.messages``: one memorm session per external key.
* :class:`MemormVectorStore` — a ``VectorStore`` over ``uow.passages``.

Both are thin layers over memorm's repositories, async-native, with working
sync methods.  Sync methods run on a private event loop in a daemon thread
(:class:`SyncBridge`), against a private copy of your ``Database``: an engine's
pooled connections belong to the event loop that opened them, so sync calls
must never touch the pool your own loop uses.  The copy has the same URL and
the same driver connect arguments, its own pool (SQLAlchemy's default size),
and is made on first sync use; :func:`dispose_sync` closes it (it also closes
when your ``Database`` is garbage-collected, and at interpreter exit).  Sync
methods are therefore safe from plain sync code with no event loop, from a
worker thread while your loop runs elsewhere, and even (blocking it) from
inside a running loop.  An in-memory SQLite database cannot be copied: use a
file, or the async methods only.

Importing :mod:`memorm` never imports LangChain; only this module does.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import threading
import uuid
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

import anyio
import numpy as np
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    message_to_dict,
    messages_from_dict,
)
from langchain_core.messages.tool import ToolCall, invalid_tool_call, tool_call
from langchain_core.vectorstores import VectorStore
from langchain_core.vectorstores.utils import maximal_marginal_relevance
from typing_extensions import Self

from memorm.db import Database
from memorm.errors import ConflictError, NotFoundError, ValidationError
from memorm.ids import uuid7
from memorm.models import Agent, ArchivalPassage, Message
from memorm.repositories.message_input import check_int
from memorm.search.vector import ScoredPassage, check_metric
from memorm.uow import UnitOfWork
from memorm.validation import as_uuid, check_text

__all__ = [
    "MemormChatMessageHistory",
    "MemormVectorStore",
    "SyncBridge",
    "adispose_sync",
    "dispose_sync",
    "from_langchain",
    "to_langchain",
]

T = TypeVar("T")

PAGE = 1000  # rows per read: memorm's largest page
_BEFORE_ALL = -(2**31) - 1  # a seq below every message's (seq is a 32-bit integer)
_UPSERT_ATTEMPTS = 3


# -- the sync bridge ---------------------------------------------------------------------------


class SyncBridge:
    """Runs memorm coroutines for sync callers on a private event loop in a daemon thread.

    Each source ``Database`` gets one private copy, made lazily inside that
    loop (its pool is bound to it) and shared by every adapter over the same
    database: per-request history objects do not each open a pool.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._copies: weakref.WeakKeyDictionary[Database, Database] = weakref.WeakKeyDictionary()
        self._finalizers: dict[Database, weakref.finalize[Any, Any]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def run(self, db: Database, work: Callable[[Database], Awaitable[T]]) -> T:
        """``await work(copy_of_db)`` on the private loop; blocks until it is done."""
        loop = self._started()
        if threading.current_thread() is self._thread:
            raise RuntimeError("a sync memorm call from memorm's own sync loop would deadlock")
        future = asyncio.run_coroutine_threadsafe(self._call(db, work), loop)
        try:
            return future.result()
        finally:
            future.cancel()  # a no-op once done; stops the work if the caller was interrupted

    def dispose(self, db: Database | None = None) -> None:
        """Close the private copy of ``db`` (of every database, if None); it reopens on next use."""
        loop = self._loop
        if loop is None:
            return
        if threading.current_thread() is self._thread:
            raise RuntimeError("dispose() from memorm's own sync loop would deadlock")
        asyncio.run_coroutine_threadsafe(self._dispose(db), loop).result()

    async def _call(self, db: Database, work: Callable[[Database], Awaitable[T]]) -> T:
        return await work(self._copy_of(db))

    def _copy_of(self, db: Database) -> Database:
        # Only ever runs on the private loop's thread, so check-then-set cannot race.
        copy = self._copies.get(db)
        if copy is None:
            copy = private_copy(db)
            self._copies[db] = copy
            self._finalizers[copy] = weakref.finalize(db, self._dispose_soon, copy)
        return copy

    async def _dispose(self, db: Database | None) -> None:
        sources = list(self._copies) if db is None else [db]
        for source in sources:
            copy = self._copies.pop(source, None)
            if copy is not None:
                finalizer = self._finalizers.pop(copy, None)
                if finalizer is not None:
                    finalizer.detach()
                await copy.dispose()

    def _dispose_soon(self, copy: Database) -> None:
        """The source database was garbage-collected (in any thread): close its copy."""
        loop = self._loop
        self._finalizers.pop(copy, None)
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop is shutting down
                loop.call_soon_threadsafe(self._spawn_dispose, copy)

    def _spawn_dispose(self, copy: Database) -> None:
        task = asyncio.get_running_loop().create_task(copy.dispose())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="memorm-sync", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
                _at_shutdown(self._shutdown)
            return self._loop

    def _shutdown(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return
        # Best effort at exit: a server that already went away must not hang the interpreter.
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._dispose(None), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


def _at_shutdown(callback: Callable[[], None]) -> None:
    """Run ``callback`` at interpreter exit, before non-daemon threads are joined.

    aiosqlite keeps a non-daemon thread per open connection; plain ``atexit``
    runs only after the interpreter waits for those threads, which would wait
    forever.  ``threading._register_atexit`` (what ``concurrent.futures`` uses)
    runs first.
    """
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is not None:
            register(callback)
        else:  # pragma: no cover - other Pythons
            atexit.register(callback)
    except RuntimeError:  # pragma: no cover - already shutting down
        pass


def private_copy(db: Database) -> Database:
    """A new ``Database`` on the same store as ``db``, with its own pool (for another event loop).

    The pool's creator carries the driver connect arguments (``connect_args``:
    SSL, a Postgres ``search_path``…), which the URL alone does not.  Other
    engine options (pool size, ``echo``) take their defaults.
    """
    url = db.url
    if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
        raise ValidationError(
            "an in-memory SQLite database lives in one connection and cannot be shared with "
            "memorm's sync loop: use a database file, or the async methods"
        )
    creator = getattr(db.engine.pool, "_creator", None)
    options: dict[str, Any] = {} if creator is None else {"creator": creator}
    return Database(url, token_counter=db.token_counter, **options)


_BRIDGE = SyncBridge()


def dispose_sync(db: Database | None = None) -> None:
    """Close the private copy of ``db`` that sync methods use (of every database, if None).

    Call it where you dispose ``db`` itself; a later sync call reopens it.
    """
    _BRIDGE.dispose(db)


async def adispose_sync(db: Database | None = None) -> None:
    """:func:`dispose_sync` for async code (the wait runs in a worker thread)."""
    await anyio.to_thread.run_sync(_BRIDGE.dispose, db)


# -- messages <-> memorm rows ------------------------------------------------------------------

# memorm's roles are system | user | assistant | tool; LangChain's message types map onto them.
_TYPE_ROLES = {
    "human": "user",
    "HumanMessageChunk": "user",
    "ai": "assistant",
    "AIMessageChunk": "assistant",
    "system": "system",
    "SystemMessageChunk": "system",
    "tool": "tool",
    "ToolMessageChunk": "tool",
    "function": "tool",  # a legacy function result answers a call, as a tool message does
    "FunctionMessageChunk": "tool",
}
_CHAT_ROLES = {
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "ai": "assistant",
    "model": "assistant",
    "system": "system",
    "developer": "system",
    "tool": "tool",
    "function": "tool",
}
LANGCHAIN_KEY = "langchain"  # Message.meta[LANGCHAIN_KEY]: the message as message_to_dict gives it


def from_langchain(message: BaseMessage) -> dict[str, Any]:
    """The memorm message (a dict for ``uow.messages.append``) storing a LangChain message.

    ``role``, ``content``, ``name``, ``tool_calls`` (OpenAI style) and
    ``tool_call_id`` fill memorm's columns, so memorm's search, context windows
    and trims work on them; ``meta["langchain"]`` keeps LangChain's own
    serialisation (``message_to_dict``, less a string ``content``, which the
    column holds), so :func:`to_langchain` gives back an equal object.
    ``ChatMessage`` roles map to the closest memorm role (unknown ones to
    ``user``); the original type and role stay in ``meta``.
    """
    kind = message.type
    if isinstance(message, ChatMessage):
        role = _CHAT_ROLES.get(message.role.lower(), "user")
    elif kind in _TYPE_ROLES:
        role = _TYPE_ROLES[kind]
    else:
        raise ValidationError(f"a {type(message).__name__} ({kind!r}) is not a message memorm can store")
    stored = message_to_dict(message)
    if isinstance(message.content, str):
        content = message.content
        del stored["data"]["content"]
    else:
        content = str(message.text)  # the text blocks, for full-text search and token estimates
    row: dict[str, Any] = {
        "role": role,
        "content": content,
        "name": message.name,
        "meta": {LANGCHAIN_KEY: stored},
    }
    if isinstance(message, AIMessage) and message.tool_calls:
        row["tool_calls"] = [_openai_call(call) for call in message.tool_calls]
    if isinstance(message, ToolMessage):
        row["tool_call_id"] = message.tool_call_id
    return row


def _openai_call(call: ToolCall) -> dict[str, Any]:
    try:
        arguments = json.dumps(call["args"], ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ValidationError(f"tool call {call.get('id')!r}: arguments are not JSON ({error})") from None
    return {
        "id": call.get("id"),
        "type": "function",
        "function": {"name": call["name"], "arguments": arguments},
    }


def to_langchain(message: Message) -> BaseMessage:
    """The LangChain message a memorm message stores.

    Messages written by :func:`from_langchain` come back equal to the
    original; others (written with memorm's own API) are built from the
    columns, with ``id`` the memorm message id.
    """
    stored = (message.meta or {}).get(LANGCHAIN_KEY)
    if (
        isinstance(stored, dict)
        and isinstance(stored.get("type"), str)
        and isinstance(stored.get("data"), dict)
    ):
        data = dict(stored["data"])
        data.setdefault("content", message.content)
        # Not ours after all (another app's "langchain" key): fall back to the columns.
        with contextlib.suppress(ValueError, TypeError):
            return messages_from_dict([{"type": stored["type"], "data": data}])[0]
    common: dict[str, Any] = {"content": message.content, "name": message.name, "id": str(message.id)}
    if message.role == "system":
        return SystemMessage(**common)
    if message.role == "tool":
        return ToolMessage(tool_call_id=message.tool_call_id or "", **common)
    if message.role == "assistant":
        calls, invalid = _langchain_calls(message.tool_calls or [])
        return AIMessage(tool_calls=calls, invalid_tool_calls=invalid, **common)
    return HumanMessage(**common)


def _langchain_calls(calls: list[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    """LangChain tool calls from OpenAI-style ones (or flat ``{"id", "name", "args"}`` dicts)."""
    valid: list[Any] = []
    invalid: list[Any] = []
    for call in calls:
        function = call.get("function")
        if isinstance(function, dict):
            name, raw = function.get("name"), function.get("arguments")
        else:
            name, raw = call.get("name"), call.get("args")
        call_id = call.get("id")
        try:
            args = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError as error:
            invalid.append(invalid_tool_call(name=name, args=raw, id=call_id, error=str(error)))
            continue
        if isinstance(args, dict) and isinstance(name, str):
            valid.append(tool_call(name=name, args=args, id=call_id))
        else:
            invalid.append(invalid_tool_call(name=name, args=json.dumps(raw), id=call_id, error="not a call"))
    return valid, invalid


# -- chat message history ----------------------------------------------------------------------


class MemormChatMessageHistory(BaseChatMessageHistory):
    """LangChain chat history stored in a memorm session.

    LangChain deprecated ``BaseChatMessageHistory`` (langchain-core 1.6.4, to
    be removed in 2.0) in favour of LangGraph's persistence (checkpointers and
    stores); new code should use those.  This adapter keeps code still on
    ``BaseChatMessageHistory`` (``RunnableWithMessageHistory``, the legacy
    memory classes) correct.

    Args:
        db: the shared :class:`~memorm.Database`.
        session_key: any non-empty string (LangChain's ``session_id``); it names
            the agent's memorm session through
            ``uow.sessions.get_or_create(agent, session_key)``, created by the
            first write.  Reads and clears of an unknown key create nothing.
        agent: the agent (id or :class:`~memorm.Agent`) the session belongs to.
        window: read only the newest ``window`` messages (``messages`` and
            ``aget_messages``), so a long history is never loaded whole.  A
            window can begin with a tool answer whose call fell outside it.
            Without it, the whole history is read, in pages of 1,000.

    Every LangChain message type round-trips to an equal object (see
    :func:`from_langchain`); ``additional_kwargs``, ``response_metadata``,
    ``artifact`` and tool-call arguments must be JSON.  Async methods use
    ``db`` on your event loop; sync ones use memorm's sync loop (see this
    module's docstring).

    Example::

        history = MemormChatMessageHistory(db, "user-42", agent=agent.id, window=50)
        await history.aadd_messages([HumanMessage("hi"), AIMessage("hello!")])
        recent = await history.aget_messages()
    """

    def __init__(
        self,
        db: Database,
        session_key: str,
        *,
        agent: uuid.UUID | str | Agent,
        window: int | None = None,
    ) -> None:
        super().__init__()
        key = check_text(session_key, "session_key") or ""
        if not key:
            raise ValidationError("session_key: must not be empty")
        self.db = db
        self.session_key = key
        self.agent_id = as_uuid(agent.id if isinstance(agent, Agent) else agent, "agent")
        self.window = None if window is None else check_int(window, "window", minimum=1)
        self._session_id: uuid.UUID | None = None  # set once the session is known to exist

    def __repr__(self) -> str:
        return f"MemormChatMessageHistory(session_key={self.session_key!r}, agent={self.agent_id})"

    # -- async ------------------------------------------------------------

    async def aget_messages(self) -> list[BaseMessage]:
        """The session's messages, oldest first (the newest ``window``, if set)."""
        return await self._read(self.db)

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append the messages in one unit of work (creating the session on first use)."""
        await self._append(self.db, [from_langchain(message) for message in messages])

    async def aclear(self) -> None:
        """Delete the session's messages (the session itself stays, under its key)."""
        await self._clear(self.db)

    # -- sync -------------------------------------------------------------

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]  # LangChain declares a plain attribute
        """The session's messages, oldest first (the newest ``window``, if set)."""
        return _BRIDGE.run(self.db, self._read)

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append the messages in one unit of work (creating the session on first use)."""
        rows = [from_langchain(message) for message in messages]
        _BRIDGE.run(self.db, lambda db: self._append(db, rows))

    def clear(self) -> None:
        """Delete the session's messages (the session itself stays, under its key)."""
        _BRIDGE.run(self.db, self._clear)

    # -- the work, on whichever Database the caller's loop may use ----------

    async def _read(self, db: Database) -> list[BaseMessage]:
        async with db.unit_of_work(read_only=True) as uow:
            session_id = await self._existing(uow)
            if session_id is None:
                return []
            try:
                if self.window is not None:
                    rows = await _newest(uow, session_id, self.window)
                else:
                    rows = await _everything(uow, session_id)
            except NotFoundError:  # the session was deleted since we looked it up
                self._session_id = None
                return []
        return [to_langchain(row) for row in rows]

    async def _append(self, db: Database, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        for cached in (self._session_id, None):
            try:
                async with db.unit_of_work() as uow:
                    session_id = cached
                    if session_id is None:
                        session_id = (await uow.sessions.get_or_create(self.agent_id, self.session_key)).id
                    await uow.messages.append(session_id, rows)
            except NotFoundError:
                if cached is None:
                    raise  # the agent is gone (or the new session vanished at once)
                continue  # the cached session was deleted meanwhile: find or create it again
            self._session_id = session_id  # only once committed: a rolled-back session never existed
            return

    async def _clear(self, db: Database) -> None:
        async with db.unit_of_work() as uow:
            session_id = await self._existing(uow)
            if session_id is None:
                return
            # Repeated until empty: a prepend committed between the read and the delete
            # would leave a message below the oldest one we saw.
            while oldest := await uow.messages.window(session_id, limit=1, after_seq=_BEFORE_ALL):
                await uow.messages.delete_after(session_id, oldest[0].seq - 1)

    async def _existing(self, uow: UnitOfWork) -> uuid.UUID | None:
        if self._session_id is None:
            found = await uow.sessions.get_by_key(self.agent_id, self.session_key)
            if found is not None:
                self._session_id = found.id
        return self._session_id


async def _newest(uow: UnitOfWork, session_id: uuid.UUID, count: int) -> list[Message]:
    """The newest ``count`` messages, oldest first, paging back 1,000 at a time."""
    pages: list[list[Message]] = []
    wanted, before = count, None
    while wanted > 0:
        limit = min(wanted, PAGE)
        page = await uow.messages.window(session_id, limit=limit, before_seq=before)
        pages.append(page)
        wanted -= len(page)
        if len(page) < limit:
            break  # the start of the history
        before = page[0].seq
    return [row for page in reversed(pages) for row in page]


async def _everything(uow: UnitOfWork, session_id: uuid.UUID) -> list[Message]:
    """Every message, oldest first, paging forward 1,000 at a time."""
    rows: list[Message] = []
    after = _BEFORE_ALL
    while True:
        page = await uow.messages.window(session_id, limit=PAGE, after_seq=after)
        rows.extend(page)
        if len(page) < PAGE:
            return rows
        after = page[-1].seq


# -- vector store ------------------------------------------------------------------------------

# Fixed forever: document ids that are not UUIDs map to uuid5(namespace, "<agent>/<id>").
DOCUMENT_ID_NAMESPACE = uuid.UUID("6f3f1c2e-8d7a-5b4e-9c1d-2a7e4b6c9d10")
DOCUMENT_ID_KEY = "_langchain_id"  # passage meta: the Document.id, when it is not the passage id


def _embedding_model_of(embedding: Embeddings) -> str:
    for attribute in ("model", "model_name", "model_id"):
        value = getattr(embedding, attribute, None)
        if isinstance(value, str) and value.strip():
            return value
    return "default"


class MemormVectorStore(VectorStore):
    """A LangChain vector store over an agent's archival passages.

    Args:
        db: the shared :class:`~memorm.Database`.
        agent_id: the agent whose passages this store holds.
        embedding: the LangChain ``Embeddings`` that embed texts and queries.
        embedding_model: the memorm embedding model name the passages are
            stored and searched under (one dimension per agent and name).
            Defaults to the embedding object's ``model``, ``model_name`` or
            ``model_id``, else ``"default"``.
        metric: ``"cosine"`` (default), ``"l2"`` or ``"inner_product"``.

    Document ids are strings.  A canonical UUID string is the passage id
    itself; any other string maps to a UUID derived from the agent and the id,
    and is kept in the passage's ``meta["_langchain_id"]``, so ``Document.id``
    reads back exactly.  Adding a document under an existing id replaces its
    text, metadata and embedding.  ``Document.metadata`` is the passage's
    ``meta`` (JSON values) without that key; ``filter=`` takes memorm's
    ``where`` filters (``{"topic": "cats"}``, ``{"lang": {"$in": [...]}}``).

    Scores from ``similarity_search_with_score`` are memorm's: higher is
    better (cosine similarity for ``cosine``; see ``docs/archival.md``).
    Relevance scores (``similarity_search_with_relevance_scores``, retrievers'
    ``score_threshold``) map them onto [0, 1]: ``(1 + similarity) / 2`` for
    cosine.  Sync methods embed in the calling thread and run the database
    work on memorm's sync loop.

    Example::

        store = MemormVectorStore(db, agent.id, OpenAIEmbeddings(model="text-embedding-3-small"))
        await store.aadd_texts(["Ada's cat is called Miso."], ids=["fact-1"])
        [doc] = await store.asimilarity_search("cat's name", k=1)
    """

    def __init__(
        self,
        db: Database,
        agent_id: uuid.UUID | str | Agent,
        embedding: Embeddings,
        *,
        embedding_model: str | None = None,
        metric: str = "cosine",
    ) -> None:
        self.db = db
        self.agent_id = as_uuid(agent_id.id if isinstance(agent_id, Agent) else agent_id, "agent_id")
        self.embedding = embedding
        name = _embedding_model_of(embedding) if embedding_model is None else embedding_model
        if not (check_text(name, "embedding_model") or "").strip():
            raise ValidationError("embedding_model: must not be blank")
        self.embedding_model = name
        self.metric = check_metric(metric)

    def __repr__(self) -> str:
        return f"MemormVectorStore(agent_id={self.agent_id}, embedding_model={self.embedding_model!r})"

    @property
    def embeddings(self) -> Embeddings:
        """The embeddings this store embeds texts and queries with."""
        return self.embedding

    # -- ids and documents ---------------------------------------------------

    def passage_id(self, document_id: str) -> uuid.UUID:
        """The passage id a document id maps to."""
        if not isinstance(document_id, str) or not document_id:
            raise ValidationError(f"ids: expected non-empty strings, got {document_id!r:.80}")
        try:
            parsed = uuid.UUID(document_id)
        except ValueError:
            parsed = None
        if parsed is not None and str(parsed) == document_id:
            return parsed
        return uuid.uuid5(DOCUMENT_ID_NAMESPACE, f"{self.agent_id}/{document_id}")

    @staticmethod
    def document(passage: ArchivalPassage) -> Document:
        """The LangChain ``Document`` a passage holds."""
        meta = dict(passage.meta or {})
        document_id = meta.pop(DOCUMENT_ID_KEY, None)
        return Document(
            id=document_id if isinstance(document_id, str) else str(passage.id),
            page_content=passage.text,
            metadata=meta,
        )

    def _items(
        self, texts: list[str], metadatas: list[dict[str, Any]] | None, ids: Sequence[str | None] | None
    ) -> tuple[list[str], list[dict[str, Any]], set[uuid.UUID]]:
        """Document ids, passage items (without embeddings) and the ids that may exist already."""
        if metadatas is not None and len(metadatas) != len(texts):
            raise ValidationError(f"metadatas: {len(metadatas)} for {len(texts)} texts")
        if ids is not None and len(ids) != len(texts):
            raise ValidationError(f"ids: {len(ids)} for {len(texts)} texts")
        keys: list[str] = []
        items: list[dict[str, Any]] = []
        existing: set[uuid.UUID] = set()
        for index, text in enumerate(texts):
            given = None if ids is None else ids[index]
            if given is None:
                passage_id = uuid7()
                key = str(passage_id)
            else:
                key, passage_id = given, self.passage_id(given)
                existing.add(passage_id)
            meta = dict(metadatas[index] or {}) if metadatas is not None else {}
            if DOCUMENT_ID_KEY in meta:
                raise ValidationError(
                    f"metadatas[{index}]: {DOCUMENT_ID_KEY!r} is reserved for the document id"
                )
            if str(passage_id) != key:
                meta[DOCUMENT_ID_KEY] = key
            keys.append(key)
            items.append(
                {"id": passage_id, "text": text, "meta": meta, "embedding_model": self.embedding_model}
            )
        return keys, items, existing

    # -- the work, on whichever Database the caller's loop may use ----------

    async def _upsert(
        self, db: Database, items: list[dict[str, Any]], vectors: list[list[float]], existing: set[uuid.UUID]
    ) -> None:
        # The last item of an id wins, as if they had been added one after another.
        latest = {
            item["id"]: {**item, "embedding": vector} for item, vector in zip(items, vectors, strict=True)
        }
        for attempt in range(_UPSERT_ATTEMPTS):
            try:
                async with db.unit_of_work() as uow:
                    # memorm has no passage upsert: delete then insert, in one unit of work.
                    for passage_id in sorted(existing):
                        if await self._remove(uow, passage_id) is False:
                            raise ValidationError(f"ids: passage {passage_id} belongs to another agent")
                    await uow.passages.add_many(self.agent_id, list(latest.values()))
                return
            except ConflictError:  # a concurrent add of the same id won the insert: replace it
                if attempt == _UPSERT_ATTEMPTS - 1:
                    raise

    async def _remove(self, uow: UnitOfWork, passage_id: uuid.UUID) -> bool | None:
        """Delete this agent's passage: True; None if there is none; False if another agent's."""
        try:
            passage = await uow.passages.get(passage_id)
        except NotFoundError:
            return None
        if passage.agent_id != self.agent_id:
            return False
        await uow.passages.delete(passage_id)
        return True

    async def _delete(self, db: Database, ids: list[str]) -> None:
        targets = list(dict.fromkeys(self.passage_id(document_id) for document_id in ids))
        async with db.unit_of_work() as uow:
            for passage_id in targets:
                await self._remove(uow, passage_id)  # missing ids (and other agents') are skipped

    async def _get(self, db: Database, ids: Sequence[str]) -> list[Document]:
        wanted = [self.passage_id(document_id) for document_id in ids]
        found: dict[uuid.UUID, Document] = {}
        async with db.unit_of_work(read_only=True) as uow:
            for passage_id in dict.fromkeys(wanted):
                try:
                    passage = await uow.passages.get(passage_id)
                except NotFoundError:
                    continue
                if passage.agent_id == self.agent_id:
                    found[passage_id] = self.document(passage)
        return [found[passage_id] for passage_id in wanted if passage_id in found]

    async def _search(
        self, db: Database, vector: Sequence[float], k: int, where: dict[str, Any] | None
    ) -> list[ScoredPassage]:
        async with db.unit_of_work(read_only=True) as uow:
            return await uow.passages.search(
                self.agent_id,
                vector,
                k=k,
                embedding_model=self.embedding_model,
                metric=self.metric,
                where=where,
            )

    def _mmr(
        self, query: Sequence[float], hits: list[ScoredPassage], k: int, lambda_mult: float
    ) -> list[Document]:
        if not hits:
            return []
        chosen = maximal_marginal_relevance(
            np.asarray(query, dtype=np.float32),
            [list(hit.passage.vector) for hit in hits],
            lambda_mult=lambda_mult,
            k=k,
        )
        return [self.document(hits[index].passage) for index in chosen]

    # -- writing -------------------------------------------------------------

    def add_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        """Embed and store the texts in one unit of work; returns their ids.

        ``ids`` entries that are None get new ids; an id that exists is replaced.
        """
        batch = list(texts)
        keys, items, existing = self._items(batch, metadatas, ids)
        if not batch:
            return []
        vectors = self.embedding.embed_documents(batch)
        _BRIDGE.run(self.db, lambda db: self._upsert(db, items, vectors, existing))
        return keys

    async def aadd_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        """Embed and store the texts in one unit of work; returns their ids."""
        batch = list(texts)
        keys, items, existing = self._items(batch, metadatas, ids)
        if not batch:
            return []
        vectors = await self.embedding.aembed_documents(batch)
        await self._upsert(self.db, items, vectors, existing)
        return keys

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool:
        """Delete the documents with these ids (missing ids are ignored); returns True.

        ``ids=None`` (LangChain's "delete everything") is refused: delete the
        agent, or use ``uow.passages.delete_where``.
        """
        targets = _delete_ids(ids)
        _BRIDGE.run(self.db, lambda db: self._delete(db, targets))
        return True

    async def adelete(self, ids: list[str] | None = None, **kwargs: Any) -> bool:
        """Delete the documents with these ids (missing ids are ignored); returns True."""
        await self._delete(self.db, _delete_ids(ids))
        return True

    # -- reading -------------------------------------------------------------

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The documents with these ids, in the order given; missing ids are skipped."""
        return _BRIDGE.run(self.db, lambda db: self._get(db, ids))

    async def aget_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The documents with these ids, in the order given; missing ids are skipped."""
        return await self._get(self.db, ids)

    def similarity_search(
        self, query: str, k: int = 4, *, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        """The ``k`` documents nearest ``query``, best first."""
        return [doc for doc, _ in self.similarity_search_with_score(query, k, filter=filter)]

    async def asimilarity_search(
        self, query: str, k: int = 4, *, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        """The ``k`` documents nearest ``query``, best first."""
        return [doc for doc, _ in await self.asimilarity_search_with_score(query, k, filter=filter)]

    def similarity_search_with_score(
        self, query: str, k: int = 4, *, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """The ``k`` documents nearest ``query`` with their scores (higher is better)."""
        return self.similarity_search_with_score_by_vector(
            self.embedding.embed_query(query), k, filter=filter
        )

    async def asimilarity_search_with_score(
        self, query: str, k: int = 4, *, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """The ``k`` documents nearest ``query`` with their scores (higher is better)."""
        vector = await self.embedding.aembed_query(query)
        return await self.asimilarity_search_with_score_by_vector(vector, k, filter=filter)

    def similarity_search_with_score_by_vector(
        self, embedding: list[float], k: int = 4, *, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """The ``k`` documents nearest ``embedding`` with their scores (higher is better)."""
        hits = _BRIDGE.run(self.db, lambda db: self._search(db, embedding, k, filter))
        return [(self.document(hit.passage), hit.score) for hit in hits]

    async def asimilarity_search_with_score_by_vector(
        self, embedding: list[float], k: int = 4, *, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """The ``k`` documents nearest ``embedding`` with their scores (higher is better)."""
        hits = await self._search(self.db, embedding, k, filter)
        return [(self.document(hit.passage), hit.score) for hit in hits]

    def similarity_search_by_vector(
        self, embedding: list[float], k: int = 4, *, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        """The ``k`` documents nearest ``embedding``, best first."""
        return [doc for doc, _ in self.similarity_search_with_score_by_vector(embedding, k, filter=filter)]

    async def asimilarity_search_by_vector(
        self, embedding: list[float], k: int = 4, *, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        """The ``k`` documents nearest ``embedding``, best first."""
        found = await self.asimilarity_search_with_score_by_vector(embedding, k, filter=filter)
        return [doc for doc, _ in found]

    def max_marginal_relevance_search(
        self,
        query: str,
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        *,
        filter: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        """``k`` documents chosen among the ``fetch_k`` nearest for relevance and diversity."""
        return self.max_marginal_relevance_search_by_vector(
            self.embedding.embed_query(query), k, fetch_k, lambda_mult, filter=filter
        )

    async def amax_marginal_relevance_search(
        self,
        query: str,
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        *,
        filter: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        """``k`` documents chosen among the ``fetch_k`` nearest for relevance and diversity."""
        vector = await self.embedding.aembed_query(query)
        return await self.amax_marginal_relevance_search_by_vector(
            vector, k, fetch_k, lambda_mult, filter=filter
        )

    def max_marginal_relevance_search_by_vector(
        self,
        embedding: list[float],
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        *,
        filter: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        """``k`` documents chosen among the ``fetch_k`` nearest for relevance and diversity."""
        hits = _BRIDGE.run(self.db, lambda db: self._search(db, embedding, fetch_k, filter))
        return self._mmr(embedding, hits, k, lambda_mult)

    async def amax_marginal_relevance_search_by_vector(
        self,
        embedding: list[float],
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        *,
        filter: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        """``k`` documents chosen among the ``fetch_k`` nearest for relevance and diversity."""
        hits = await self._search(self.db, embedding, fetch_k, filter)
        return self._mmr(embedding, hits, k, lambda_mult)

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        # Scores are already similarities (higher is better), not distances.
        if self.metric == "cosine":
            return lambda score: (1.0 + score) / 2.0  # [-1, 1] onto LangChain's [0, 1]
        if self.metric == "l2":
            return lambda score: score  # 1 / (1 + distance) is in (0, 1] already
        return lambda score: self._max_inner_product_relevance_score_fn(-score)

    # -- construction --------------------------------------------------------

    @classmethod
    def from_texts(
        cls,
        texts: list[str],
        embedding: Embeddings,
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        db: Database | None = None,
        agent_id: uuid.UUID | str | Agent | None = None,
        embedding_model: str | None = None,
        metric: str = "cosine",
        **kwargs: Any,
    ) -> Self:
        """A store over ``agent_id``'s passages in ``db``, with ``texts`` added (both are required)."""
        store = cls(*_required(db, agent_id), embedding, embedding_model=embedding_model, metric=metric)
        store.add_texts(texts, metadatas, ids=ids)
        return store

    @classmethod
    async def afrom_texts(
        cls,
        texts: list[str],
        embedding: Embeddings,
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        db: Database | None = None,
        agent_id: uuid.UUID | str | Agent | None = None,
        embedding_model: str | None = None,
        metric: str = "cosine",
        **kwargs: Any,
    ) -> Self:
        """A store over ``agent_id``'s passages in ``db``, with ``texts`` added (both are required)."""
        store = cls(*_required(db, agent_id), embedding, embedding_model=embedding_model, metric=metric)
        await store.aadd_texts(texts, metadatas, ids=ids)
        return store


def _required(
    db: Database | None, agent_id: uuid.UUID | str | Agent | None
) -> tuple[Database, uuid.UUID | str | Agent]:
    if db is None or agent_id is None:
        raise ValidationError("from_texts: give db= and agent_id=")
    return db, agent_id


def _delete_ids(ids: list[str] | None) -> list[str]:
    if ids is None:
        raise ValidationError(
            "delete: give ids (memorm does not empty an archive by accident; "
            "delete the agent, or use uow.passages.delete_where)"
        )
    return list(ids)
