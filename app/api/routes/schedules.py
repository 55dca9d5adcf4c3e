"""Schedules: create, list, read, pause, resume, delete.

A schedule admits its workflow at every slot of a cron expression in a time
zone, as the execution `{scheduleId}~{slot in UTC, YYYY-MM-DDTHH:MMZ}` (`~`: an ID
clients cannot admit, so nobody can take a slot first).
Workers evaluate schedules; the API only records them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from app import cron
from app.api.auth import Operator, StrictReader, actor
from app.api.common import (
    AUTH_ERRORS,
    ERRORS,
    STRICT_QUERY,
    Responses,
    _body_schema,
    _invalid,
    _json,
    refusal,
    registered_workflow,
)
from app.api.deps import SettingsDep, StoreDep
from app.api.errors import ApiError
from app.api.models import ID_PATTERN, JSON_INTEGER
from app.commands import schedules
from app.commands.schedules import check_schedule_id, schedule_not_found
from app.registry import SCHEDULE_ID_RE
from app.store import InvalidEvent
from app.store.records import ScheduleRecord

router = APIRouter(prefix="/v1/schedules", tags=["schedules"], responses=AUTH_ERRORS)

SCHEDULE_ID_PATTERN = SCHEDULE_ID_RE.pattern
NOT_FOUND: Responses = {404: refusal("SCHEDULE_NOT_FOUND"), 503: ERRORS[503]}
INVALID_QUERY: Responses = {
    422: refusal("INVALID_REQUEST / UNKNOWN_QUERY_PARAMETER: a "
                 "query parameter is malformed or out of range / not one this route takes"),
}


class ScheduleRequest(BaseModel):
    # camelCase only: snake_case spellings are unknown fields.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=False, extra="forbid")

    schedule_id: str = Field(
        pattern=SCHEDULE_ID_PATTERN,
        description="1 to 182 characters from A-Z a-z 0-9 . _ : - (each slot's execution ID "
        "adds '~YYYY-MM-DDTHH:MMZ').",
    )
    workflow_id: str = Field(pattern=ID_PATTERN, description="The workflow each slot admits.")
    cron: str = Field(
        min_length=1, max_length=cron.MAX_EXPRESSION_LENGTH,
        description="Five fields: minute hour day-of-month month day-of-week (e.g. '0 2 * * *'); "
        "*, lists, ranges, steps, month and day names, @daily etc.",
    )
    timezone: str = Field(
        min_length=1, max_length=100,
        description="IANA time zone the cron is read in (e.g. Europe/Warsaw, UTC).",
    )
    params: Any = Field(default_factory=dict, description="Params of every execution (any JSON).")
    catch_up: Annotated[int, Field(ge=1, le=1000), JSON_INTEGER] | None = Field(
        None,
        description="Most missed slots admitted after the schedulers were down; older ones are "
        "skipped with an event. Omitted: the workers' FENCEPOST_SCHEDULE_CATCH_UP (default 1).",
    )


class ScheduleView(BaseModel):
    scheduleId: str  # noqa: N815 - wire names
    workflowId: str  # noqa: N815
    cron: str
    timezone: str
    params: Any
    paused: bool
    catchUp: int | None = Field(description="null: the workers' FENCEPOST_SCHEDULE_CATCH_UP.")  # noqa: N815
    source: Literal["code", "api"] = Field(
        description="code: declared with @workflow(schedule=...), re-applied when a worker "
        "starts; api: created over HTTP."
    )
    createdAt: datetime  # noqa: N815
    updatedAt: datetime  # noqa: N815
    lastSlot: datetime = Field(  # noqa: N815
        description="Slots up to this instant have been evaluated (fired or skipped)."
    )
    nextSlot: datetime | None = Field(  # noqa: N815
        description="The next slot that will fire (UTC); null while paused."
    )


class ScheduleList(BaseModel):
    schedules: list[ScheduleView]
    nextCursor: str | None = Field(None, description="Pass as `cursor` for the next page.")  # noqa: N815


class ScheduleEvent(BaseModel):
    eventId: int  # noqa: N815
    at: datetime
    kind: str
    detail: dict[str, Any] | None


class ScheduleEventList(BaseModel):
    events: list[ScheduleEvent]


def _view(row: ScheduleRecord) -> dict:
    next_slot = None
    if not row["paused"]:
        try:
            # A read carries the database's now; a creation's row does not.
            db_now = row.get("db_now")
            after = (max(row["last_slot"], db_now) if isinstance(db_now, datetime)
                     else row["last_slot"])
            next_slot = cron.next_slot(cron.parse(row["cron"]), cron.zone(row["timezone"]), after)
        except (cron.CronError, cron.TimezoneError):
            next_slot = None
    return {
        "scheduleId": row["schedule_id"], "workflowId": row["workflow_id"], "cron": row["cron"],
        "timezone": row["timezone"], "params": row["params"], "paused": row["paused"],
        "catchUp": row["catch_up"], "source": row["source"], "createdAt": row["created_at"],
        "updatedAt": row["updated_at"], "lastSlot": row["last_slot"], "nextSlot": next_slot,
    }


@router.post(
    "",
    status_code=201,
    response_model=ScheduleView,
    summary="Create a schedule; each slot is admitted once, as {scheduleId}~{slot in UTC}",
    openapi_extra=_body_schema(ScheduleRequest),
    responses={
        **ERRORS,
        404: refusal("WORKFLOW_NOT_FOUND"),
        409: refusal("SCHEDULE_EXISTS: names the existing schedule"),
        422: refusal("INVALID_SCHEDULE / INVALID_PARAMS / INVALID_EXECUTION_EVENT"),
    },
)
async def create_schedule(request: Request, response: Response, store: StoreDep,
                          settings: SettingsDep, principal: Operator):
    body = await _json(request, settings)
    if not isinstance(body, dict):
        raise ApiError(
            422, "INVALID_SCHEDULE",
            "the body must be a JSON object with scheduleId, workflowId, cron, timezone and "
            "optional params, catchUp",
        )
    try:
        req = ScheduleRequest.model_validate(body)
    except ValidationError as exc:
        raise _invalid(exc, "INVALID_SCHEDULE") from None
    try:
        expression = cron.parse(req.cron)
    except cron.CronError as exc:
        raise ApiError(422, "INVALID_SCHEDULE", f"cron: {exc}") from None
    try:
        cron.zone(req.timezone)
    except cron.TimezoneError as exc:
        raise ApiError(422, "INVALID_SCHEDULE", f"timezone: {exc}") from None
    registered_workflow(request, req.workflow_id, req.params)
    try:
        created, row = await store.schedules.create_schedule(
            schedule_id=req.schedule_id,
            workflow_id=req.workflow_id,
            cron=expression.expression,
            timezone=req.timezone,
            params=req.params,
            catch_up=req.catch_up,
            by=actor(principal, None),
        )
    except InvalidEvent as exc:
        raise ApiError(
            422, "INVALID_EXECUTION_EVENT",
            f"params cannot be stored exactly ({exc}); send plain JSON values",
        ) from None
    if not created:
        raise ApiError(
            409, "SCHEDULE_EXISTS",
            f"schedule {req.schedule_id!r} already exists (workflow {row['workflow_id']!r}, "
            f"cron {row['cron']!r} in {row['timezone']}); delete it first or pick another ID",
            scheduleId=row["schedule_id"],
            workflowId=row["workflow_id"],
        )
    response.headers["Location"] = f"/v1/schedules/{row['schedule_id']}"
    return _view(await store.schedules.get_schedule(req.schedule_id) or row)


@router.get(
    "",
    response_model=ScheduleList,
    summary="List schedules, by schedule ID",
    responses={**INVALID_QUERY, 503: ERRORS[503]},
    dependencies=[STRICT_QUERY],
)
async def list_schedules(
    store: StoreDep,
    principal: StrictReader,
    workflow_id: Annotated[str | None, Query(alias="workflowId", pattern=ID_PATTERN)] = None,
    cursor: Annotated[str | None, Query(pattern=SCHEDULE_ID_PATTERN,
                                        description="nextCursor of the previous page")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
):
    rows, next_cursor = await store.schedules.list_schedules(workflow_id=workflow_id, after=cursor,
                                                   limit=limit)
    return {"schedules": [_view(r) for r in rows], "nextCursor": next_cursor}


@router.get(
    "/{schedule_id}",
    response_model=ScheduleView,
    summary="Read one schedule, with when it fires next",
    responses=NOT_FOUND,
)
async def get_schedule(schedule_id: str, store: StoreDep, principal: StrictReader):
    check_schedule_id(schedule_id)
    row = await store.schedules.get_schedule(schedule_id)
    if row is None:
        raise schedule_not_found(schedule_id)
    return _view(row)


@router.get(
    "/{schedule_id}/events",
    response_model=ScheduleEventList,
    summary="The schedule's newest events (created, fired, slots skipped, paused, resumed)",
    responses={**NOT_FOUND, **INVALID_QUERY},
    dependencies=[STRICT_QUERY],
)
async def schedule_events(
    schedule_id: str,
    store: StoreDep,
    principal: StrictReader,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
):
    check_schedule_id(schedule_id)
    # From schedule_events (never an execution's history), in one statement.
    rows = await store.schedules.schedule_history(schedule_id, limit)
    if rows is None:
        raise schedule_not_found(schedule_id)
    return {"events": [{"eventId": r["event_id"], "at": r["at"], "kind": r["kind"],
                        "detail": r["detail"]} for r in rows]}


async def _set_paused(schedule_id: str, paused: bool, store, principal) -> dict:
    return _view(await schedules.set_paused(store, schedule_id, paused, actor(principal, None)))


@router.post(
    "/{schedule_id}/pause",
    response_model=ScheduleView,
    summary="Pause: no slot fires until resumed (pausing a paused schedule changes nothing)",
    responses=NOT_FOUND,
)
async def pause_schedule(schedule_id: str, store: StoreDep, principal: Operator):
    return await _set_paused(schedule_id, True, store, principal)


@router.post(
    "/{schedule_id}/resume",
    response_model=ScheduleView,
    summary="Resume: slots after now fire; those that passed while paused do not",
    responses=NOT_FOUND,
)
async def resume_schedule(schedule_id: str, store: StoreDep, principal: Operator):
    return await _set_paused(schedule_id, False, store, principal)


@router.delete(
    "/{schedule_id}",
    status_code=204,
    response_class=Response,
    summary="Delete a schedule and its events; executions it admitted stay. A code-defined "
    "schedule comes back when a worker with its code starts",
    responses=NOT_FOUND,
)
async def delete_schedule(schedule_id: str, store: StoreDep, principal: Operator):
    await schedules.delete(store, schedule_id, actor(principal, None))
    return Response(status_code=204)
