"""What happened: the event history, the recorded steps, late observations,
and the workers."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel

from app.api.auth import Reader, StrictReader, ensure_visible
from app.api.common import ERRORS, FORBIDDEN, INVALID_QUERY, UNAUTHENTICATED, _check_path_id
from app.api.deps import SettingsDep, StoreDep
from app.api.errors import not_found
from app.api.models import ErrorBody, WorkerList, worker_view

router = APIRouter(tags=["history"], responses=UNAUTHENTICATED)

NOT_FOUND = {404: {"model": ErrorBody, "description": "EXECUTION_NOT_FOUND"}, 503: ERRORS[503]}


class EventPage(BaseModel):
    events: list[dict[str, Any]]
    nextAfter: int | None  # noqa: N815 - wire name


class StepList(BaseModel):
    steps: list[dict[str, Any]]


class LateObservationList(BaseModel):
    lateObservations: list[dict[str, Any]]  # noqa: N815 - wire name


@router.get("/v1/executions/{execution_id}/events", response_model=EventPage,
            summary="The append-only history, oldest first",
            responses={**NOT_FOUND, **INVALID_QUERY})
async def events(
    execution_id: str,
    store: StoreDep,
    principal: Reader,
    after: Annotated[int, Query(ge=0, le=2**63 - 1, description="eventId to continue after")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
):
    _check_path_id(execution_id)
    await ensure_visible(store, principal, execution_id)
    rows = await store.events_page(execution_id, after=after, limit=limit)
    if not rows and not await store.exists(execution_id):
        raise not_found(execution_id)
    page = [
        {"eventId": r["event_id"], "at": r["at"], "kind": r["kind"], "token": r["token"],
         "detail": r["detail"]}
        for r in rows
    ]
    return {"events": page, "nextAfter": page[-1]["eventId"] if len(page) == limit else None}


@router.get("/v1/executions/{execution_id}/steps", response_model=StepList,
            summary="Recorded steps, and effect attempts whose outcome is in doubt",
            responses={**NOT_FOUND, **INVALID_QUERY})
async def steps(
    execution_id: str,
    store: StoreDep,
    principal: Reader,
    include_values: Annotated[bool, Query(alias="includeValues",
                                          description="load results and errors")] = False,
):
    _check_path_id(execution_id)
    await ensure_visible(store, principal, execution_id)
    if not await store.exists(execution_id):
        raise not_found(execution_id)
    rows = await store.step_details(execution_id, include_values=include_values)
    out = []
    for r in rows:
        step = {
            "stepKey": r["step_key"], "status": r["status"], "attempts": r["attempts"],
            "token": r["token"], "function": r["function_name"], "recordedAt": r["recorded_at"],
            "startedAt": r["started_at"], "idempotencyKey": r["idempotency_key"],
            "valueBytes": r["value_bytes"], "errorName": r["error_name"],
        }
        if include_values:
            step["result"], step["error"] = r["value"], r["error"]
        out.append(step)
    return {"steps": out}


@router.get("/v1/executions/{execution_id}/late-observations",
            response_model=LateObservationList,
            summary="What stale holders observed after their lease was lost (evidence only)",
            responses=NOT_FOUND)
async def late_observations(execution_id: str, store: StoreDep, principal: Reader):
    _check_path_id(execution_id)
    await ensure_visible(store, principal, execution_id)
    if not await store.exists(execution_id):
        raise not_found(execution_id)
    rows = await store.late_observations(execution_id)
    return {"lateObservations": [
        {"observationId": r["observation_id"], "stepKey": r["step_key"], "token": r["token"],
         "owner": r["owner"], "value": r["value"], "error": r["error"],
         "observedAt": r["observed_at"]}
        for r in rows
    ]}


@router.get("/v1/workers", response_model=WorkerList,
            summary="Live workers and those stopped or silent within the last hour",
            responses={**FORBIDDEN, 503: ERRORS[503]})
async def workers(store: StoreDep, settings: SettingsDep, _: StrictReader):
    rows = await store.list_workers(stale_after_seconds=3 * settings.renew_seconds + 1)
    return {"workers": [worker_view(r) for r in rows]}
