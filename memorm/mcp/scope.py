"""Which tenant a request works in, and memorm's errors as the MCP errors a client reads.

On stdio (and in-process) the server has one tenant, chosen when it was
built.  On HTTP each request's bearer token names its tenant
(`memorm.mcp.auth` puts it on the authenticated user), and every tool call
and resource read opens its unit of work on `db.for_tenant(tenant)`, so
Postgres row-level security applies as it does everywhere.  A request
without a tenant never falls back to a default one: it is refused.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from memorm.compat._extras import missing_extra

try:
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
    from mcp.server.mcpserver import Context
    from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
except ImportError as error:
    raise missing_extra(__name__, "mcp", error) from error

from memorm.db import Database
from memorm.embeddings import Embedder
from memorm.errors import MemormError, NotFoundError
from memorm.uow import UnitOfWork

__all__ = ["TENANT_CLAIM", "Scope", "token_tenant"]

TENANT_CLAIM = "memorm_tenant"
"""The claim of an authenticated request's access token that names its tenant."""


def token_tenant(ctx: Context[Any, Any]) -> str | None:
    """The tenant the request's bearer token names, or None (no HTTP request, or no token)."""
    request = ctx.request_context.request
    scope = getattr(request, "scope", None)
    user = scope.get("user") if isinstance(scope, dict) else None
    if not isinstance(user, AuthenticatedUser):
        return None
    tenant = (user.access_token.claims or {}).get(TENANT_CLAIM)
    return tenant if isinstance(tenant, str) else None


class Scope:
    """What every tool and resource shares: the database, the embedder, the tenant rule.

    Args:
        db: the one `Database` every request uses (its tenant views share its pool).
        embedder: embeds archival passages and queries.
        tenant: the tenant of every request; None to take it from each
            request's bearer token (HTTP), refusing requests without one.
    """

    def __init__(self, db: Database, embedder: Embedder, tenant: str | None) -> None:
        self.db = db
        self.embedder = embedder
        self.tenant = tenant

    def tenant_of(self, ctx: Context[Any, Any]) -> str:
        """The request's tenant; `MemormError` when a token was required and none came."""
        if self.tenant is not None:
            return self.tenant
        tenant = token_tenant(ctx)
        if tenant is None:
            raise MemormError("this request carries no tenant: send the bearer token of one")
        return tenant

    @staticmethod
    @contextmanager
    def tool_errors() -> Iterator[None]:
        """memorm's errors inside leave as `ToolError`, which the client reads (`isError: true`)."""
        try:
            yield
        except MemormError as error:
            raise ToolError(f"{type(error).__name__}: {error}") from error

    @asynccontextmanager
    async def tool(self, ctx: Context[Any, Any], *, read_only: bool = False) -> AsyncIterator[UnitOfWork]:
        """A unit of work of the request's tenant; memorm's errors leave as `ToolError`.

        A failed call's unit of work is rolled back: nothing of it was written.
        """
        with self.tool_errors():
            async with self.db.for_tenant(self.tenant_of(ctx)).unit_of_work(read_only=read_only) as uow:
                yield uow

    @asynccontextmanager
    async def resource(self, ctx: Context[Any, Any]) -> AsyncIterator[UnitOfWork]:
        """A read-only unit of work of the request's tenant; memorm's errors leave as resource errors."""
        try:
            async with self.db.for_tenant(self.tenant_of(ctx)).unit_of_work(read_only=True) as uow:
                yield uow
        except NotFoundError as error:
            raise ResourceNotFoundError(str(error)) from error
        except MemormError as error:
            raise ResourceError(f"{type(error).__name__}: {error}") from error
