"""memorm: an async, migration-managed database for LLM agents' memory.

One API over SQLite (aiosqlite, the embedded default) and Postgres (asyncpg,
jsonb, full-text search, pgvector)::

    from memorm import Database, Message

    async with Database() as db:
        await db.upgrade()
        async with db.unit_of_work() as uow:
            agent = await uow.agents.create("sam", system="You are Sam.")
            chat = await uow.sessions.create(agent.id)
            await uow.messages.append(chat.id, [Message(role="user", content="hi")])
"""

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
from memorm.search import fts_ddl as _fts_ddl  # noqa: F401  (full-text DDL for create_all)
from memorm.search.vector import ScoredPassage
from memorm.uow import UnitOfWork

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
