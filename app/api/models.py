"""Request and response bodies, in camelCase on the wire."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel

from app.blocked import REASONS, blocked_by
from app.schema import STATUSES
from app.store.records import HealedExecution, WorkerRecord

ID_PATTERN = r"^[A-Za-z0-9._:-]{1,200}$"
ID_RULE = "1 to 200 characters from A-Z a-z 0-9 . _ : -"
# Any execution ID a filter may name: client IDs, and the IDs fencepost
# derives (children `{parent}~{key}`, slots `{scheduleId}~{slot}`), which may
# be longer than a client's.
EXECUTION_ID_PATTERN = r"^[A-Za-z0-9._:~-]{1,1000}$"

Status = Literal[STATUSES]  # type: ignore[valid-type]

# A delayed start further out than a year is a mistake, not a plan.
MAX_DELAY_SECONDS = 366 * 86400


# A date and time with its offset (RFC 3339, the schema's date-time).
_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")
TIME_RULE = "give a date and time with its offset, for example 2026-01-01T00:00:00Z"


def _time_string(value: Any) -> Any:
    """Times travel as RFC 3339 strings, as documented: pydantic alone would
    also read a number, or a string of digits, as a Unix timestamp, and a
    time without an offset as naive."""
    if value is not None and not (isinstance(value, str) and _RFC3339.fullmatch(value)):
        raise ValueError(TIME_RULE)
    return value


# A date-time in a body or a query parameter (each query value is a string).
TimeString = Annotated[datetime, BeforeValidator(_time_string)]

# The latest time stored from a request (a start or a deadline): the driver
# stores its greatest datetime as infinity, which reads back without a zone.
LATEST_TIME = datetime(9999, 12, 31, tzinfo=UTC)


def in_utc(moment: datetime) -> datetime | None:
    """`moment` (with an offset) in UTC, at most LATEST_TIME; None when it
    lies before the first instant a datetime holds in UTC (year 1 with a
    positive offset). Sending such a time to Postgres would fail instead."""
    try:
        return min(moment.astimezone(UTC), LATEST_TIME)
    except OverflowError:
        return None if moment.year == 1 else LATEST_TIME


def _json_integer(value: Any) -> Any:
    """An integer as JSON has it: a number without a fraction (2 and 2.0
    alike), never a boolean (false read as 0) or a string of digits."""
    if isinstance(value, bool | str):
        raise ValueError("give a JSON integer")
    return value


# After a field's constraints in its Annotated (so the schema states them as
# minimum/maximum): Annotated[int, Field(ge=0), JSON_INTEGER].
JSON_INTEGER = BeforeValidator(_json_integer)


class Camel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class AdmitRequest(Camel):
    # camelCase only: snake_case spellings are unknown fields.
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=False, extra="forbid",
        json_schema_extra={"examples": [
            {"workflowId": "charge-order", "executionId": "order-42", "params": {"order_id": 42},
             "timeoutSeconds": 3600, "ifExists": "return"}]})

    workflow_id: str = Field(pattern=ID_PATTERN, description=f"Registered workflow; {ID_RULE}.")
    execution_id: str | None = Field(
        None,
        pattern=ID_PATTERN,
        description=f"Caller-chosen ID ({ID_RULE}); omitted: the server picks one. Never reused.",
    )
    params: Any = Field(default_factory=dict, description="Any JSON value, stored once.")
    context: dict[str, Any] = Field(default_factory=dict, description="A JSON object, stored once.")
    deadline: TimeString | None = Field(
        None, description="RFC 3339 time with offset; past it the execution ends timed_out."
    )
    timeout_seconds: float | None = Field(
        None, gt=0, le=10 * 365 * 86400, strict=True,
        description="Deadline relative to admission (database clock); not with deadline.",
    )
    if_exists: Literal["error", "return"] = Field(
        "error",
        description="When executionId is taken: error (409 EXECUTION_ID_CONFLICT), or return "
        "(200 with the existing record when it has this workflowId and equal params; else 409).",
    )
    priority: Annotated[int, Field(ge=-1000, le=1000), JSON_INTEGER] = Field(
        0, description="Order among the queue's due executions: lower first; equal priorities "
        "first due, first claimed. A steady stream of lower numbers can starve higher ones.",
    )
    start_at: TimeString | None = Field(
        None, description="First due at this time (RFC 3339 with offset; a past time is now). "
        "Not with delaySeconds.",
    )
    delay_seconds: float | None = Field(
        None, ge=0, le=MAX_DELAY_SECONDS, strict=True,
        description="First due this many seconds after admission (database clock). "
        "Not with startAt.",
    )
    concurrency_key: str | None = Field(
        None, min_length=1, max_length=200,
        description="The key per-key limits of the queue count under; wins over the key the "
        "workflow declares. Omitted: the declared key, else none (no per-key limit).",
    )


class Admission(Camel):
    execution_id: str
    status: Status


class WakeRequest(Camel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=False, extra="forbid")

    at: TimeString | None = Field(
        None, description="Due time (RFC 3339 with offset); omitted: now (database clock)."
    )


class WakeAnswer(Camel):
    status: Literal["requested", "ignored"]


class SignalAnswer(Camel):
    status: Literal["received"]


class LeaseView(Camel):
    token: int
    owner: str | None
    expires_at: datetime


class ExecutionSummary(Camel):
    execution_id: str
    workflow_id: str
    status: Status
    admitted_at: datetime
    updated_at: datetime
    due_at: datetime | None
    lease: LeaseView | None
    token: int
    unacknowledged_deliveries: int
    last_unacknowledged_at: datetime | None
    redeliver_after: datetime | None
    deadline: datetime | None
    cancel_requested_at: datetime | None
    parent_execution_id: str | None = None
    redrives: int = Field(0, description="Times redriven (POST .../redrive).")
    forked_from: dict[str, str] | None = Field(
        None, description="{executionId, step} of the execution this one was forked from.")
    parked: dict[str, Any] | None = Field(
        None, description="{reason (poison, outcome_unknown, nondeterminism), step, divergence "
        "(for nondeterminism: {position, recorded, asked, message}, where code and history "
        "first disagree; else null)} while parked.")
    integrity_conflicts: int = Field(
        0, description="Late observations of stale holders that differ from what was recorded "
        "(the recorded value stands); see the events of kind integrity_conflict.",
    )
    queue: str = Field(description="The queue whose limits it runs under (its workflow's, "
                       "else `default`).")
    concurrency_key: str | None = Field(
        description="The key per-key limits count it under; null: no per-key limit.")
    priority: int = Field(description="Order among the queue's due executions: lower first.")
    blocked_by: dict[str, Any] | None = Field(
        None, description="Why it is not moving: reason ("
        + ", ".join(r for r in REASONS if r != "none")
        + ") and what it waits on; null when terminal. Computed from the record as the "
        "reaper will leave it (an expired lease, a cancel request, a passed deadline, "
        "the poison threshold). A due execution its queue holds back reads queue-paused "
        "{queue}, concurrency-limit {queue, key (when its key's per-key limit is the full "
        "one), running (slots held), limit} or rate-limited {queue, key (a rate limit per "
        "key), until (when the oldest start counted in the period leaves it)}, counted as "
        "the claim counts. A due execution (or one whose lease expired) admitted under a "
        "code version that live workers run its workflow but none carries that version "
        "reads no-worker-for-version {workflowId, version, since}; no live worker running "
        "the workflow at all reads no-worker.",
    )
    code_version: str | None = Field(
        None, description="The workflow's `version=` when this execution was admitted."
    )


class ExecutionRecord(ExecutionSummary):
    params: Any
    context: dict[str, Any]
    outcome: dict[str, Any] | None = Field(
        None,
        description="Terminal only: {result} when completed; {error: {name, message}} when "
        "failed, cancelled or timed_out.",
    )


class WorkerView(Camel):
    worker_id: str
    host: str
    pid: int
    workflows: list[str]
    versions: dict[str, str | None] = Field(
        description="The code version it carries of each workflow: it runs the executions "
        "admitted under that version, and those admitted without one. A workflow missing "
        "here or null: unversioned (it runs only executions admitted without a version).")
    concurrency: int
    capacity: int = Field(description="Most deliveries it runs at once (its --concurrency).")
    leases_held: int = Field(description="Executions it holds an unexpired lease on.")
    in_flight: int = Field(description="Deliveries it started that have not ended, as the "
                           "database sees them (leases held, and expired ones not yet taken "
                           "over).")
    started_at: datetime = Field(description="When this process (the latest under this ID) "
                                 "registered.")
    heartbeat_at: datetime
    stopped_at: datetime | None
    alive: bool
    maintenance_roles: list[str] = Field(
        description="The maintenance roles whose lease this worker holds now (unexpired), "
                    "by name: `sweeps` (the expired-lease reaper, retention and bulk "
                    "operations) and `schedules <workflows>` (the scheduler of that set of "
                    "workflows). One worker holds each role; empty on the others.")


class WorkerList(Camel):
    workers: list[WorkerView]


def worker_view(row: WorkerRecord, maintenance_roles: list[str]) -> dict:
    return {
        "workerId": row["worker_id"], "host": row["host"], "pid": row["pid"],
        "workflows": row["workflows"], "versions": row["versions"],
        "concurrency": row["concurrency"],
        "capacity": row["concurrency"], "leasesHeld": row["leases_held"],
        "inFlight": row["in_flight"],
        "startedAt": row["started_at"], "heartbeatAt": row["heartbeat_at"],
        "stoppedAt": row["stopped_at"], "alive": row["alive"],
        "maintenanceRoles": maintenance_roles,
    }


class ExecutionListItem(ExecutionSummary):
    outcome: dict[str, Any] | None = Field(
        None, description="With include=outcome only: the record's outcome (null until terminal).")


class ExecutionPage(Camel):
    executions: list[ExecutionListItem]
    next_cursor: str | None = Field(None, description="Pass as `cursor` for the next page.")


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="allow")
    code: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


def summary(row: HealedExecution, live_workflows: set[str] | None = None) -> dict:
    lease = None
    if row["lease_expires_at"] is not None:
        lease = {"token": row["token"], "owner": row["lease_owner"], "expiresAt": row["lease_expires_at"]}
    return {
        "executionId": row["execution_id"],
        "workflowId": row["workflow_id"],
        "status": row["status"],
        "admittedAt": row["admitted_at"],
        "updatedAt": row["updated_at"],
        "dueAt": row["due_at"],
        "lease": lease,
        "token": row["token"],
        "unacknowledgedDeliveries": row["unacknowledged_deliveries"],
        "lastUnacknowledgedAt": row["last_unacknowledged_at"],
        "redeliverAfter": row["redeliver_after"],
        "deadline": row["deadline"],
        "cancelRequestedAt": row["cancel_requested_at"],
        "parentExecutionId": row["parent_execution_id"],
        "integrityConflicts": row["integrity_conflicts"],
        "redrives": row["redrives"],
        "forkedFrom": (
            {"executionId": row["forked_from"], "step": row["forked_from_step"]}
            if row["forked_from"] is not None else None
        ),
        "parked": (
            {"reason": row["parked_reason"], "step": row["parked_step"],
             # For `nondeterminism`: where code and history first disagree.
             "divergence": row["parked_detail"]}
            if row["status"] == "parked" else None
        ),
        "queue": row["queue"],
        "concurrencyKey": row["concurrency_key"],
        "priority": row["priority"],
        "blockedBy": blocked_by(row, live_workflows),
        "codeVersion": row["code_version"],
    }


def record(row: HealedExecution, live_workflows: set[str] | None = None) -> dict:
    return {
        **summary(row, live_workflows),
        "params": row["params"],
        "context": row["context"],
        "outcome": row["outcome"],
    }
