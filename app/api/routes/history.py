"""What happened: the event history, the recorded steps, late observations,
and the workers."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from app.api.auth import Reader, StrictReader
from app.api.common import (
    _UNSTORABLE_TEXT,
    ERRORS,
    FORBIDDEN,
    INVALID_QUERY,
    STRICT_QUERY,
    UNAUTHENTICATED,
    UNKNOWN_QUERY,
    Responses,
    _check_path_id,
    detail_for,
    error_for,
    owner_of,
    refusal,
)
from app.api.deps import SettingsDep, StoreDep
from app.api.errors import ApiError, not_found
from app.api.models import WorkerList, worker_view
from app.store.records import StepPageRow

router = APIRouter(tags=["history"], responses=UNAUTHENTICATED)

NOT_FOUND: Responses = {404: refusal("EXECUTION_NOT_FOUND"), 503: ERRORS[503]}


class EventPage(BaseModel):
    events: list[dict[str, Any]]
    nextAfter: int | None  # noqa: N815 - wire name


class StepList(BaseModel):
    steps: list[dict[str, Any]]
    nextCursor: str | None = Field(  # noqa: N815 - wire name
        None, description="Pass as `cursor` for the next page; null on the last page.")


class LateObservationList(BaseModel):
    lateObservations: list[dict[str, Any]]  # noqa: N815 - wire name
    nextAfter: int | None = Field(  # noqa: N815 - wire name
        None, description="Pass as `after` for the next page; null on the last page.")


# Each route reads with one statement that carries the owner predicate for a
# trigger-only token (owner_of): a foreign execution is the same 404 as a
# missing one, and nothing admitted by another token mid-request is shown.

Row = TypeVar("Row")


def _found(execution_id: str, rows: list[Row] | None) -> list[Row]:
    """A page of the execution's rows; None (no such execution, or another
    token's) is 404."""
    if rows is None:
        raise not_found(execution_id)
    return rows


@router.get("/v1/executions/{execution_id}/events", response_model=EventPage,
            summary="The append-only history, oldest first",
            responses={**NOT_FOUND, **INVALID_QUERY}, dependencies=[STRICT_QUERY])
