"""Executions: admission, reads, wakes."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import Enum
from typing import Annotated, Literal

import orjson
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from app import tracing
from app.api.auth import Reader, Waker, require
from app.api.common import (
    _UNSTORABLE_TEXT,
    ERRORS,
    FORBIDDEN,
    STRICT_QUERY,
    UNAUTHENTICATED,
    DirectRoute,
    _body_schema,
    _check_path_id,
    _invalid,
    _json,
    _optional_body_schema,
    _optional_json,
    outcome_for,
    owner_of,
    refusal,
    registered_workflow,
)
from app.api.deps import SettingsDep, StoreDep, live_workflows
from app.api.errors import ApiError, not_found
from app.api.ids import check_client_execution_id
from app.api.models import (
    EXECUTION_ID_PATTERN,
    ID_PATTERN,
    Admission,
    AdmitRequest,
    ExecutionPage,
    ExecutionRecord,
    Status,
    TimeString,
    WakeAnswer,
    WakeRequest,
    in_utc,
    record,
    summary,
)
from app.api.quotas import RATE_LIMITED, enforce
from app.api.waiters import wait_or_gone
from app.blocked import REASONS
from app.commands import executions as commands
from app.logs import REQUEST_ID
from app.queues import DEFAULT_QUEUE
from app.registry import WorkflowDefinition
from app.schema import TERMINAL_STATUSES
from app.settings import Settings
from app.store import Conflict, ExecutionStore, InvalidEvent, decode_cursor
from app.store.admission import Existing
from app.store.records import HealedExecution

# Its members are app.blocked's reasons (mypy reads only literal members).
BlockedReason = Enum(  # type: ignore[misc]
    "BlockedReason", {r: r for r in REASONS if r != "none"}, type=str)

router = APIRouter(prefix="/v1/executions", tags=["executions"], responses=UNAUTHENTICATED)
_trigger = require("trigger")

async def admit(request: Request) -> Response:
    # The checks the Trigger and AdmissionQuota dependencies make elsewhere,
    # called directly (the busiest route: no dependency solving), in their
    # order: the token (401), its role (403), its quota (429), then the body.
    principal = await _trigger(request)
    await enforce(request, principal, "admissions")
    state = request.app.state
    store: ExecutionStore = state.store
    settings: Settings = state.settings
    body = await _json(request, settings)
    # Malformed requests are INVALID_REQUEST; INVALID_EXECUTION_EVENT means a
    # value that cannot be stored exactly (the body parser and the store).
    if not isinstance(body, dict):
        raise ApiError(
            422, "INVALID_REQUEST",
            "the body must be a JSON object with workflowId, params and optional executionId, context",
        )
    check_client_execution_id(body.get("executionId"))
    try:
        req = AdmitRequest.model_validate(body)
    except ValidationError as exc:
        raise _invalid(exc) from None
    if req.deadline is not None and req.timeout_seconds is not None:
        raise ApiError(422, "INVALID_REQUEST",
                       "give either deadline or timeoutSeconds, not both")
    if req.deadline is not None and req.deadline.tzinfo is None:
        raise ApiError(422, "INVALID_REQUEST",
                       "deadline: give a time zone offset (for example 2026-01-01T00:00:00Z)")
    if req.start_at is not None and req.delay_seconds is not None:
        raise ApiError(422, "INVALID_REQUEST",
                       "give either startAt or delaySeconds, not both")
    if req.concurrency_key is not None and _UNSTORABLE_TEXT.search(req.concurrency_key):
        raise ApiError(422, "INVALID_EXECUTION_EVENT",
                       "concurrencyKey cannot be stored exactly (NUL or a lone surrogate); "
                       "send plain text")
    # A start before any time a datetime holds in UTC is now.
    start_at = in_utc(req.start_at) if req.start_at is not None else None
    deadline = None
    if req.deadline is not None:
        deadline = in_utc(req.deadline) or datetime.min.replace(tzinfo=UTC)
    timeout_seconds = req.timeout_seconds
    definition = registered_workflow(request, req.workflow_id, req.params)
    queue, concurrency_key = _flow_of(definition, req)
    if definition is not None and req.deadline is None and timeout_seconds is None:
        timeout_seconds = definition.timeout_seconds
    if req.deadline is not None and deadline is not None:
        # Judged by the database clock right before admitting (see deadline_passed).
        passed, now = await store.clock.deadline_passed(deadline)
        if passed:
            raise ApiError(
                422, "DEADLINE_IN_THE_PAST",
                f"deadline {req.deadline.isoformat()} is at or before now ({now.isoformat()}, "
                "database clock); nothing was admitted. Give a later deadline, or "
                "timeoutSeconds for a deadline relative to admission",
            )
    incoming = tracing.valid_traceparent(request.headers.get("traceparent"))
    try:
        with tracing.span("fencepost admit", parent=incoming,
                          attributes={"fencepost.workflow_id": req.workflow_id,
                                      "fencepost.execution_id": req.execution_id}):
            result = await store.admissions.admit(
                workflow_id=req.workflow_id,
                params=req.params,
                context=req.context,
                execution_id=req.execution_id,
                deadline=deadline,
                timeout_seconds=timeout_seconds,
                code_version=definition.version if definition is not None else None,
                admitted_by=principal.token_id,
                if_exists=req.if_exists,
                # This span's context (else the caller's): the deliveries' parent.
                traceparent=tracing.current_traceparent() or incoming,
                request_id=REQUEST_ID.get(),
                queue=queue,
                concurrency_key=concurrency_key,
                priority=req.priority,
                start_at=start_at,
                delay_seconds=req.delay_seconds,
            )
    except InvalidEvent as exc:
        raise ApiError(
            422, "INVALID_EXECUTION_EVENT",
            f"params or context cannot be stored exactly ({exc}); send plain JSON values",
        ) from None
    if isinstance(result, Existing):
        existing = await _existing_record(store, settings, principal, result)
        if existing is not None:
            # Serialized by the model, exactly as GET /v1/executions/{id} answers.
            body = ExecutionRecord.model_validate(existing).model_dump(mode="json", by_alias=True)
            return JSONResponse(body, status_code=200,
                                headers={"Location": f"/v1/executions/{result.execution_id}"})
        # Another token's execution: only that the ID is taken (below).
        result = Conflict(result.execution_id, result.status, req.workflow_id)
    if isinstance(result, Conflict):
        if result.status == "retired":
            raise ApiError(
                409, "EXECUTION_ID_CONFLICT",
                f"execution ID {result.execution_id!r} was retired: its execution ended and was "
                "deleted by retention, and an ID is never reused; admit under a new ID",
                executionId=result.execution_id, status="retired",
            )
        if principal.owns_only():
            _, owner = await store.history.admitted_by(result.execution_id)
            if owner != principal.token_id:
                # Another's execution: say only that the ID is taken.
                raise ApiError(
                    409, "EXECUTION_ID_CONFLICT",
                    f"execution ID {result.execution_id!r} is already taken; IDs are never "
                    "reused: admit under a new ID",
                    executionId=result.execution_id,
                )
        raise ApiError(
            409,
            "EXECUTION_ID_CONFLICT",
            f"execution {result.execution_id!r} already exists (status {result.status}); "
            "IDs are never reused: read it with GET, or admit a new execution under a new ID",
            executionId=result.execution_id,
            status=result.status,
            workflowId=result.workflow_id,
        )
    return _admitted(result.execution_id, result.status)


# The busiest route: its endpoint is called directly (DirectRoute).
router.add_api_route(
    "",
    admit,
    methods=["POST"],
    route_class_override=DirectRoute,
    status_code=201,
    response_model=Admission,
    summary="Admit an execution: record it once and make it due now (or at startAt / after "
    "delaySeconds), on its workflow's queue",
    openapi_extra=_body_schema(AdmitRequest),
    responses={
        **FORBIDDEN,
        **ERRORS,
        200: {"model": ExecutionRecord,
              "description": "ifExists=return: the execution already admitted under this ID "
              "with this workflowId and equal params (nothing new admitted)"},
        404: refusal("WORKFLOW_NOT_FOUND"),
        409: refusal("EXECUTION_ID_CONFLICT: names the existing execution"),
        422: refusal("INVALID_REQUEST / INVALID_EXECUTION_EVENT / INVALID_PARAMS / "
                     "RESERVED_EXECUTION_ID / DEADLINE_IN_THE_PAST / INVALID_CONCURRENCY_KEY: "
                     "the workflow's declared concurrency key cannot be made from these params"),
        **RATE_LIMITED,
    },
)


def _admitted(execution_id: str, status: str) -> Response:
    """The 201, rendered here rather than through the Admission model: the
    same bytes (compact JSON, executionId then status) and the same headers
    in the same order (content-length, content-type, location)."""
    answer = Response(orjson.dumps({"executionId": execution_id, "status": status}),
                      status_code=201, media_type="application/json")
    answer.raw_headers.append((b"location", f"/v1/executions/{execution_id}".encode()))
    return answer


def _flow_of(definition: WorkflowDefinition | None, req: AdmitRequest) -> tuple[str, str | None]:
    """The queue an admitted execution is on (its workflow's, else the
    default one) and its concurrency key (the body's, else the one its
    workflow declares from the params, else none)."""
    queue = definition.queue.name if definition is not None else DEFAULT_QUEUE
    if req.concurrency_key is not None or definition is None:
        return queue, req.concurrency_key
    try:
        key = definition.key_of(req.params)
    # The declared key is the workflow author's code run on these params:
    # whatever it raises, these params have no key it can make.
    except Exception as exc:
        raise ApiError(
            422, "INVALID_CONCURRENCY_KEY",
            f"{exc}; nothing was admitted. Fix the params, or give concurrencyKey",
        ) from None
    if key is not None and _UNSTORABLE_TEXT.search(key):
        raise ApiError(
            422, "INVALID_CONCURRENCY_KEY",
            f"the concurrency key of {req.workflow_id!r} cannot hold NUL or lone surrogates; "
            "nothing was admitted. Fix the params, or give concurrencyKey",
        )
    return queue, key


async def _existing_record(store, settings, principal, existing: Existing) -> dict | None:
    """The record ifExists=return answers with; None when the principal may
    not see it (a trigger-only token's view of another's execution)."""
    row = await store.history.get(existing.execution_id, owner=owner_of(principal))
    if row is None:
        return None
    return _view(principal, row, await live_workflows(store, settings, [row]))


def _view(principal, row: HealedExecution, live: set[str] | None) -> dict:
    view = record(row, live)
    view["outcome"] = outcome_for(principal, view["outcome"])
    return view


@router.get(
    "",
    response_model=ExecutionPage,
    # Unset: an item's outcome, present only with include=outcome.
    response_model_exclude_unset=True,
    summary="List executions, newest first (keyset pagination)",
    responses={422: refusal("INVALID_REQUEST / INVALID_CURSOR / "
                            "UNKNOWN_QUERY_PARAMETER"),
               503: ERRORS[503]},
    dependencies=[STRICT_QUERY],
)
async def list_executions(
    store: StoreDep,
    settings: SettingsDep,
    principal: Reader,
    status: Annotated[Status | None, Query()] = None,
    workflow_id: Annotated[str | None, Query(alias="workflowId", pattern=ID_PATTERN)] = None,
    code_version: Annotated[str | None, Query(
        alias="codeVersion", min_length=1, max_length=200,
        description="only executions admitted under this code version (with workflowId)")] = None,
    min_unacknowledged_deliveries: Annotated[
        int | None, Query(alias="minUnacknowledgedDeliveries", ge=0, le=2**31 - 1)
    ] = None,
    parent_execution_id: Annotated[
        str | None, Query(alias="parentExecutionId", pattern=EXECUTION_ID_PATTERN)
    ] = None,
    admitted_after: Annotated[TimeString | None, Query(
        alias="admittedAfter", description="only executions admitted at or after this time "
        "(with a time zone offset)")] = None,
    admitted_before: Annotated[TimeString | None, Query(
        alias="admittedBefore", description="only executions admitted before this time "
        "(with a time zone offset)")] = None,
    blocked_by: Annotated[BlockedReason | None, Query(
        alias="blockedBy", description="only executions whose blockedBy.reason is this")] = None,
    include: Annotated[Literal["outcome"] | None, Query(
        description="outcome: add each item's outcome (null until terminal)")] = None,
    cursor: Annotated[str | None, Query(max_length=1000)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
):
    if code_version is not None and (workflow_id is None or _UNSTORABLE_TEXT.search(code_version)):
        raise ApiError(422, "INVALID_REQUEST",
                       "codeVersion filters one workflow's executions: give workflowId too, "
                       "and a version without NUL or lone surrogates")
    for name, moment in (("admittedAfter", admitted_after), ("admittedBefore", admitted_before)):
        if moment is None:
            continue
        try:
            if moment.tzinfo is None:
                raise ValueError
            moment.astimezone(UTC)
        except (ValueError, OverflowError):
            raise ApiError(
                422, "INVALID_REQUEST",
                f"{name}: give a time with a time zone offset between years 0001 and 9999 "
                "(for example 2026-01-01T00:00:00Z)",
            ) from None
    if cursor is not None:
        try:
            after_at, after_id = decode_cursor(cursor)
            # Issued cursors carry an aware time and a stored ID; anything else
            # (naive or out-of-range time, NUL in the ID) would fail in Postgres.
            if after_at.tzinfo is None or _UNSTORABLE_TEXT.search(after_id):
                raise ValueError("not an issued cursor")
            after_at.astimezone(UTC)
        except (ValueError, OverflowError):
            raise ApiError(
                422, "INVALID_CURSOR",
                "cursor is not one this server issued; pass nextCursor from the previous page",
            ) from None
    # With blockedBy, the live workflows are read first: the filter and each
    # item's blockedBy then answer from the same set (due vs no-worker).
    live: set[str] | None = (await store.history.live_workflow_ids(3 * settings.renew_seconds + 1)
            if blocked_by is not None else None)
    rows, next_cursor = await store.history.list(
        blocked_by=blocked_by.value if blocked_by is not None else None, live_workflows=live,
        status=status,
        workflow_id=workflow_id,
        code_version=code_version,
        min_unacknowledged_deliveries=min_unacknowledged_deliveries,
        cursor=cursor,
        limit=limit,
        # The owner predicate is in the listing's statement.
        admitted_by=owner_of(principal),
        parent_execution_id=parent_execution_id,
        admitted_after=admitted_after,
        admitted_before=admitted_before,
    )
    if live is None:
        live = await live_workflows(store, settings, rows)
    items = [summary(r, live) for r in rows]
    if include == "outcome":
        for item, row in zip(items, rows, strict=True):
            item["outcome"] = outcome_for(principal, row["outcome"])
    return {"executions": items, "nextCursor": next_cursor}


@router.get(
    "/{execution_id}",
    response_model=ExecutionRecord,
    summary="Read one execution's record; with waitSeconds, as soon as it ends (long-poll)",
    responses={404: refusal("EXECUTION_NOT_FOUND"),
               422: refusal("INVALID_REQUEST"),
               503: ERRORS[503]},
)
async def get_execution(
    execution_id: str, request: Request, store: StoreDep, settings: SettingsDep,
    principal: Reader,
    wait_seconds: Annotated[float, Query(
        alias="waitSeconds", ge=0, le=60,
        description="Wait up to this many seconds (0-60) for the execution to end: answered "
        "as soon as it is terminal, else with its current record when the time is up")] = 0,
):
    _check_path_id(execution_id)

    async def read() -> HealedExecution:
        # One statement reads the record under the owner predicate: foreign = missing.
        row = await store.history.get(execution_id, owner=owner_of(principal))
        if row is None:
            raise not_found(execution_id)
        return row

    if wait_seconds > 0:
        # Registered before the read: an end after it wakes this waiter.
        with request.app.state.waiters.watch(execution_id) as ended:
            # Before the read: an end committed after the read is announced.
            await store.history.watch_execution(execution_id)
            row = await read()
            if row["status"] not in TERMINAL_STATUSES:
                if not await wait_or_gone(ended, wait_seconds, request.receive):
                    return Response(status_code=204)  # the client went away: nobody reads it
                row = await read()
    else:
        row = await read()
    return _view(principal, row, await live_workflows(store, settings, [row]))


@router.post(
    "/{execution_id}/wakes",
    response_model=WakeAnswer,
    summary="Ask for a delivery at a time (default now); wakes merge to the earliest",
    openapi_extra=_optional_body_schema(WakeRequest),
    responses={**FORBIDDEN, **ERRORS,
               404: refusal("EXECUTION_NOT_FOUND")},
)
async def request_wake(execution_id: str, request: Request, store: StoreDep, settings: SettingsDep,
                       principal: Waker):
    # The whole body first (within FENCEPOST_BODY_TIMEOUT_SECONDS), then one
    # statement that checks the owner and writes: nothing admitted while the
    # body was on its way can be woken by another token.
    body = await _optional_json(request, settings)
    _check_path_id(execution_id)
    at = None
    if body is not None:
        try:
            at = WakeRequest.model_validate(body).at
        except ValidationError as exc:
            raise _invalid(exc, "INVALID_REQUEST") from None
    answer = await commands.wake(store, execution_id, at, owner=owner_of(principal))
    return {"status": answer}
