"""memorm: an async, migration-managed database for LLM agents' memory.

One API over SQLite (aiosqlite, the embedded default) and Postgres (asyncpg,
jsonb, full-text search, pgvector):

```python
from memorm import Database, Message

async with Database() as db:
    await db.upgrade()
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("sam", system="You are Sam.")
        chat = await uow.sessions.create(agent.id)
        await uow.messages.append(chat.id, [Message(role="user", content="hi")])
```
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memorm.db import Database
    from memorm.embeddings import Embedder, HashingEmbedder
    from memorm.errors import (
        ConflictError,
        DatabaseError,
        MemormError,
        NotFoundError,
        SchemaError,
        ValidationError,
    )
    from memorm.models import Agent, ArchivalPassage, EmbeddingModel, Message, Session, metadata
    from memorm.page import Page
    from memorm.search.vector import ScoredPassage
    from memorm.uow import UnitOfWork

# Exports load on first use (PEP 562): ``import memorm.testing``, which pytest
# does in every run once memorm is installed, then costs nothing like the
# half second SQLAlchemy, SQLModel and numpy take to import.
_EXPORTS = {
    "Database": "memorm.db",
    "Embedder": "memorm.embeddings",
    "HashingEmbedder": "memorm.embeddings",
    "ConflictError": "memorm.errors",
    "DatabaseError": "memorm.errors",
    "MemormError": "memorm.errors",
    "NotFoundError": "memorm.errors",
    "SchemaError": "memorm.errors",
    "ValidationError": "memorm.errors",
    "Agent": "memorm.models",
    "ArchivalPassage": "memorm.models",
    "EmbeddingModel": "memorm.models",
    "Message": "memorm.models",
    "Session": "memorm.models",
    "metadata": "memorm.models",
    "Page": "memorm.page",
    "ScoredPassage": "memorm.search.vector",
    "UnitOfWork": "memorm.uow",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'memorm' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "Agent",
    "ArchivalPassage",
    "ConflictError",
    "Database",
    "DatabaseError",
    "Embedder",
    "EmbeddingModel",
    "HashingEmbedder",
    "MemormError",
    "Message",
    "NotFoundError",
    "Page",
    "SchemaError",
    "ScoredPassage",
    "Session",
    "UnitOfWork",
    "ValidationError",
    "metadata",
]

__version__ = "0.1.0"
