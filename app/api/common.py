"""Pieces every route module shares: strict JSON bodies, path ID checks,
validation errors in the one error shape, documented error responses."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from fastapi import Depends, Request, Response
from fastapi.routing import APIRoute
from fastapi.telemetry import get_telemetry_data
from pydantic import BaseModel, ValidationError

from app.api.errors import ApiError, not_found
from app.api.json_body import check_content_type, parse_json, read_body
from app.api.models import ErrorBody
from app.commands.errors import UNSTORABLE_TEXT, invalid
from app.commands.redrive import check_params

Body = TypeVar("Body", bound=BaseModel)

# A route's documented responses, by status, as FastAPI takes them.
Responses = dict[int | str, dict[str, Any]]


class DirectRoute(APIRoute):
    """A route whose endpoint takes only the Request and returns a Response
    it rendered itself: called directly, with no dependency solving and no
    response model applied (both would do nothing for it but cost time).
    Documented like any route. While FastAPI's own telemetry records a
    request (a tracer or meter provider is set), FastAPI's handler runs it
    instead, so its operation spans are as for every route."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        endpoint = self.endpoint

        async def direct(request: Request) -> Response:
            if get_telemetry_data() is not None:
                return await handler(request)
            return await endpoint(request)

        return direct


def refusal(description: str) -> dict[str, Any]:
    """A documented error response: the one error body, and which codes
    (with when) the status stands for."""
    return {"model": ErrorBody, "description": description}


# 401 on every authenticated route; 403 only on routes some role may not use
# (a documented status must be one a request can produce).
UNAUTHENTICATED: Responses = {
    401: refusal("UNAUTHENTICATED: no valid API token"),
}
FORBIDDEN: Responses = {
    403: refusal("FORBIDDEN: the token's role does not allow this"),
}
AUTH_ERRORS: Responses = {**UNAUTHENTICATED, **FORBIDDEN}

ERRORS: Responses = {
    400: refusal("MALFORMED_JSON"),
    408: refusal("REQUEST_TIMEOUT: the body did not arrive in time "
                 "(FENCEPOST_BODY_TIMEOUT_SECONDS)"),
    413: refusal("PAYLOAD_TOO_LARGE"),
    415: refusal("UNSUPPORTED_MEDIA_TYPE"),
    422: refusal("INVALID_REQUEST / INVALID_EXECUTION_EVENT: a "
                 "malformed request / a value that cannot be stored exactly (NaN, NUL, duplicate keys, "
                 "too deep)"),
    503: refusal("DATABASE_UNAVAILABLE"),
}
INVALID_QUERY: Responses = {
    422: refusal("INVALID_REQUEST / UNKNOWN_QUERY_PARAMETER: a "
                 "query parameter is malformed or out of range / not one this route takes"),
}
UNKNOWN_QUERY: Responses = {
    422: refusal("UNKNOWN_QUERY_PARAMETER: a query parameter this "
                 "route does not take"),
}

