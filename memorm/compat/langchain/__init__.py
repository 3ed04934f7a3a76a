"""LangChain on memorm: a chat message history and a vector store (extra `langchain`).

* [`MemormChatMessageHistory`][memorm.compat.langchain.MemormChatMessageHistory] — a
  `BaseChatMessageHistory` over `uow.sessions` and `uow.messages`: one memorm
  session per external key.
* [`MemormVectorStore`][memorm.compat.langchain.MemormVectorStore] — a `VectorStore` over
  `uow.passages`.

Both are thin layers over memorm's repositories, async-native, with working
sync methods.  Sync methods run on a private event loop in a daemon thread
(`SyncBridge`), on your own `Database`, which gives that loop a
connection pool of its own (a pool belongs to the event loop that opened it);
[`dispose_sync`][memorm.compat.langchain.dispose_sync] closes that pool (it also closes at interpreter exit).
Sync methods therefore work from plain sync code with no event loop, and from
a worker thread while your loop runs elsewhere.  From inside a running loop
they block it until done; one that would wait for a task of that loop (a
writing unit of work it has open on the same database) raises
`memorm.errors.BlockedLoopError` at once instead of hanging: await the async
method there.  An in-memory SQLite database lives on one event loop: use a
file, or the async methods only.

Modules: `messages` (message mapping),
`history`,
`documents` (document mapping),
`vectorstore` with its searches in
`search` and its units of work in
`archive`; the sync bridge is
`memorm.compat._sync`.

Importing `memorm` never imports LangChain; only this package does.
"""

from __future__ import annotations

from memorm.compat._extras import missing_extra

try:  # before the modules that use it, so the error names the extra
    import langchain_core  # noqa: F401
except ImportError as error:
    raise missing_extra(__name__, "langchain", error) from error

from memorm.compat import _sync
from memorm.compat._sync import SyncBridge, adispose_sync, dispose_sync
from memorm.compat.langchain.documents import DOCUMENT_ID_KEY as DOCUMENT_ID_KEY
from memorm.compat.langchain.documents import DOCUMENT_ID_NAMESPACE as DOCUMENT_ID_NAMESPACE
from memorm.compat.langchain.history import PAGE as PAGE
from memorm.compat.langchain.history import MemormChatMessageHistory
from memorm.compat.langchain.messages import LANGCHAIN_KEY as LANGCHAIN_KEY
from memorm.compat.langchain.messages import from_langchain, to_langchain
from memorm.compat.langchain.vectorstore import MemormVectorStore

__all__ = [
    "MemormChatMessageHistory",
    "MemormVectorStore",
    "SyncBridge",
    "adispose_sync",
    "dispose_sync",
    "from_langchain",
    "to_langchain",
]

_BRIDGE = _sync.BRIDGE  # the process's sync bridge, importable here as before the split
