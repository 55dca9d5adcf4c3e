"""The published OpenAPI schema: FastAPI's, with two corrections so that it
says exactly what the API does (schemathesis holds it to that, see
tests/hostile):

- FastAPI documents a 422 `HTTPValidationError` ({"detail": [...]}) on every
  route with parameters. This API answers validation errors in the one error
  shape, and documents 422 with `ErrorBody` on each route that can produce
  one; the generated entries are removed (on a route whose only parameter is
  an unconstrained path string no 422 can happen at all).
- Authentication: a bearer security scheme, required by every operation that
  documents 401.

And three additions for client generators and testers:

- Readable, stable operation IDs (`admitExecution`, `getExecution`, ...), one
  per operation, from OPERATION_IDS; an operation missing there fails the
  schema's test, so a new route cannot ship with FastAPI's generated name.
- OpenAPI links from the answers that carry an ID (admission, fork, listing,
  schedule and operation creation) to the operations that take it.
- The rules the server holds a request body to beyond each field's own type
  (STATED_RULES): which fields go together, a cron expression's shape, a
  filter that names at least one condition; so a request the schema calls
  valid is not refused for a reason the schema hides.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

_GENERATED_422 = "#/components/schemas/HTTPValidationError"
_SECURITY_SCHEME = {
    "type": "http",
    "scheme": "bearer",
    "description": "An API token (fp_<id>_<secret>) from "
    "`fencepost tokens create --role trigger|read|operate --name NAME`.",
}


def _refers_to(node: Any, ref: str) -> bool:
    if isinstance(node, dict):
        return node.get("$ref") == ref or any(_refers_to(v, ref) for v in node.values())
    if isinstance(node, list):
        return any(_refers_to(v, ref) for v in node)
    return False


# (method, path) -> operationId. Generated clients name their methods after these.
OPERATION_IDS: dict[tuple[str, str], str] = {
    ("get", "/healthz"): "getHealth",
    ("get", "/readyz"): "getReadiness",
    ("post", "/v1/executions"): "admitExecution",
    ("get", "/v1/executions"): "listExecutions",
    ("get", "/v1/executions/{execution_id}"): "getExecution",
    ("post", "/v1/executions/{execution_id}/wakes"): "wakeExecution",
    ("post", "/v1/executions/{execution_id}/signals/{name}"): "signalExecution",
    ("post", "/v1/executions/{execution_id}/cancel"): "cancelExecution",
    ("post", "/v1/executions/{execution_id}/terminate"): "terminateExecution",
    ("post", "/v1/executions/{execution_id}/redrive"): "redriveExecution",
    ("post", "/v1/executions/{execution_id}/fork"): "forkExecution",
    ("post", "/v1/executions/{execution_id}/steps/{step_key}/resolve"): "resolveStep",
    ("post", "/v1/executions/{execution_id}/resume"): "resumeExecution",
    ("post", "/v1/executions/{execution_id}/version"): "moveExecutionVersion",
    ("post", "/v1/version-moves"): "moveExecutionsVersion",
    ("get", "/v1/executions/{execution_id}/events"): "listExecutionEvents",
    ("get", "/v1/executions/{execution_id}/steps"): "listExecutionSteps",
    ("get", "/v1/executions/{execution_id}/history"): "getExecutionHistory",
    ("get", "/v1/executions/{execution_id}/late-observations"): "listLateObservations",
    ("post", "/v1/operations"): "createOperation",
    ("get", "/v1/operations/{operation_id}"): "getOperation",
    ("post", "/v1/operations/{operation_id}/cancel"): "cancelOperation",
    ("get", "/v1/workers"): "listWorkers",
    ("get", "/metrics"): "getMetrics",
    ("post", "/v1/schedules"): "createSchedule",
    ("get", "/v1/schedules"): "listSchedules",
    ("get", "/v1/schedules/{schedule_id}"): "getSchedule",
    ("delete", "/v1/schedules/{schedule_id}"): "deleteSchedule",
    ("get", "/v1/schedules/{schedule_id}/events"): "listScheduleEvents",
    ("post", "/v1/schedules/{schedule_id}/pause"): "pauseSchedule",
    ("post", "/v1/schedules/{schedule_id}/resume"): "resumeSchedule",
    ("get", "/v1/queues"): "listQueues",
    ("get", "/v1/queues/{name}"): "getQueue",
    ("put", "/v1/queues/{name}"): "changeQueue",
    ("post", "/v1/queues/{name}/pause"): "pauseQueue",
    ("post", "/v1/queues/{name}/resume"): "resumeQueue",
}

_EXECUTION_OPS = ("getExecution", "listExecutionEvents", "listExecutionSteps",
                  "listLateObservations", "wakeExecution", "cancelExecution",
                  "terminateExecution", "redriveExecution", "forkExecution", "resumeExecution")
# (operationId, response status) -> (the ID's place in the answer, parameter, operations).
LINKS: dict[tuple[str, str], tuple[str, str, tuple[str, ...]]] = {
    ("admitExecution", "201"): ("$response.body#/executionId", "execution_id", _EXECUTION_OPS),
    ("admitExecution", "200"): ("$response.body#/executionId", "execution_id", _EXECUTION_OPS),
    ("forkExecution", "201"): ("$response.body#/executionId", "execution_id", _EXECUTION_OPS),
    ("listExecutions", "200"): ("$response.body#/executions/0/executionId", "execution_id",
                                _EXECUTION_OPS),
    ("createSchedule", "201"): ("$response.body#/scheduleId", "schedule_id",
                                ("getSchedule", "listScheduleEvents", "pauseSchedule",
                                 "resumeSchedule", "deleteSchedule")),
    ("createOperation", "202"): ("$response.body#/operationId", "operation_id",
                                 ("getOperation", "cancelOperation")),
}


def _path_patterns() -> dict[str, str]:
    """The shape the server holds each path parameter to, by name."""
    from app.api.models import EXECUTION_ID_PATTERN, ID_PATTERN
    from app.api.routes.bulk import OPERATION_ID
    from app.registry import SCHEDULE_ID_RE

    return {"execution_id": EXECUTION_ID_PATTERN, "step_key": ID_PATTERN, "name": ID_PATTERN,
            "schedule_id": SCHEDULE_ID_RE.pattern, "operation_id": OPERATION_ID}


def _name_and_link(schema: dict) -> None:
    patterns = _path_patterns()
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            operation["operationId"] = OPERATION_IDS.get(
                (method, path), operation.get("operationId"))
            for parameter in operation.get("parameters", []):
                if parameter.get("in") == "path" and parameter["name"] in patterns:
                    parameter.setdefault("schema", {})["pattern"] = patterns[parameter["name"]]
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            for status, response in operation.get("responses", {}).items():
                link = LINKS.get((operation["operationId"], status))
                if link is None:
                    continue
                where, parameter, targets = link
                response["links"] = {
                    target[0].upper() + target[1:]: {
                        "operationId": target, "parameters": {parameter: where}}
                    for target in targets}


_NOT_NULL = {"not": {"type": "null"}}


def _given(*names: str) -> dict:
    """Every one of `names` is present and not null."""
    return {"required": list(names), "properties": {n: _NOT_NULL for n in names}}


def _either_deadline_or_timeout(body: dict) -> None:
    # A deadline is absolute or relative to now, never both at once.
    body["not"] = _given("deadline", "timeoutSeconds")


def _admission(body: dict) -> None:
    # A deadline is absolute or relative to now, and so is a delayed start;
    # neither is given both ways at once.
    body["not"] = {"anyOf": [_given("deadline", "timeoutSeconds"),
                             _given("startAt", "delaySeconds")]}


def _resolution(body: dict) -> None:
    # succeed records `result` (null included) and only succeed carries one;
    # fail records `error` and only fail carries one.
    succeed = {"required": ["action"], "properties": {"action": {"const": "succeed"}}}
    fail = {"required": ["action"], "properties": {"action": {"const": "fail"}}}
    body["allOf"] = [
        {"if": succeed, "then": {"required": ["result"]}, "else": {"not": {"required": ["result"]}}},
        {"if": fail, "then": _given("error"), "else": {"properties": {"error": {"type": "null"}}}},
    ]


def _bulk_operation(body: dict) -> None:
    # A bulk operation over "every execution" is refused: the filter names
    # at least one condition (a property that is not null).
    conditions = body["properties"]["filter"]
    conditions["anyOf"] = [_given(name) for name in conditions["properties"]]
    # A resolution of fail records `error`: it is given and not null.
    [resolution] = [s for s in body["properties"]["resolution"]["anyOf"]
                    if s.get("type") == "object"]
    fail = {"required": ["action"], "properties": {"action": {"const": "fail"}}}
    resolution["if"] = fail
    resolution["then"] = _given("error")


# One cron field: `*` or a comma-separated list of `n`, `a-b`, with an
# optional `/step`; numbers or (months, weekdays) English names.
_CRON_ITEM = r"(\*|[0-9A-Za-z]+(-[0-9A-Za-z]+)?)(/[0-9]+)?"
_CRON_FIELD = rf"{_CRON_ITEM}(,{_CRON_ITEM})*"
_CRON_MACROS = "yearly|annually|monthly|weekly|daily|midnight|hourly"
CRON_PATTERN = rf"^\s*(@({_CRON_MACROS})|{_CRON_FIELD}(\s+{_CRON_FIELD}){{4}})\s*$"
# An IANA time zone name: Area/Location (UTC, Europe/Warsaw, America/Argentina/Salta).
TIMEZONE_PATTERN = r"^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$"


def _schedule(body: dict) -> None:
    body["properties"]["cron"]["pattern"] = CRON_PATTERN
    body["properties"]["timezone"]["pattern"] = TIMEZONE_PATTERN


# operationId -> the rules its request body is held to beyond its fields' types.
STATED_RULES = {
    "admitExecution": _admission,
    "redriveExecution": _either_deadline_or_timeout,
    "resolveStep": _resolution,
    "createOperation": _bulk_operation,
    "createSchedule": _schedule,
}


def _state_rules(schema: dict) -> None:
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            rule = STATED_RULES.get(operation["operationId"])
            if rule is not None:
                rule(operation["requestBody"]["content"]["application/json"]["schema"])


# Any request whose line and headers exceed FENCEPOST_MAX_HEADER_BYTES (a very
# long query string included) is refused before routing.
_HEAD_TOO_LARGE = {
    "description": "REQUEST_HEADER_FIELDS_TOO_LARGE",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
}


def tidy(schema: dict) -> dict:
    _name_and_link(schema)
    _state_rules(schema)
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            operation.setdefault("responses", {}).setdefault("431", _HEAD_TOO_LARGE)
            responses = operation.get("responses", {})
            if _refers_to(responses.get("422"), _GENERATED_422):
                del responses["422"]
            if "401" in responses:
                operation["security"] = [{"bearer": []}]
    components = schema.setdefault("components", {})
    schemas = components.get("schemas", {})
    if not _refers_to(schema.get("paths"), _GENERATED_422):
        schemas.pop("HTTPValidationError", None)
        if not _refers_to({**schema.get("paths", {}), **schemas},
                          "#/components/schemas/ValidationError"):
            schemas.pop("ValidationError", None)
    components.setdefault("securitySchemes", {})["bearer"] = _SECURITY_SCHEME
    return schema


def publish(app: FastAPI) -> None:
    """Make `app.openapi()` (and /openapi.json, /docs) serve the tidied schema."""
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = tidy(generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
