"""Bearer API tokens and roles.

| role | may |
|---|---|
| `trigger` | admit; read, wake and signal the executions it admitted |
| `read` | every read, `/metrics` |
| `operate` | cancel, resolve, resume, wake, signal, plus everything `read` may |

A token looks like `fp_<id>_<secret>`: the id finds the row, the secret is
compared (constant time) with the stored SHA-256. Verified tokens are cached
for a few seconds, so a revocation takes effect within AUTH_CACHE_SECONDS.
With FENCEPOST_AUTH=disabled every request acts as an `operate`+`trigger`
principal named "anonymous".
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from app.api.errors import ApiError
from app.store import ExecutionStore

ROLES = ("trigger", "read", "operate")
# fp_<token id: hex>_<secret: URL-safe base64>, as new_token() makes them.
_TOKEN_SHAPE = re.compile(r"fp_([0-9a-f]{1,64})_([A-Za-z0-9_-]{1,256})")
AUTH_CACHE_SECONDS = 5.0


@dataclass(frozen=True)
class Principal:
    token_id: str | None
    name: str
    roles: frozenset[str]

    def may(self, *roles: str) -> bool:
        return bool(self.roles.intersection(roles))

    def owns_only(self) -> bool:
        """A trigger-only principal sees only what it admitted."""
        return not self.may("read", "operate")


ANONYMOUS = Principal(None, "anonymous", frozenset(ROLES))


def new_token() -> tuple[str, str, str]:
    """(token_id, full token, sha256 of the secret)."""
    token_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    return token_id, f"fp_{token_id}_{secret}", _digest(secret)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class TokenVerifier:
    def __init__(self, store: ExecutionStore):
        self.store = store
        self._cache: dict[str, tuple[float, Principal | None]] = {}

    async def verify(self, token: str) -> Principal | None:
        cached = self._cache.get(token)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        principal = await self._lookup(token)
        if len(self._cache) > 10000:
            self._cache.clear()
        self._cache[token] = (time.monotonic() + AUTH_CACHE_SECONDS, principal)
        return principal

    async def _lookup(self, token: str) -> Principal | None:
        # Only the shape new_token() issues goes to the database: header text
        # may hold anything latin-1, NUL included, which Postgres text refuses.
        match = _TOKEN_SHAPE.fullmatch(token)
        if match is None:
            return None
        token_id, secret = match.groups()
        row = await self.store.find_token(token_id)
        expected = row["secret_sha256"] if row else _digest("no such token")
        matches = hmac.compare_digest(expected, _digest(secret))
        if row is None or not matches:
            return None
        roles = {"operate", "read"} if row["role"] == "operate" else {row["role"]}
        return Principal(row["token_id"], row["name"], frozenset(roles))


def _unauthenticated(message: str) -> ApiError:
    return ApiError(401, "UNAUTHENTICATED", message, headers={"WWW-Authenticate": "Bearer"})


async def authenticate(request: Request) -> Principal:
    if request.app.state.settings.auth == "disabled":
        return ANONYMOUS
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _unauthenticated(
            "send an API token as 'Authorization: Bearer fp_...'; "
            "create one with `fencepost tokens create --role ROLE --name NAME`"
        )
    principal = await request.app.state.verifier.verify(token.strip())
    if principal is None:
        raise _unauthenticated("the API token is unknown or revoked; create a new one")
    return principal


def require(*roles: str):
    """A dependency admitting principals with any of `roles`."""

    async def check(request: Request) -> Principal:
        principal = await authenticate(request)
        if not principal.may(*roles):
            raise ApiError(
                403, "FORBIDDEN",
                f"this needs a token with role {' or '.join(roles)}; "
                f"token {principal.name!r} has {', '.join(sorted(principal.roles))}",
            )
        return principal

    return check


Trigger = Annotated[Principal, Depends(require("trigger"))]
Reader = Annotated[Principal, Depends(require("trigger", "read", "operate"))]
StrictReader = Annotated[Principal, Depends(require("read", "operate"))]
Operator = Annotated[Principal, Depends(require("operate"))]
Waker = Annotated[Principal, Depends(require("trigger", "operate"))]


async def ensure_visible(store: ExecutionStore, principal: Principal, execution_id: str) -> None:
    """A trigger-only token sees only the executions it admitted; others are
    answered as if they did not exist."""
    if not principal.owns_only():
        return
    exists, owner = await store.admitted_by(execution_id)
    if exists and owner != principal.token_id:
        from app.api.errors import not_found

        raise not_found(execution_id)


def actor(principal: Principal, given: str | None) -> str:
    """Who a decision is recorded as: the token's name; without auth, what
    the caller says (or "api")."""
    if principal.token_id is not None:
        return principal.name
    return given or "api"