def _query_names(dependant) -> set[str]:
    """The query parameters a route declares, its dependencies' included."""
    names = {p.alias for p in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


async def _strict_query(request: Request) -> None:
    """A query parameter the route does not declare is refused, never ignored:
    a misspelt filter (`blockedby=`) would otherwise return everything."""
    route = request.scope.get("route")
    if route is None or not request.query_params:
        return
    accepted = sorted(_query_names(route.dependant))  # only when a query is sent: cheap
    for name in request.query_params:
        if name not in accepted:
            raise ApiError(
                422, "UNKNOWN_QUERY_PARAMETER",
                f"unknown query parameter {name!r}; this route takes "
                + (", ".join(accepted) if accepted else "no query parameters")
                + " (names are case-sensitive)",
                parameter=name,
            )


# On every /v1 router: dependencies=[STRICT_QUERY].
STRICT_QUERY = Depends(_strict_query)


def _inline_defs(schema: dict) -> dict:
    """pydantic puts nested models under `$defs` and refers to them as
    `#/$defs/Name`, which in an OpenAPI document points at the document's
    root, where there is no `$defs`: inline them (no body model is recursive)."""
    defs = schema.pop("$defs", {})

    def walk(node):
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                rest = {k: v for k, v in node.items() if k != "$ref"}
                return walk({**defs[ref.removeprefix("#/$defs/")], **rest})
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(schema)


def _body_schema(model) -> dict:
    """Bodies are read and parsed strictly by hand (duplicate keys, NaN,
    \\u0000, depth); this documents them in the OpenAPI schema all the same."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {
                "schema": _inline_defs(model.model_json_schema(by_alias=True))}},
        }
    }


def _optional_body_schema(model) -> dict:
    """An optional body: absent, the model as a JSON object, or JSON `null`
    (read as no body)."""
    schema = _inline_defs(model.model_json_schema(by_alias=True))
    return {
        "requestBody": {
            "required": False,
            "content": {"application/json": {"schema": {
                "anyOf": [schema, {"type": "null", "description": "The same as no body."}],
            }}},
        }
    }


_UNSTORABLE_TEXT = UNSTORABLE_TEXT


def _check_path_id(execution_id: str) -> None:
    if _UNSTORABLE_TEXT.search(execution_id):
        raise not_found(execution_id)


async def _json(request: Request, settings) -> object:
    """The whole body, read within FENCEPOST_BODY_TIMEOUT_SECONDS (408
    REQUEST_TIMEOUT after), parsed strictly. Routes read their body before
    they do anything else with the request."""
    check_content_type(request)
    raw = await read_body(request, settings.max_payload_bytes, settings.body_timeout_seconds)
    return parse_json(raw, max_depth=settings.max_json_depth)


async def _optional_json(request: Request, settings) -> object | None:
    """An optional body (none declared: None), read and parsed like `_json`."""
    if request.headers.get("content-length", "0") == "0" and "transfer-encoding" not in request.headers:
        return None
    return await _json(request, settings)


async def _optional_body(request: Request, settings: Any, model: type[Body]) -> Body:
    """An optional body (absent or `null`: no fields) read like `_json` and
    validated as `model` (422 INVALID_REQUEST)."""
    body = await _optional_json(request, settings)
    try:
        return model.model_validate(body if body is not None else {})
    except ValidationError as exc:
        raise invalid(exc, "INVALID_REQUEST") from None


def owner_of(principal) -> str | None:
    """The owner predicate's value for a principal: a trigger-only token's ID
    (it sees and touches only what it admitted), else None (no predicate)."""
    return principal.token_id if principal.owns_only() else None


def sees_tracebacks(principal) -> bool:
    """Tracebacks of failed executions are for `read` and `operate`; a
    trigger token sees an error's name and message only."""
    return principal.may("read", "operate")


def error_for(principal, error):
    """An error object as `principal` may see it."""
    if sees_tracebacks(principal) or not isinstance(error, dict):
        return error
    return {k: error[k] for k in ("name", "message") if k in error}


def detail_for(principal, detail):
    """An event's detail as `principal` may see it (no traceback for trigger)."""
    if sees_tracebacks(principal) or not isinstance(detail, dict):
        return detail
    out = {k: v for k, v in detail.items() if k != "traceback"}
    if isinstance(out.get("error"), dict):
        out["error"] = error_for(principal, out["error"])
    return out


def outcome_for(principal, outcome):
    """A record's outcome as `principal` may see it."""
    if sees_tracebacks(principal) or not isinstance(outcome, dict) or "error" not in outcome:
        return outcome
    return {**outcome, "error": error_for(principal, outcome["error"])}


_invalid = invalid


def registered_workflow(request: Request, workflow_id: str, params: Any):
    """The workflow's definition with `params` checked against its model, or
    None when the API was started without a registry (any workflow is
    accepted then). 404 WORKFLOW_NOT_FOUND / 422 INVALID_PARAMS otherwise."""
    return check_params(request.app.state.workflows, workflow_id, params)
