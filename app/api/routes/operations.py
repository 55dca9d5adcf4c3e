"""Decisions from outside: cancel (with cleanup) or terminate (without),
resolve an outcome-unknown step, resume a poison-parked execution. Each is
recorded with who made it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.api.auth import Operator, actor
from app.api.common import (
    ERRORS,
    FORBIDDEN,
    UNAUTHENTICATED,
    _body_schema,
    _check_path_id,
    _invalid,
    _json,
    _optional_body_schema,
)
from app.api.deps import SettingsDep, StoreDep
from app.api.errors import ApiError, not_found
from app.api.models import ErrorBody, Status
from app.logs import operator_action
from app.store import InvalidEvent

router = APIRouter(prefix="/v1/executions", tags=["operations"],
                   responses={**UNAUTHENTICATED, **FORBIDDEN})

ACTOR = Field(None, max_length=200, description="Who decides (recorded in the history).")


class ActorBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    by: str | None = ACTOR


class StepError(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    message: str = Field("", max_length=10000)


class Resolution(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: Literal["retry", "succeed", "fail"] = Field(
        description="retry: call once more with the same idempotency key; succeed: record "
        "`result` as the step's result; fail: record `error` as the step's failure."
    )
    result: Any = Field(None, description="For succeed, required: the step's result (any "
                        "JSON; an explicit null records null).")
    error: StepError | None = Field(None, description="For fail, required: {name, message}.")
    by: str | None = ACTOR


class Decision(BaseModel):
    status: Status


async def _optional_body(request: Request, settings, model: type[BaseModel]) -> BaseModel:
    has_body = request.headers.get("content-length", "0") != "0" or (
        "transfer-encoding" in request.headers
    )
    body = await _json(request, settings) if has_body else {}
    try:
        return model.model_validate(body if body is not None else {})
    except ValidationError as exc:
        raise _invalid(exc, "INVALID_REQUEST") from None


def _optional(model: type[BaseModel]) -> dict:
    return _optional_body_schema(model)


@router.post(
    "/{execution_id}/cancel",
    status_code=202,
    response_model=Decision,
    summary="Request cancellation: persisted first; the workflow's cleanup code "
    "(`except Cancelled:`, `finally:`) runs at its next step or wait, within its cancel grace; "
    "an execution that never ran, or is parked, is cancelled at once",
    openapi_extra=_optional(ActorBody),
    responses={**ERRORS, 404: {"model": ErrorBody, "description": "EXECUTION_NOT_FOUND"},
               409: {"model": ErrorBody, "description": "EXECUTION_TERMINAL"}},
)
async def cancel(execution_id: str, request: Request, store: StoreDep, settings: SettingsDep,
                 principal: Operator):
    return await _end(execution_id, request, store, settings, principal, terminate=False)


@router.post(
    "/{execution_id}/terminate",
    status_code=202,
    response_model=Decision,
    summary="Cancel at once with no code run (no cleanup), held or not; the holder's later "
    "writes are refused. For when the cleanup itself is stuck",
    openapi_extra=_optional(ActorBody),
    responses={**ERRORS, 404: {"model": ErrorBody, "description": "EXECUTION_NOT_FOUND"},
               409: {"model": ErrorBody, "description": "EXECUTION_TERMINAL"}},
)
async def terminate(execution_id: str, request: Request, store: StoreDep, settings: SettingsDep,
                    principal: Operator):
    return await _end(execution_id, request, store, settings, principal, terminate=True)


async def _end(execution_id: str, request: Request, store, settings, principal, *,
               terminate: bool) -> dict:
    _check_path_id(execution_id)
    body = await _optional_body(request, settings, ActorBody)
    by = actor(principal, body.by)
    end = store.terminate if terminate else store.request_cancel
    answer, status = await end(execution_id, by)
    operator_action("terminate" if terminate else "cancel", by=by, result=answer,
                    execution_id=execution_id)
    if answer == "not_found":
        raise not_found(execution_id)
    if answer == "terminal":
        what = "terminate" if terminate else "cancel"
        raise ApiError(409, "EXECUTION_TERMINAL",
                       f"execution {execution_id!r} already ended ({status}); nothing to {what}",
                       status=status)
    return {"status": status}


@router.post(
    "/{execution_id}/steps/{step_key}/resolve",
    response_model=Decision,
    summary="Settle a step whose outcome is unknown; the execution becomes due",
    openapi_extra=_body_schema(Resolution),
    responses={**ERRORS,
               404: {"model": ErrorBody, "description": "EXECUTION_NOT_FOUND / STEP_NOT_FOUND"},
               409: {"model": ErrorBody, "description": "STEP_NOT_OUTCOME_UNKNOWN"},
               422: {"model": ErrorBody,
                     "description": "INVALID_RESOLUTION / INVALID_EXECUTION_EVENT / "
                     "INVALID_REQUEST"}},
)
async def resolve(execution_id: str, step_key: Annotated[str, Path(max_length=1000)],
                  request: Request, store: StoreDep, settings: SettingsDep,
                  principal: Operator):
    _check_path_id(execution_id)
    _check_path_id(step_key)
    body = await _json(request, settings)
    try:
        decision = Resolution.model_validate(body)
    except ValidationError as exc:
        raise _invalid(exc, "INVALID_RESOLUTION") from None
    if decision.action == "succeed" and "result" not in body:
        raise ApiError(422, "INVALID_RESOLUTION",
                       'action succeed needs "result": the value the step returned (send '
                       '"result": null to record null); it is recorded as the step\'s result')
    if decision.action == "fail" and decision.error is None:
        raise ApiError(422, "INVALID_RESOLUTION", "action fail needs error: {name, message}")
    if decision.action != "fail" and decision.error is not None:
        raise ApiError(422, "INVALID_RESOLUTION", "error goes only with action fail")
    if decision.action != "succeed" and "result" in body:
        raise ApiError(422, "INVALID_RESOLUTION", "result goes only with action succeed")
    try:
        by = actor(principal, decision.by)
        answer, status = await store.resolve_step(
            execution_id, step_key, decision.action, by=by,
            result=decision.result,
            error=decision.error.model_dump() if decision.error else None,
        )
    except InvalidEvent as exc:
        raise ApiError(422, "INVALID_RESOLUTION",
                       f"result cannot be stored exactly ({exc}); send plain JSON") from None
    operator_action(f"resolve {decision.action}", by=by, result=answer,
                    execution_id=execution_id, step_key=step_key)
    if answer == "not_found":
        raise not_found(execution_id)
    if answer == "step_not_found":
        raise ApiError(
            404, "STEP_NOT_FOUND",
            f"execution {execution_id!r} has no step {step_key!r}; the keys it has are listed by "
            "GET /v1/executions/{id}/steps (a key is percent-encoded in the path)",
            status=status,
        )
    if answer == "not_outcome_unknown":
        raise ApiError(
            409, "STEP_NOT_OUTCOME_UNKNOWN",
            f"step {step_key!r} of {execution_id!r} is not waiting for a decision (the execution "
            f"is {status}); see GET /v1/executions/{{id}}/steps",
            status=status,
        )
    return {"status": status}


@router.post(
    "/{execution_id}/resume",
    response_model=Decision,
    summary="Make an execution parked as poison due again (its counter is kept)",
    openapi_extra=_optional(ActorBody),
    responses={**ERRORS, 404: {"model": ErrorBody, "description": "EXECUTION_NOT_FOUND"},
               409: {"model": ErrorBody, "description": "EXECUTION_NOT_PARKED"}},
)
async def resume(execution_id: str, request: Request, store: StoreDep, settings: SettingsDep,
                 principal: Operator):
    _check_path_id(execution_id)
    body = await _optional_body(request, settings, ActorBody)
    by = actor(principal, body.by)
    answer, status = await store.resume(execution_id, by)
    operator_action("resume", by=by, result=answer, execution_id=execution_id)
    if answer == "not_found":
        raise not_found(execution_id)
    if answer == "not_parked":
        raise ApiError(
            409, "EXECUTION_NOT_PARKED",
            f"execution {execution_id!r} is {status}, not parked as poison; an outcome-unknown "
            "step is settled with POST .../steps/{key}/resolve",
            status=status,
        )
    return {"status": status}



