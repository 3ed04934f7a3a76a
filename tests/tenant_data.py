"""Rows in several tenants, and a fingerprint of each tenant's rows, for the tenancy tests."""

from __future__ import annotations

import hashlib
import uuid

import sqlalchemy as sa

from memorm import Database
from memorm.models import AGENTS, EMBEDDING_MODELS, MESSAGES, PASSAGES, SESSIONS

TABLES = (AGENTS, EMBEDDING_MODELS, SESSIONS, MESSAGES, PASSAGES)
# Each tenant's texts carry a word of its own, to look for in the full-text indexes.
WORDS = {"acme": "anvilrocket", "globex": "hammockfern", "default": "quietmoss"}
FILLED = {"agents": 2, "embedding_models": 3, "sessions": 3, "messages": 7, "archival_passages": 4}
# delete_tenant counts the graph state of the sessions and the agents' graph stores too; `fill` makes none.
NO_GRAPH = {"graph_checkpoints": 0, "graph_writes": 0, "graph_blobs": 0}
NO_STORE = {"graph_store_items": 0, "graph_store_vectors": 0}
NO_LANGGRAPH = {**NO_GRAPH, **NO_STORE}


async def fill(db: Database, tenant: str) -> dict[str, uuid.UUID]:
    """Two agents (one named "sam", as in every tenant), sessions, messages and passages of two models."""
    word = WORDS[tenant]
    async with db.unit_of_work(tenant) as uow:
        sam = await uow.agents.create("sam", meta={"tenant": tenant})
        ada = await uow.agents.create("ada")
        for agent, size in ((sam, 4), (ada, 2)):
            chat = await uow.sessions.create(agent.id, title=f"{word} chat")
            await uow.messages.append(
                chat.id, [{"role": "user", "content": f"{word} number {n}"} for n in range(size)]
            )
        second = await uow.sessions.create(sam.id, key="second")
        await uow.messages.append(second.id, [{"role": "user", "content": f"{word} once"}])
        await uow.passages.add(sam.id, f"{word} fact", [1.0, 0.0])
        await uow.passages.add(sam.id, f"{word} wide fact", [1.0, 0.0, 0.0], embedding_model="wide")
        await uow.passages.add(ada.id, f"{word} ada fact", [0.0, 1.0])
        await uow.passages.add(ada.id, f"{word} another", [0.5, 0.5])
    return {"sam": sam.id, "ada": ada.id}


async def rows_of(db: Database, tenant: str) -> dict[str, tuple[int, str]]:
    """Each table's rows of `tenant`: how many, and a hash of every column of every row."""
    found: dict[str, tuple[int, str]] = {}
    async with db.unit_of_work(read_only=True, all_tenants=True) as uow:
        for table in TABLES:
            statement = sa.select(table).where(table.c.tenant == tenant).order_by(table.c.id)
            rows = [tuple(row) for row in await uow.session.execute(statement)]
            found[table.name] = (len(rows), hashlib.sha256(repr(rows).encode()).hexdigest())
    return found
