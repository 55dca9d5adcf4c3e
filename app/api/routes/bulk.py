"""Bulk operations: one action over every execution a filter matches, carried
out by workers in bounded batches; progress and failures per execution."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import asyncpg
from fastapi import APIRouter, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from pydantic import ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from app.api.auth import Operator, actor
from app.api.common import (
    ERRORS,
    FORBIDDEN,
    UNAUTHENTICATED,
    _body_schema,
    _invalid,
    _json,
    _optional_body,
    _optional_body_schema,
    refusal,
)
from app.api.deps import SettingsDep, StoreDep
from app.api.errors import ApiError
from app.api.models import (
    EXECUTION_ID_PATTERN,
    ID_PATTERN,
    JSON_INTEGER,
    Camel,
    Status,
    TimeString,
    in_utc,
)
from app.api.routes.operations import ActorBody, StepError
from app.commands.operations import OPERATION_ID as OPERATION_ID_RE
from app.commands.operations import (
    check_operation_id,
    operation_not_found,
    start_operation,
    stop_operation,
)
from app.store.records import OperationRecord

router = APIRouter(prefix="/v1/operations", tags=["bulk operations"],
                   responses={**UNAUTHENTICATED, **FORBIDDEN})

OPERATION_ID = f"^{OPERATION_ID_RE.pattern}$"  # the documented path pattern

class OperationFilter(Camel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=False, extra="forbid")

    workflow_id: str | None = Field(None, pattern=ID_PATTERN)
    status: Status | None = None
    admitted_from: TimeString | None = Field(None, description="admittedAt at or after (RFC 3339).")
    admitted_to: TimeString | None = Field(None, description="admittedAt before (RFC 3339).")
    min_unacknowledged_deliveries: Annotated[
        int, Field(ge=0, le=2**31 - 1), JSON_INTEGER] | None = None
    execution_ids: list[Annotated[str, Field(pattern=EXECUTION_ID_PATTERN)]] | None = Field(
        None, min_length=1, max_length=10_000)


class BulkResolution(Camel):
    model_config = ConfigDict(extra="forbid")
    action: Literal["retry", "succeed", "fail"] = "retry"
    result: Any = None
    error: StepError | None = None


class OperationRequest(Camel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=False, extra="forbid")

    action: Literal["cancel", "redrive", "resume", "resolve"]
    filter: OperationFilter = Field(description="At least one condition; the executions it "
                                    "matches when the operation is created are its items.")
    # strict: only true or false (0 would read as false and act on every match).
    dry_run: bool = Field(False, strict=True,
                          description="Answer the count and a sample; act on nothing.")
    reason: str | None = Field(None, max_length=2000)
    by: str | None = Field(None, max_length=200)
    from_step: str | None = Field(None, pattern=ID_PATTERN, description="redrive: fromStep.")
    timeout_seconds: float | None = Field(None, gt=0, le=10 * 365 * 86400, strict=True,
                                          description="redrive: the new deadline from now.")
    resolution: BulkResolution | None = Field(
        None, description="resolve: what to decide for each execution's parked step "
        "(default retry).")


class OperationView(Camel):
    operation_id: str
    action: str
    status: Literal["running", "completed", "cancelled"]
    filter: dict[str, Any]
    reason: str | None
    by: str
    matched: int
    done: int
    failed: int
    pending: int
    failures: list[dict[str, Any]] = Field(
        description="The first 100 executions the action failed on: executionId, code, message.")
    created_at: Any
    finished_at: Any


class DryRun(Camel):
    dry_run: Literal[True]
    matched: int
    sample: list[str]


def _beyond_utc(moment: datetime) -> bool:
    """Whether `moment`'s offset puts it before year 1 or after 9999 in UTC."""
    try:
        moment.astimezone(UTC)
    except OverflowError:
        return True
    return False


def _view(row: OperationRecord) -> dict:
    return {
        "operationId": row["operation_id"], "action": row["action"], "status": row["status"],
        "filter": row["filter"], "reason": row["reason"], "by": row["created_by"],
        "matched": row["matched"], "done": row["done"], "failed": row["failed"],
        "pending": row["pending"],
        "failures": [{"executionId": f["execution_id"], "code": f["code"],
                      "message": f["message"]} for f in row["failures"]],
        "createdAt": row["created_at"], "finishedAt": row["finished_at"],
    }


