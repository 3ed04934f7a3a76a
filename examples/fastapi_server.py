"""A small agent-memory server: memorm behind FastAPI.

One ``Database`` for the whole process (opened and migrated at start-up,
disposed at shutdown), one unit of work per request (read-only for GETs), and
memorm's errors mapped to HTTP statuses.  Each request acts for the tenant its
``X-Tenant`` header names (``"default"`` without one), through
``db.for_tenant``: tenants may use the same agent names, and an id of another
tenant's row is a 404 like any unknown id.  The header is read as UTF-8
(``X-Tenant: café`` is the tenant ``café``); one that is no tenant name
(empty, longer than 128 characters, or not UTF-8) is a 422.  In a real server the
tenant comes from the caller's authentication, not from a header it chooses.
Run it with::

    pip install memorm fastapi uvicorn
    MEMORM_DATABASE_URL=postgresql://user@localhost/agents uvicorn examples.fastapi_server:app

(without ``MEMORM_DATABASE_URL`` it uses ``./memorm.db``), then::

    curl -X POST localhost:8000/agents -H 'content-type: application/json' -H 'X-Tenant: acme' \
        -d '{"name": "sam"}'

``GET /healthz`` is a readiness probe (``Database.health()``): 200 when the
database answers and its schema is current, 503 otherwise.

The unit-of-work dependency uses ``scope="function"`` (FastAPI 0.121+): the
unit of work commits before the response is sent, so a failed commit is the
client's error response rather than a lost write after a 201.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from memorm import (
    Agent,
    ConflictError,
    Database,
    Message,
    NotFoundError,
    Session,
    UnitOfWork,
    ValidationError,
)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with Database() as db:  # MEMORM_DATABASE_URL, else sqlite:///memorm.db
        await db.upgrade()
        app.state.db = db
        yield


app = FastAPI(title="memorm example server", lifespan=lifespan)


def tenant_db(request: Request, x_tenant: Annotated[str, Header()] = "default") -> Database:
    """The database as the request's tenant (the ``X-Tenant`` header) sees it.

    The header's bytes are UTF-8 (what clients send for ``café``); the ASGI
    server hands them over decoded as latin-1, so they are decoded again,
    and bytes that are no UTF-8 are a 422.  ``for_tenant`` checks the name
    (memorm's ``ValidationError``: a 422) and costs nothing: the view shares
    the process's pools.
    """
    try:
        tenant = x_tenant.encode("latin-1").decode("utf-8")
    except UnicodeError:
        raise ValidationError("tenant: the X-Tenant header is not UTF-8 text") from None
    db: Database = request.app.state.db
    return db.for_tenant(tenant)


TenantDb = Annotated[Database, Depends(tenant_db)]


async def unit_of_work(request: Request, db: TenantDb) -> AsyncIterator[UnitOfWork]:
    """One unit of work per request, in its tenant: commits if the handler returns, else rolls back."""
    async with db.unit_of_work(read_only=request.method in ("GET", "HEAD")) as uow:
        yield uow


UoW = Annotated[UnitOfWork, Depends(unit_of_work, scope="function")]


# -- memorm errors as HTTP statuses ----------------------------------------------

STATUS = {NotFoundError: 404, ValidationError: 422, ConflictError: 409}


async def memorm_error(request: Request, error: Exception) -> JSONResponse:
    status = next(code for kind, code in STATUS.items() if isinstance(error, kind))
    return JSONResponse({"detail": str(error)}, status_code=status)


for error_type in STATUS:
    app.add_exception_handler(error_type, memorm_error)


# -- request and response bodies --------------------------------------------------


class AgentIn(BaseModel):
    name: str
    system: str = ""
    core_memory: dict[str, str] = Field(default_factory=dict)


class SessionIn(BaseModel):
    title: str | None = None


class MessageIn(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class SearchResults(BaseModel):
    items: list[Message]
    total: int


# -- endpoints --------------------------------------------------------------------


@app.post("/agents", status_code=201)
async def create_agent(body: AgentIn, uow: UoW) -> Agent:
    return await uow.agents.create(body.name, system=body.system, core_memory=body.core_memory)


@app.post("/agents/{agent_id}/sessions", status_code=201)
async def create_session(agent_id: uuid.UUID, body: SessionIn, uow: UoW) -> Session:
    return await uow.sessions.create(agent_id, title=body.title)


@app.post("/sessions/{session_id}/messages", status_code=201)
async def append_messages(session_id: uuid.UUID, body: list[MessageIn], uow: UoW) -> list[Message]:
    """Append a batch (atomically); the stored messages come back with their ``seq``."""
    return await uow.messages.append(session_id, [message.model_dump(exclude_unset=True) for message in body])


@app.get("/sessions/{session_id}/context")
async def context(session_id: uuid.UUID, max_tokens: int, uow: UoW) -> list[Message]:
    """The messages to send a model: the system message plus the newest that fit ``max_tokens``."""
    return await uow.messages.context(session_id, max_tokens=max_tokens)


@app.get("/agents/{agent_id}/search")
async def search(
    agent_id: uuid.UUID,
    uow: UoW,
    q: str,
    limit: Annotated[int, Query(ge=1, le=100)] = 10,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> SearchResults:
    """Full-text search of the agent's messages, best match first, with the total number of matches."""
    page = await uow.messages.search(agent_id, q, limit=limit, offset=offset)
    return SearchResults(items=page.items, total=page.total)


@app.get("/healthz")
async def healthz(request: Request) -> JSONResponse:
    """A readiness probe: 200 when the database answers and its schema is current, else 503.

    The body is ``Database.health()``'s figures: latency, schema revision, pool use.
    """
    health = await request.app.state.db.health(timeout=2.0)
    return JSONResponse(health.as_dict(), status_code=200 if health.ok else 503)
