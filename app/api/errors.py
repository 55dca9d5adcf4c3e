"""The one error shape: `{"error": {"code": "...", "message": "..."}}`.

Every error a caller can cause has a stable code and a sentence saying what
to do. A database failure (app/dberrors.py: by SQLSTATE class) is 503
`DATABASE_UNAVAILABLE` with `Retry-After`; a statement the database refuses
as not supported is 501 `NOT_SUPPORTED_BY_DATABASE`; nothing a request does
produces a 500.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import asyncpg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.api.json_body import BodyError, error_body
from app.commands.errors import CommandError, execution_not_found
from app.dberrors import (
    INFRASTRUCTURE_ERRORS,
    is_infrastructure,
    is_retryable_conflict,
    sqlstate_of,
)

log = logging.getLogger("fencepost.api")

RETRY_AFTER_SECONDS = 2


# The API answers every refusal a command raises; ApiError is the same type
# under the name the API's own checks use.
ApiError = CommandError


def error_response(http_status: int, code: str, message: str, headers: dict | None = None,
                   **extra: Any) -> JSONResponse:
    return JSONResponse(error_body(code, message, **extra), status_code=http_status, headers=headers)


def not_found(execution_id: str) -> ApiError:
    return execution_not_found(execution_id)


# Which errors mean "the database failed" is decided in one place,
# app/dberrors.py, by SQLSTATE class (08, 40, 53, 57, 58, 25006, 55P03, ...)
# and, client side, by exception type. The handlers below are registered for
# those types and for every asyncpg.PostgresError (an unknown code in an
# infrastructure class arrives as UnknownPostgresError); any other database
# error is a bug and stays a 500, logged with its trace.
# A handler is registered per type, and handlers take Exceptions: every one
# of these is one (checked at import).
_DATABASE_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresError, *INFRASTRUCTURE_ERRORS,
)
DATABASE_ERROR_TYPES: tuple[type[Exception], ...] = tuple(
    t for t in _DATABASE_ERRORS if issubclass(t, Exception))
assert len(DATABASE_ERROR_TYPES) == len(_DATABASE_ERRORS)

_HTTP_CODES = {
    404: ("NOT_FOUND", "no such route; the API is described at /openapi.json"),
    405: ("METHOD_NOT_ALLOWED", "this route does not accept that method; see /openapi.json"),
}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.http_status, exc.code, exc.message, headers=exc.headers,
                              **exc.extra)

    @app.exception_handler(BodyError)
    async def _body_error(_: Request, exc: BodyError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            {"loc": [str(p) for p in e.get("loc", ())], "message": e.get("msg", "")}
            for e in exc.errors()
        ]
        first = problems[0] if problems else {"loc": [], "message": "invalid request"}
        return error_response(
            422,
            "INVALID_REQUEST",
            f"{'.'.join(first['loc'])}: {first['message']}; fix the request and send it again",
            details=problems,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code, message = _HTTP_CODES.get(exc.status_code, ("HTTP_ERROR", str(exc.detail)))
        headers = getattr(exc, "headers", None)
        documented = allowed_methods(request) if exc.status_code == 405 else None
        if documented:
            # Each method of a path is its own route: the router names only
            # the first one it tried; the answer names every documented one.
            headers = {**(headers or {}), "Allow": ", ".join(documented)}
        return error_response(exc.status_code, code, message, headers=headers)

    for error_type in DATABASE_ERROR_TYPES:
        app.add_exception_handler(error_type, _database_error)


def allowed_methods(request: Request) -> list[str] | None:
    """The documented methods of the request's path (from the published
    OpenAPI document), or None for a path it does not describe."""
    path = request.url.path
    for template, operations in request.app.openapi().get("paths", {}).items():
        pattern = "^" + re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, path):
            return sorted(method.upper() for method in operations)
    return None


def database_unavailable(exc: BaseException) -> JSONResponse:
    """503 DATABASE_UNAVAILABLE with Retry-After, for an infrastructure error."""
    log.warning("database unavailable: %s: %s", type(exc).__name__, exc)
    if is_retryable_conflict(exc):  # the store already retried it a few times
        what = "the request kept conflicting with concurrent requests"
    else:
        what = "the database is unavailable"
    return error_response(
        503,
        "DATABASE_UNAVAILABLE",
        f"{what}; retry after {RETRY_AFTER_SECONDS} seconds",
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


# A statement the database refuses as not supported (SQLSTATE 0A000): on a
# Citus cluster, an operation not yet written to reach one shard
# (docs/citus.md lists them). Not the caller's fault and nothing was
# changed (the statement was refused whole): 501 with a stable code, the
# trace logged as for any bug.
FEATURE_NOT_SUPPORTED = "0A000"


async def _database_error(_: Request, exc: Exception) -> JSONResponse:
    if sqlstate_of(exc) == FEATURE_NOT_SUPPORTED:
        log.error("the database refused an operation as not supported", exc_info=exc)
        return error_response(
            501, "NOT_SUPPORTED_BY_DATABASE",
            f"the database refused this operation as not supported ({exc}); nothing was "
            "changed. On a Citus cluster, docs/citus.md lists what is not supported there "
            "yet; the routes that act on one execution (cancel, resume, resolve, redrive, "
            "signals, wakes) are")
    if not is_infrastructure(exc):
        # Not the database failing but a statement the code got wrong: re-raised,
        # the server answers 500 and logs the trace, so the bug stays visible.
        raise exc
    return database_unavailable(exc)