@router.post(
    "",
    status_code=202,
    response_model=OperationView,
    summary="Start a bulk action (cancel, redrive, resume, resolve) over the executions a filter "
    "matches; with dryRun, only count them",
    openapi_extra=_body_schema(OperationRequest),
    responses={**ERRORS,
               200: {"model": DryRun, "description": "dryRun: the count and a sample"},
               422: refusal("INVALID_REQUEST / TOO_MANY_MATCHED / INVALID_EXECUTION_EVENT")},
)
async def create(request: Request, store: StoreDep, settings: SettingsDep, principal: Operator):
    body = await _json(request, settings)
    try:
        req = OperationRequest.model_validate(body)
    except ValidationError as exc:
        raise _invalid(exc, "INVALID_REQUEST") from None
    spec = req.filter.model_dump(by_alias=True, exclude_none=True, mode="json")
    if not spec:
        raise ApiError(422, "INVALID_REQUEST",
                       "filter: give at least one condition (workflowId, status, admittedFrom, "
                       "admittedTo, minUnacknowledgedDeliveries, executionIds)")
    for when in (req.filter.admitted_from, req.filter.admitted_to):
        if when is not None and when.tzinfo is None:
            raise ApiError(422, "INVALID_REQUEST", "admittedFrom / admittedTo: give a time "
                           "zone offset (for example 2026-01-01T00:00:00Z)")
    for name, when in (("admittedFrom", req.filter.admitted_from),
                       ("admittedTo", req.filter.admitted_to)):
        if when is not None and _beyond_utc(when):
            # Before year 1 in UTC is before every admission and after 9999
            # after every one: the nearest time UTC holds matches the same
            # executions, and Postgres refuses the time itself.
            spec[name] = (in_utc(when) or datetime.min.replace(tzinfo=UTC)).isoformat()
    # A resolution of fail records its error, whatever the action: a request
    # the schema calls invalid is refused, a dry run's included.
    if (req.resolution is not None and req.resolution.action == "fail"
            and req.resolution.error is None):
        raise ApiError(422, "INVALID_REQUEST", "resolution: fail needs error {name, message}")
    if req.dry_run:
        matched, sample = await store.operations.preview_operation(spec)
        return JSONResponse({"dryRun": True, "matched": matched, "sample": sample})
    options: dict[str, Any] = {}
    if req.action == "redrive":
        options = {k: v for k, v in (("fromStep", req.from_step),
                                     ("timeoutSeconds", req.timeout_seconds)) if v is not None}
    if req.action == "resolve":
        resolution = req.resolution or BulkResolution()
        options = {"resolution": jsonable_encoder(resolution.model_dump(exclude_none=False))}
    try:
        record = await start_operation(store, req.action, spec, actor(principal, req.by),
                                       options=options, reason=req.reason,
                                       max_matched=settings.max_operation_executions)
    except asyncpg.DataError as exc:
        # The one JSON value from the body not yet held to what jsonb stores
        # exactly is a resolution's result (a float that would come back an
        # integer); the statement failed whole, so nothing was stored.
        if req.action != "resolve":
            raise
        raise ApiError(422, "INVALID_EXECUTION_EVENT",
                       f"resolution.result cannot be stored exactly ({exc}); "
                       "send plain JSON values") from None
    return JSONResponse(jsonable_encoder(_view(record)), status_code=202,
                        headers={"Location": f"/v1/operations/{record['operation_id']}"})


@router.get("/{operation_id}", response_model=OperationView,
            summary="An operation's progress and the executions it failed on",
            responses={404: refusal("OPERATION_NOT_FOUND"),
                       503: ERRORS[503]})
async def get(operation_id: str, store: StoreDep, principal: Operator):
    check_operation_id(operation_id)
    record = await store.operations.get_operation(operation_id)
    if record is None:
        raise operation_not_found(operation_id)
    return _view(record)


@router.post(
    "/{operation_id}/cancel",
    status_code=202,
    response_model=OperationView,
    summary="Stop an operation: what is done stays done, the rest is not acted on",
    openapi_extra=_optional_body_schema(ActorBody),
    responses={**ERRORS, 404: refusal("OPERATION_NOT_FOUND"),
               409: refusal("OPERATION_FINISHED")},
)
async def cancel(operation_id: str, request: Request, store: StoreDep, settings: SettingsDep,
                 principal: Operator):
    check_operation_id(operation_id)
    body = await _optional_body(request, settings, ActorBody)
    return _view(await stop_operation(store, operation_id, actor(principal, body.by)))
