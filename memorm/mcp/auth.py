"""Bearer tokens on the SDK's own auth hooks: a `TokenVerifier` that maps each token to its tenant.

The SDK's bearer middleware asks `TenantTokens.verify_token` about each
request's `Authorization: Bearer …` header; a token the `TokenTable` does not
know (or no header) leaves the request unauthenticated, and the SDK answers 401
before any tool runs.  The access token carries the tenant as a claim, which
`memorm.mcp.scope.Scope` reads on every call; it never holds the token itself,
only a prefix of its hash's hex digits, so no log of it shows a credential.
"""

from __future__ import annotations

import hashlib

from memorm.compat._extras import missing_extra

try:
    from mcp.server.auth.provider import AccessToken, TokenVerifier
    from mcp.server.auth.settings import AuthSettings
    from pydantic import AnyHttpUrl
except ImportError as error:
    raise missing_extra(__name__, "mcp", error) from error

from memorm.mcp.scope import TENANT_CLAIM
from memorm.mcp.tokens import TokenTable

__all__ = ["TenantTokens", "auth_settings", "verifier"]


class TenantTokens:
    """The SDK's `TokenVerifier` over a `TokenTable`: a known token's tenant, as an access token."""

    def __init__(self, table: TokenTable) -> None:
        self.table = table

    async def verify_token(self, token: str) -> AccessToken | None:
        """An access token naming the tenant of `token`, or None for an unknown token."""
        tenant = self.table.tenant_of(token)
        if tenant is None:
            return None
        # The client is the tenant; the subject tells two tokens of one tenant apart (the SDK
        # binds each HTTP session to the principal that opened it).
        subject = hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        return AccessToken(
            token=subject, client_id=tenant, scopes=[], subject=subject, claims={TENANT_CLAIM: tenant}
        )


def verifier(table: TokenTable) -> TokenVerifier:
    """The verifier the SDK's bearer middleware calls for each request."""
    return TenantTokens(table)


def auth_settings(issuer_url: str) -> AuthSettings:
    """The SDK's auth settings for static bearer tokens: required on every request, no OAuth routes.

    No resource server URL: the server publishes no OAuth metadata, so a
    client is not sent looking for an authorization server; it is configured
    with its token.
    """
    return AuthSettings(issuer_url=AnyHttpUrl(issuer_url), resource_server_url=None)
