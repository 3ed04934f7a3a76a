"""LangGraph on memorm: a checkpointer (extra `langgraph`).

[`MemormSaver`][memorm.compat.langgraph.MemormSaver] keeps a graph's
checkpoints, pending writes and channel values in memorm's tables, beside
the agents, sessions and messages:

```python
from memorm.compat.langgraph import MemormSaver

graph = builder.compile(checkpointer=MemormSaver(db, agent=agent.id))
graph.invoke(inputs, {"configurable": {"thread_id": "user-42"}})
```

A LangGraph thread is a memorm session of the saver's agent: the thread id
is the session's key (`uow.sessions.get_or_create(agent, thread_id)`), made
by the first checkpoint.  So deleting the session (or its agent), its
expiry (`ttl`, `purge_expired`), and its tenant (`db.for_tenant`) cover the
graph's state too.  Values are serialized by LangGraph's serializer, held by
memorm to build only the types LangGraph's graphs store and those allowed
(`StrictSerializer`: no code from data), and stored as memorm sees them:
opaque bytes.

Its long-term store, [`MemormStore`][memorm.compat.langgraph_store.MemormStore]
(LangGraph's `BaseStore`), is importable from here too.

Importing `memorm` never imports LangGraph; only this module does.
"""

from __future__ import annotations

from memorm.compat._extras import missing_extra

try:  # first, so that without LangGraph the error names this module
    import langchain_core.runnables  # noqa: F401
    import langgraph.checkpoint.base
    import langgraph.checkpoint.serde.base  # noqa: F401
except ImportError as error:
    raise missing_extra(__name__, "langgraph", error) from error

from memorm.compat._sync import BlockingCallError
from memorm.compat.langgraph_agent import DEFAULT_AGENT
from memorm.compat.langgraph_copy import copy_checkpoints
from memorm.compat.langgraph_retention import CheckpointRetention
from memorm.compat.langgraph_saver import MemormSaver
from memorm.compat.langgraph_serde import StrictSerializer
from memorm.compat.langgraph_storage import PAGE
from memorm.compat.langgraph_store import AsyncMemormStore, MemormStore

__all__ = [
    "DEFAULT_AGENT",
    "PAGE",
    "AsyncMemormStore",
    "BlockingCallError",
    "CheckpointRetention",
    "MemormSaver",
    "MemormStore",
    "StrictSerializer",
    "copy_checkpoints",
]
