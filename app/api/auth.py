"""Bearer API tokens and roles.

| role | may |
|---|---|
| `trigger` | admit; read, wake and signal the executions it admitted |
| `read` | every read, `/metrics` |
| `operate` | cancel, resolve, resume, wake, signal, plus everything `read` may |

A token looks like `fp_<id>_<secret>`: the id finds the row, the secret is
compared (constant time) with the stored SHA-256. A token of any other shape
is refused before any cache or query. Only verified tokens are cached (for a
few seconds, keyed by the token's SHA-256, in a bounded LRU), so a revocation
takes effect within AUTH_CACHE_SECONDS and junk costs no memory.
With FENCEPOST_AUTH=disabled every request acts as an `operate`+`trigger`
principal named "anonymous".
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request

from app.api.errors import ApiError
from app.store import ExecutionStore

log = logging.getLogger("fencepost.auth")

ROLES = ("trigger", "read", "operate")
# fp_<token id: hex>_<secret: URL-safe base64>, as new_token() makes them.
_TOKEN_SHAPE = re.compile(r"fp_([0-9a-f]{1,64})_([A-Za-z0-9_-]{1,256})")
_TOKEN_MAX_LENGTH = len("fp__") + 64 + 256
AUTH_CACHE_SECONDS = 5.0
AUTH_CACHE_ENTRIES = 1024


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


def token_parts(token: str) -> tuple[str, str] | None:
    """(token id, secret) of a token shaped as new_token() issues them, else
    None. Only this shape goes further: header text may hold anything latin-1
    (NUL included, which Postgres text refuses) and any length."""
    if len(token) > _TOKEN_MAX_LENGTH:
        return None
    match = _TOKEN_SHAPE.fullmatch(token)
    return (match[1], match[2]) if match else None


def principal_of(row: Mapping[str, Any]) -> Principal:
    """The principal of an api_tokens row (token_id, name, role)."""
    roles = {"operate", "read"} if row["role"] == "operate" else {row["role"]}
    return Principal(row["token_id"], row["name"], frozenset(roles))


class TokenVerifier:
    """Bearer tokens, checked cheaply: a token of the wrong shape is refused
    before the cache or the database; a well-shaped one costs one primary-key
    read. Only verified tokens are remembered, keyed by the SHA-256 of the
    token (never the header itself), at most `max_entries` of them (least
    recently used out), each for AUTH_CACHE_SECONDS."""

    def __init__(self, store: ExecutionStore, *, max_entries: int = AUTH_CACHE_ENTRIES):
        self.store = store
        self.max_entries = max_entries
        self._cache: OrderedDict[str, tuple[float, Principal]] = OrderedDict()

    async def verify(self, token: str) -> Principal | None:
        parts = token_parts(token)
        if parts is None:
            return None
        key = hashlib.sha256(token.encode()).hexdigest()
        cached = self._cache.get(key)
        if cached is not None:
            if cached[0] > time.monotonic():
                self._cache.move_to_end(key)
                return cached[1]
            self._cache.pop(key, None)
        principal = await self._lookup(*parts)
        if principal is not None:
            self._cache[key] = (time.monotonic() + AUTH_CACHE_SECONDS, principal)
            self._cache.move_to_end(key)
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
        return principal

    async def _lookup(self, token_id: str, secret: str) -> Principal | None:
        row = await self.store.tokens.find_token(token_id)
        expected = row["secret_sha256"] if row else _digest("no such token")
        matches = hmac.compare_digest(expected, _digest(secret))
        if row is None or not matches:
            return None
        return principal_of(row)


def _unauthenticated(request: Request, message: str, reason: str,
                     token_id: str | None = None) -> ApiError:
    # One line per refusal: the reason, the caller and the token's public ID
    # when it has one; never the token (its secret part) itself.
    client = request.client.host if request.client else None
    log.warning("authentication failed (%s): %s %s from %s", reason, request.method,
                request.url.path, client,
                extra={"kind": "auth_failure", "reason": reason, "client": client,
                       "path": request.url.path, "token_id": token_id})
    return ApiError(401, "UNAUTHENTICATED", message, headers={"WWW-Authenticate": "Bearer"})


async def authenticate(request: Request) -> Principal:
    if request.app.state.settings.auth == "disabled":
        return ANONYMOUS
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _unauthenticated(
            request,
            "send an API token as 'Authorization: Bearer fp_...'; "
            "create one with `fencepost tokens create --role ROLE --name NAME`",
            "no bearer token",
        )
    principal: Principal | None = await request.app.state.verifier.verify(token.strip())
    if principal is None:
        parts = token_parts(token.strip())
        raise _unauthenticated(request, "the API token is unknown or revoked; create a new one",
                               "unknown or revoked token", parts[0] if parts else None)
    return principal


def require(*roles: str) -> Callable[[Request], Awaitable[Principal]]:
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


def actor(principal: Principal, given: str | None) -> str:
    """Who a decision is recorded as: the token's name; without auth, what
    the caller says (or "api")."""
    if principal.token_id is not None:
        return principal.name
    return given or "api"
