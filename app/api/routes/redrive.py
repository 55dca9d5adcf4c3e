"""The HTTP routes of redrive (an ended execution again under its ID) and
fork (a new execution from a chosen step): request bodies and answers; the
decisions are app/commands/redrive.py's."""

from __future__ import annotations

from datetime import UTC, datetime
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
    _optional_body,
    _optional_body_schema,
    _optional_json,
    owner_of,
    refusal,
)
from app.api.deps import SettingsDep, StoreDep
from app.api.errors import ApiError
from app.api.ids import check_client_execution_id
from app.api.models import (
    EXECUTION_ID_PATTERN,
    ID_PATTERN,
    ID_RULE,
    Camel,
    Status,
    TimeString,
    in_utc,
)
from app.commands import redrive as commands

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


@router.post(
    "/{execution_id}/redrive",
    status_code=202,
    response_model=Redrive,
    summary="Reopen an ended execution under the same ID: the failed step (or `fromStep`) and "
    "what was recorded after it run again, completed steps before it replay",
    openapi_extra=_optional_body_schema(RedriveRequest),
    responses={**ERRORS,
               404: refusal("EXECUTION_NOT_FOUND"),
               409: refusal("EXECUTION_NOT_ENDED / REDRIVE_NEEDS_FROM_STEP"),
               422: refusal("INVALID_REQUEST / STEP_NOT_FOUND / DEADLINE_IN_THE_PAST / "
                            "INVALID_EXECUTION_EVENT: STEP_NOT_FOUND when fromStep names no "
                            "recorded step")},
)
async def redrive(execution_id: str, request: Request, store: StoreDep, settings: SettingsDep,
                  principal: Waker):
    _check_path_id(execution_id)
    body = await _optional_body(request, settings, RedriveRequest)
    deadline = body.deadline
    if deadline is not None and deadline.tzinfo is not None:
        # In UTC, as Postgres stores it: one before year 1 there has passed,
        # one after 9999 is the latest time stored.
        deadline = in_utc(deadline) or datetime.min.replace(tzinfo=UTC)
    detail = await commands.redrive(
        store, execution_id, actor(principal, body.by), from_step=body.from_step,
        deadline=deadline, timeout_seconds=body.timeout_seconds, reason=body.reason,
        owner=owner_of(principal))
    return {"executionId": execution_id, "status": detail.status, "redrive": detail.redrive,
            "superseded": detail.superseded}


assert EXECUTION_ID_PATTERN.endswith(f"{{1,{commands.MAX_EXECUTION_ID}}}$")


@router.post(
    "/{execution_id}/fork",
    status_code=201,
    response_model=Fork,
    summary="A new execution of the same workflow with copies of the steps recorded before "
    "`fromStep`; the rest runs again under the new ID (new idempotency keys)",
    openapi_extra=_body_schema(ForkRequest),
    responses={**ERRORS,
               404: refusal("EXECUTION_NOT_FOUND"),
               409: refusal("EXECUTION_ID_CONFLICT"),
               422: refusal("INVALID_REQUEST / STEP_NOT_FOUND / RESERVED_EXECUTION_ID / "
                            "INVALID_PARAMS / INVALID_EXECUTION_EVENT: STEP_NOT_FOUND when "
                            "fromStep names no recorded step")},
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
    params = body.params if "params" in body.model_fields_set else None
    detail = await commands.fork(
        store, execution_id, actor(principal, body.by), from_step=body.from_step,
        new_id=body.execution_id, params=params, owner=owner_of(principal),
        admitted_by=principal.token_id, workflows=request.app.state.workflows or {})
    return JSONResponse(
        {"executionId": detail.execution_id, "status": detail.status,
         "forkedFrom": execution_id, "copied": detail.copied},
        status_code=201, headers={"Location": f"/v1/executions/{detail.execution_id}"})

