"""Decisions from outside: cancel (with cleanup) or terminate (without),
resolve an outcome-unknown step, resume an execution parked as poison or for
nondeterminism. Each is
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
    Responses,
    _body_schema,
    _check_path_id,
    _invalid,
    _json,
    _optional_body,
    _optional_body_schema,
    refusal,
)
from app.api.deps import SettingsDep, StoreDep
from app.api.models import Status
from app.commands import executions as commands

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


def _optional(model: type[BaseModel]) -> dict:
    return _optional_body_schema(model)


# Cancel and terminate: refused for a missing or an ended execution.
ENDING_REFUSALS: Responses = {**ERRORS, 404: refusal("EXECUTION_NOT_FOUND"),
                   409: refusal("EXECUTION_TERMINAL")}


@router.post(
    "/{execution_id}/cancel",
    status_code=202,
    response_model=Decision,
    summary="Request cancellation: persisted first; the workflow's cleanup code "
    "(`except Cancelled:`, `finally:`) runs at its next step or wait, within its cancel grace; "
    "an execution that never ran, or is parked, is cancelled at once",
    openapi_extra=_optional(ActorBody),
    responses=ENDING_REFUSALS,
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
    responses=ENDING_REFUSALS,
)
async def terminate(execution_id: str, request: Request, store: StoreDep, settings: SettingsDep,
                    principal: Operator):
    return await _end(execution_id, request, store, settings, principal, terminate=True)


async def _end(execution_id: str, request: Request, store, settings, principal, *,
               terminate: bool) -> dict:
    _check_path_id(execution_id)
    body = await _optional_body(request, settings, ActorBody)
    end = commands.terminate if terminate else commands.cancel
    done = await end(store, execution_id, actor(principal, body.by))
    return {"status": done.status}


@router.post(
    "/{execution_id}/steps/{step_key}/resolve",
    response_model=Decision,
    summary="Settle a step whose outcome is unknown; the execution becomes due",
    openapi_extra=_body_schema(Resolution),
    responses={**ERRORS,
               404: refusal("EXECUTION_NOT_FOUND / STEP_NOT_FOUND"),
               409: refusal("STEP_NOT_OUTCOME_UNKNOWN"),
               422: refusal("INVALID_RESOLUTION / INVALID_EXECUTION_EVENT / "
                            "INVALID_REQUEST")},
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
    assert isinstance(body, dict)  # the model accepts only an object
    done = await commands.resolve(
        store, execution_id, step_key, decision.action, actor(principal, decision.by),
        result=body["result"] if "result" in body else commands.NO_RESULT,
        error=decision.error.model_dump() if decision.error else None)
    return {"status": done.status}


@router.post(
    "/{execution_id}/resume",
    response_model=Decision,
    summary="Make an execution parked as poison (its counter is kept) or for nondeterminism "
            "due again",
    openapi_extra=_optional(ActorBody),
    responses={**ERRORS, 404: refusal("EXECUTION_NOT_FOUND"),
               409: refusal("EXECUTION_NOT_PARKED")},
)
async def resume(execution_id: str, request: Request, store: StoreDep, settings: SettingsDep,
                 principal: Operator):
    _check_path_id(execution_id)
    body = await _optional_body(request, settings, ActorBody)
    done = await commands.resume(store, execution_id, actor(principal, body.by))
    return {"status": done.status}