async def events(
    execution_id: str,
    store: StoreDep,
    principal: Reader,
    after: Annotated[int, Query(ge=0, le=2**63 - 1, description="eventId to continue after")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
):
    _check_path_id(execution_id)
    rows = _found(execution_id, await store.history.execution_events_page(
        execution_id, after=after, limit=limit, owner=owner_of(principal)))
    page = [
        {"eventId": r["event_id"], "sequence": r["seq"], "at": r["at"], "kind": r["kind"],
         "token": r["token"],
         "detail": detail_for(principal, r["detail"])}
        for r in rows
    ]
    return {"events": page, "nextAfter": page[-1]["eventId"] if len(page) == limit else None}


def _step_cursor(row: StepPageRow) -> str:
    raw = json.dumps([row["grp"], row["sort_at"].isoformat(), row["step_key"]]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_step_cursor(cursor: str) -> tuple[int, datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        group, at, key = json.loads(raw)
        at = datetime.fromisoformat(at)
        if (group not in (0, 1, 2) or at.tzinfo is None or not isinstance(key, str)
                or _UNSTORABLE_TEXT.search(key)):
            raise ValueError("not an issued cursor")
        at.astimezone(UTC)
        return group, at, key
    except Exception:
        raise ApiError(
            422, "INVALID_CURSOR",
            "cursor is not one this server issued; pass nextCursor from the previous page",
        ) from None


@router.get("/v1/executions/{execution_id}/steps", response_model=StepList,
            summary="Recorded steps, then effect attempts whose outcome is in doubt, then "
            "steps a redrive superseded (keyset pagination)",
            responses={**NOT_FOUND,
                       422: refusal("INVALID_REQUEST / INVALID_CURSOR / "
                                    "UNKNOWN_QUERY_PARAMETER")},
            dependencies=[STRICT_QUERY])
async def steps(
    execution_id: str,
    store: StoreDep,
    principal: Reader,
    include_values: Annotated[bool, Query(alias="includeValues",
                                          description="load results and errors")] = False,
    cursor: Annotated[str | None, Query(max_length=2000,
                                        description="nextCursor of the previous page")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
):
    _check_path_id(execution_id)
    after = _decode_step_cursor(cursor) if cursor is not None else None
    rows = _found(execution_id, await store.history.execution_steps_page(
        execution_id, include_values=include_values, limit=limit + 1, after=after,
        owner=owner_of(principal)))
    out = []
    for r in rows[:limit]:
        step = {
            "stepKey": r["step_key"], "status": r["status"], "attempts": r["attempts"],
            "token": r["token"], "function": r["function_name"], "recordedAt": r["recorded_at"],
            "startedAt": r["started_at"], "idempotencyKey": r["idempotency_key"],
            "valueBytes": r["value_bytes"], "errorName": r["error_name"],
            # Failed attempts (the last 20): name, message and time; a
            # trigger token sees them too (no tracebacks are kept there).
            "failedAttempts": r["failed_attempts"] or [],
        }
        if r["superseded_at"] is not None:
            # Taken out of the record by a redrive: when, and by which one.
            step["supersededAt"], step["redrive"] = r["superseded_at"], r["redrive"]
        if include_values:
            step["result"], step["error"] = r["value"], error_for(principal, r["error"])
        out.append(step)
    next_cursor = _step_cursor(rows[limit - 1]) if len(rows) > limit else None
    return {"steps": out, "nextCursor": next_cursor}


class HistoryStep(BaseModel):
    key: str
    status: str
    value: Any = None
    error: dict[str, Any] | None = None
    functionName: str | None = None  # noqa: N815 - wire name
    attempts: int
    position: int | None = Field(
        None, description="Where in the code's order of asks it was asked for; null for a "
        "step recorded before positions were, or asked from a concurrent branch.")
    recordedAt: datetime  # noqa: N815 - wire name


class HistoryDocument(BaseModel):
    format: str = Field(description="`fencepost-history/1`; a reader refuses another format.")
    executionId: str  # noqa: N815 - wire name
    workflowId: str  # noqa: N815 - wire name
    codeVersion: str | None  # noqa: N815 - wire name
    status: str
    interrupt: Literal["cancel", "deadline"] | None = Field(
        None, description="A cancel requested or a deadline passed: a delivery raises it into "
        "the code, whose cleanup steps follow in the history (the replay raises it there too).")
    params: Any = None
    context: dict[str, Any] = Field(default_factory=dict)
    steps: list[HistoryStep] = Field(
        description="In the code's order of asks (position), then steps with no position "
        "by when they were recorded.")


@router.get("/v1/executions/{execution_id}/history", response_model=HistoryDocument,
            summary="The recorded history the replay check runs code against "
            "(`fencepost replay`): the record's params and context and every recorded "
            "step, in the order the code asked for them",
            responses={**NOT_FOUND, **UNKNOWN_QUERY}, dependencies=[STRICT_QUERY])
async def history(execution_id: str, store: StoreDep, principal: Reader):
    _check_path_id(execution_id)
    document = await store.exports.export(execution_id, owner=owner_of(principal))
    if document is None:
        raise not_found(execution_id)
    # A trigger token sees a recorded error's name and message only, as in /steps.
    for step in document["steps"]:
        step["error"] = error_for(principal, step["error"])
    return document


@router.get("/v1/executions/{execution_id}/late-observations",
            response_model=LateObservationList,
            summary="What stale holders observed after their lease was lost (evidence only)",
            responses={**NOT_FOUND, **INVALID_QUERY}, dependencies=[STRICT_QUERY])
async def late_observations(
    execution_id: str,
    store: StoreDep,
    principal: Reader,
    after: Annotated[int, Query(ge=0, le=2**63 - 1,
                                description="observationId to continue after")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
):
    _check_path_id(execution_id)
    rows = _found(execution_id, await store.history.execution_late_observations_page(
        execution_id, after=after, limit=limit, owner=owner_of(principal)))
    page = [
        {"observationId": r["observation_id"], "stepKey": r["step_key"], "token": r["token"],
         "owner": r["owner"], "value": r["value"], "error": error_for(principal, r["error"]),
         "observedAt": r["observed_at"]}
        for r in rows
    ]
    return {"lateObservations": page,
            "nextAfter": page[-1]["observationId"] if len(page) == limit else None}


@router.get("/v1/workers", response_model=WorkerList,
            summary="Live workers and those stopped or silent within the last hour",
            responses={**FORBIDDEN, **UNKNOWN_QUERY, 503: ERRORS[503]},
            dependencies=[STRICT_QUERY])
async def workers(store: StoreDep, settings: SettingsDep, _: StrictReader):
    rows = await store.workers.list_workers(stale_after_seconds=3 * settings.renew_seconds + 1)
    roles: dict[str, list[str]] = {}
    for lease in await store.maintenance.leaders():  # unexpired terms, by role
        roles.setdefault(lease.holder, []).append(lease.role)
    return {"workers": [worker_view(r, roles.get(r["worker_id"], []))
                        for r in rows]}
