"""Bearer tokens of `memorm mcp --transport http`: each token names one tenant, kept hashed.

The tokens file maps each tenant to the SHA-256 hash of its token, or to a
list of hashes (several clients, or an old and a new token while rotating):

```json
{
  "acme": "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
  "globex": ["sha256:60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752"]
}
```

`memorm mcp hash-token` prints the line for a token.  The server never holds
the tokens themselves: it hashes what a request presents and compares it with
every stored hash in constant time (`hmac.compare_digest`), so neither the file
nor the time an answer takes tells what a token is.  This module imports
nothing of the MCP SDK.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Mapping
from pathlib import Path

from memorm.errors import ValidationError
from memorm.tenancy import check_tenant

__all__ = ["MIN_TOKEN_LENGTH", "PREFIX", "TokenTable", "hash_token", "new_token"]

PREFIX = "sha256:"
"""How a stored hash starts: the algorithm, so another can be added later."""

MIN_TOKEN_LENGTH = 16
"""The shortest token `hash_token` accepts: a bearer token must not be guessable."""

_HEX_LENGTH = 64


def _digest(token: str) -> bytes:
    # surrogatepass: any str a header can carry encodes, and distinct strings stay distinct.
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def hash_token(token: str) -> str:
    """The stored form of `token`: `sha256:` and the hex digest of its UTF-8 bytes.

    Raises:
        ValidationError: the token is shorter than `MIN_TOKEN_LENGTH`, or has
            whitespace or control characters (which an `Authorization` header
            would not carry intact).
    """
    if len(token) < MIN_TOKEN_LENGTH:
        raise ValidationError(f"a token needs at least {MIN_TOKEN_LENGTH} characters, got {len(token)}")
    if any(char.isspace() or not char.isprintable() for char in token):
        raise ValidationError("a token may not hold whitespace or control characters")
    return PREFIX + _digest(token).hex()


def new_token() -> str:
    """A new random token: 32 bytes from `secrets`, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(32)


def _parse_hash(value: object, where: str) -> bytes:
    if not isinstance(value, str) or not value.startswith(PREFIX):
        raise ValidationError(f"{where}: expected a hash as `memorm mcp hash-token` prints it (sha256:…)")
    text = value.removeprefix(PREFIX)
    try:
        if len(text) != _HEX_LENGTH:
            raise ValueError(text)
        return bytes.fromhex(text)
    except ValueError:
        raise ValidationError(f"{where}: expected 64 hex digits after {PREFIX!r}") from None


class TokenTable:
    """Which tenant a bearer token belongs to, from the tokens' hashes.

    Args:
        hashes: tenant -> a hash (`sha256:<hex>`) or a list of them.

    Raises:
        ValidationError: a tenant name memorm refuses, a malformed hash, no
            hash at all, or one hash given to two tenants.

    Example:
        ```python
        table = TokenTable({"acme": hash_token(token)})
        assert table.tenant_of(token) == "acme"
        ```
    """

    def __init__(self, hashes: Mapping[str, str | list[str]]) -> None:
        if not isinstance(hashes, Mapping):
            raise ValidationError(
                "tokens: expected a JSON object of tenant -> sha256 hash (or a list of them)"
            )
        entries: list[tuple[bytes, str]] = []
        owners: dict[bytes, str] = {}
        for name, given in hashes.items():
            tenant = check_tenant(name)
            values = given if isinstance(given, list) else [given]
            if not values:
                raise ValidationError(f"tokens: tenant {tenant!r} has no token hash")
            for index, value in enumerate(values):
                where = f"tokens[{tenant!r}]" + (f"[{index}]" if isinstance(given, list) else "")
                digest = _parse_hash(value, where)
                if owners.setdefault(digest, tenant) != tenant:
                    raise ValidationError(f"{where}: the same token hash is given to {owners[digest]!r} too")
                entries.append((digest, tenant))
        if not entries:
            raise ValidationError("tokens: no tenant has a token: no request could be served")
        self._entries = entries

    @classmethod
    def from_file(cls, path: str | Path) -> TokenTable:
        """The table in a JSON file (see the module's docstring); `ValidationError` names what is wrong."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ValidationError(f"tokens file {path}: not JSON ({error})") from None
        if not isinstance(data, dict):
            raise ValidationError(f"tokens file {path}: expected a JSON object of tenant -> sha256 hash")
        return cls(data)

    @property
    def tenants(self) -> list[str]:
        """The tenants that have a token, each once, in the file's order."""
        return list(dict.fromkeys(tenant for _, tenant in self._entries))

    def tenant_of(self, token: str) -> str | None:
        """The tenant whose token this is, or None for an unknown token.

        Every stored hash is compared, in constant time each, whichever matches.
        """
        digest = _digest(token)
        found: str | None = None
        for stored, tenant in self._entries:
            if hmac.compare_digest(digest, stored):
                found = tenant
        return found

    def __repr__(self) -> str:
        return f"TokenTable(tenants={self.tenants!r})"  # never the hashes
