"""Trying again after a failure: redrive an ended execution in place (same
ID, same idempotency keys, completed steps not run again), or fork a new
execution that copies the steps recorded before a chosen one."""

from __future__ import annotations

import secrets
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from app.api.auth import Waker, actor
from app.api.common import (
    ERRORS,
    FORBIDDEN,
    UNAUTHENTICATED,
    _body_schema,
    _check_path_id,
    _invalid,
    _optional_body_schema,
    _optional_json,
    owner_of,
    registered_workflow,
)
from app.api.deps import SettingsDep, StoreDep
from app.api.errors import ApiError, not_found
from app.api.ids import check_client_execution_id
from app.api.models import (
    EXECUTION_ID_PATTERN,
    ID_PATTERN,
    ID_RULE,
    Camel,
    ErrorBody,
    Status,
    TimeString,
)
from app.api.routes.operations import _optional_body
from app.registry import SYSTEM_ID_SEPARATOR
from app.store import InvalidEvent

router = APIRouter(prefix="/v1/executions", tags=["redrive"],
                   responses={**UNAUTHENTICATED, **FORBIDDEN})

STEP_KEY = Field(pattern=ID_PATTERN, description=f"A recorded step's key ({ID_RULE}).")


class RedriveRequest(Camel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=False, extra="forbid")

    from_step: str | None = Field(
        None, pattern=ID_PATTERN,
        description="Run again from this recorded step on (required for a completed execution). "
        "Default: from the first failed step, or the cleanup that ran after a cancel or the "
        "deadline.")
    deadline: TimeString | None = Field(None, description="The new deadline (RFC 3339 with "
                                        "offset); none given: no deadline.")
    timeout_seconds: float | None = Field(None, gt=0, le=10 * 365 * 86400, strict=True,
                                          description="The new deadline, relative to now.")
    reason: str | None = Field(None, max_length=2000, description="Why (kept in the event).")
    by: str | None = Field(None, max_length=200, description="Who (kept in the event).")


class Redrive(Camel):
    execution_id: str
    status: Status
    redrive: int = Field(description="How many times it has been redriven, this one included.")
    superseded: list[str] = Field(description="Step keys that run again, in recorded order; "
                                  "their records are kept in the superseded history.")


class ForkRequest(Camel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=False, extra="forbid")

    from_step: str = STEP_KEY
    execution_id: str | None = Field(None, pattern=ID_PATTERN,
                                     description="The fork's ID; omitted: `{id}~fork-{hex}`.")
    params: Any = Field(None, description="The fork's params; omitted: the source's.")
    by: str | None = Field(None, max_length=200, description="Who (kept in the events).")


class Fork(Camel):
    execution_id: str
    status: Status
    forked_from: str
    copied: list[str] = Field(description="Step keys copied from the source, in recorded order.")


def _no_step(execution_id: str, step: str | None) -> ApiError:
    return ApiError(404, "STEP_NOT_FOUND",
                    f"execution {execution_id!r} has no recorded step {step!r}; "
                    "see GET /v1/executions/{id}/steps")


def _ended_only(execution_id: str, status: str) -> ApiError:
    return ApiError(409, "EXECUTION_NOT_ENDED",
                    f"execution {execution_id!r} is {status}; only a failed, timed_out, "
                    "cancelled or completed execution can be redriven (cancel it first, or "
                    "wait for it to end)", status=status)


@router.post(
    "/{execution_id}/redrive",
    status_code=202,
    response_model=Redrive,
    summary="Reopen an ended execution under the same ID: the failed step (or `fromStep`) and "
    "what was recorded after it run again, completed steps before it replay",
    openapi_extra=_optional_body_schema(RedriveRequest),
    responses={**ERRORS,
               404: {"model": ErrorBody, "description": "EXECUTION_NOT_FOUND / STEP_NOT_FOUND"},
               409: {"model": ErrorBody,
                     "description": "EXECUTION_NOT_ENDED / REDRIVE_NEEDS_FROM_STEP"},
               422: {"model": ErrorBody,
                     "description": "INVALID_REQUEST / DEADLINE_IN_THE_PAST / "
                     "INVALID_EXECUTION_EVENT"}},
)
async def redrive(execution_id: str, request: Request, store: StoreDep, settings: SettingsDep,
                  principal: Waker):
    _check_path_id(execution_id)
    body = await _optional_body(request, settings, RedriveRequest)
    if body.deadline is not None and body.timeout_seconds is not None:
        raise ApiError(422, "INVALID_REQUEST", "give either deadline or timeoutSeconds, not both")
    if body.deadline is not None:
        if body.deadline.tzinfo is None:
            raise ApiError(422, "INVALID_REQUEST",
                           "deadline: give a time zone offset (for example 2026-01-01T00:00:00Z)")
        passed, now = await store.deadline_passed(body.deadline)
        if passed:
            raise ApiError(422, "DEADLINE_IN_THE_PAST",
                           f"deadline {body.deadline.isoformat()} is at or before now "
                           f"({now.isoformat()}, database clock); nothing was redriven")
    answer, detail = await store.redrive(
        execution_id, actor(principal, body.by), from_step=body.from_step,
        deadline=body.deadline, timeout_seconds=body.timeout_seconds, reason=body.reason,
        owner=owner_of(principal))
    if answer == "not_found":
        raise not_found(execution_id)
    if answer == "step_not_found":
        raise _no_step(execution_id, body.from_step)
    if answer == "not_ended":
        raise _ended_only(execution_id, detail)
    if answer == "completed":
        raise ApiError(409, "REDRIVE_NEEDS_FROM_STEP",
                       f"execution {execution_id!r} completed; give fromStep to run it again "
                       "from that step on", status="completed")
    return {"executionId": execution_id, "status": detail.status, "redrive": detail.redrive,
            "superseded": detail.superseded}


def fork_id(source: str) -> str:
    """The default ID of a fork of `source` (derived: no client can take it)."""
    candidate = f"{source}{SYSTEM_ID_SEPARATOR}fork-{secrets.token_hex(4)}"
    if len(candidate) <= 1000:  # EXECUTION_ID_PATTERN's length
        return candidate
    return f"fork{SYSTEM_ID_SEPARATOR}{secrets.token_hex(16)}"


assert EXECUTION_ID_PATTERN.endswith("{1,1000}$")


@router.post(
    "/{execution_id}/fork",
    status_code=201,
    response_model=Fork,
    summary="A new execution of the same workflow with copies of the steps recorded before "
    "`fromStep`; the rest runs again under the new ID (new idempotency keys)",
    openapi_extra=_body_schema(ForkRequest),
    responses={**ERRORS,
               404: {"model": ErrorBody, "description": "EXECUTION_NOT_FOUND / STEP_NOT_FOUND"},
               409: {"model": ErrorBody, "description": "EXECUTION_ID_CONFLICT"},
               422: {"model": ErrorBody,
                     "description": "INVALID_REQUEST / RESERVED_EXECUTION_ID / INVALID_PARAMS / "
                     "INVALID_EXECUTION_EVENT"}},
)
async def fork(execution_id: str, request: Request, store: StoreDep, settings: SettingsDep,
               principal: Waker):
    _check_path_id(execution_id)
    raw = await _optional_json(request, settings)
    if raw is not None and not isinstance(raw, dict):
        raise ApiError(422, "INVALID_REQUEST",
                       "the body must be a JSON object with fromStep, optional executionId, params")
    raw = raw or {}
    check_client_execution_id(raw.get("executionId"))
    try:
        body = ForkRequest.model_validate(raw)
    except ValidationError as exc:
        raise _invalid(exc, "INVALID_REQUEST") from None
    owner = owner_of(principal)
    record = await store.get(execution_id, owner=owner)
    if record is None:
        raise not_found(execution_id)
    params = body.params if "params" in body.model_fields_set else None
    # New params are checked against the workflow's model when this API knows
    # the workflow; a source whose workflow it does not know forks as is.
    definitions = request.app.state.workflows or {}
    definition = definitions.get(record["workflow_id"])
    if definition is not None:
        registered_workflow(request, record["workflow_id"],
                            params if params is not None else record["params"])
    new_id = body.execution_id or fork_id(execution_id)
    try:
        answer, detail = await store.fork(
            execution_id, actor(principal, body.by), from_step=body.from_step, new_id=new_id,
            params=params, owner=owner, admitted_by=principal.token_id,
            timeout_seconds=definition.timeout_seconds if definition is not None else None)
    except InvalidEvent as exc:
        raise ApiError(422, "INVALID_EXECUTION_EVENT",
                       f"params cannot be stored exactly ({exc}); send plain JSON values") from None
    if answer == "not_found":
        raise not_found(execution_id)
    if answer == "step_not_found":
        raise _no_step(execution_id, body.from_step)
    if answer == "conflict":
        raise ApiError(409, "EXECUTION_ID_CONFLICT",
                       f"execution ID {new_id!r} is taken ({detail['status']}); fork under "
                       "another executionId, or omit it", executionId=new_id, **detail)
    return JSONResponse(
        {"executionId": detail.execution_id, "status": detail.status,
         "forkedFrom": execution_id, "copied": detail.copied},
        status_code=201, headers={"Location": f"/v1/executions/{detail.execution_id}"})

