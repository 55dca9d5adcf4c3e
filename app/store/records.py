"""The rows the store's reads return, one TypedDict per shape.

A record is a plain dict at run time, keyed exactly as the statement names
its columns (snake_case); camelCase belongs to the API's views, never here.
The TypedDicts tell the type checker every key a caller may read and its
type: JSON values are `Any` (or a JSON object, `dict[str, Any]`), every
other column is its Postgres type, `| None` where the column or the
statement can give NULL.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, TypedDict, TypeVar, cast

import asyncpg

R = TypeVar("R", bound=Mapping[str, object])


def record(kind: type[R], row: asyncpg.Record) -> R:
    """`row` as the record `kind` (a TypedDict whose keys are the row's columns)."""
    return cast(R, dict(row))


def records(kind: type[R], rows: Iterable[asyncpg.Record]) -> list[R]:
    """Each of `rows` as the record `kind`, in order."""
    return [cast(R, dict(r)) for r in rows]


# ------------------------------------------------------------------ executions


class HealedExecution(TypedDict):
    """One execution as reads report it: the healed record (the state the
    reaper and the sweep will leave it in, before they have written it),
    with the database time it was read at."""

    execution_id: str
    workflow_id: str
    params: Any
    context: dict[str, Any]
    code_version: str | None
    admitted_at: datetime
    updated_at: datetime
    token: int
    deadline: datetime | None
    cancel_requested_at: datetime | None
    ever_suspended: bool
    waiting_on: dict[str, Any] | None
    cancel_requested_by: str | None
    admitted_by: str | None
    parent_execution_id: str | None
    integrity_conflicts: int
    redrives: int
    forked_from: str | None
    forked_from_step: str | None
    queue: str
    concurrency_key: str | None
    priority: int
    # The lease ran out and nobody has ended it yet (the raw row says running).
    lease_expired: bool
    status: str
    outcome: dict[str, Any] | None
    parked_reason: str | None
    parked_step: str | None
    parked_detail: dict[str, Any] | None
    unacknowledged_deliveries: int
    due_at: datetime | None
    last_unacknowledged_at: datetime | None
    redeliver_after: datetime | None
    lease_owner: str | None
    lease_expires_at: datetime | None
    read_at: datetime


class DashboardExecution(HealedExecution):
    """One execution of the dashboard's listing: the healed record and why it
    waits (the blockedBy rule's reason; 'none' when it has ended)."""

    blocked_reason: str


class EventRecord(TypedDict):
    """One event of an execution's history, in the order written."""

    event_id: int
    seq: int  # its place in the history: the order (increasing, with gaps)
    at: datetime
    kind: str
    token: int | None
    detail: dict[str, Any] | None


class LateObservation(TypedDict):
    """A write a holder attempted after its lease was gone, kept (never
    applied), compared with what was recorded: `conflict` NULL nothing to
    compare with, false the same, true different."""

    observation_id: int
    step_key: str | None
    token: int
    owner: str | None
    value: Any
    error: dict[str, Any] | None
    observed_at: datetime
    conflict: bool | None


class StepDetail(TypedDict):
    """A recorded step, or an effect attempt with no recorded step yet (its
    outcome in doubt: `recorded_at` NULL). `value` and `error` are loaded
    only when asked (else NULL); `value_bytes` is the stored value's size."""

    step_key: str
    status: str
    attempts: int
    token: int
    function_name: str | None
    recorded_at: datetime | None
    started_at: datetime | None
    idempotency_key: str | None
    value: Any
    error: dict[str, Any] | None
    value_bytes: int | None
    error_name: str | None


class StepPageRow(StepDetail):
    """One row of an execution's step pages: a recorded step (`grp` 0), an
    effect attempt in doubt (1) or a step a redrive superseded (2, status
    'superseded', with when and by which redrive), its keyset position
    (`grp`, `sort_at`, `step_key`) and the step's failed attempts (the last
    kept, oldest first: {attempt, at, name, message})."""

    grp: int
    sort_at: datetime
    superseded_at: datetime | None
    redrive: int | None
    failed_attempts: list[dict[str, Any]] | None


class AttemptRecord(TypedDict):
    """A failed attempt of a step, or a delivery's `Retry` reason (`step_key` NULL)."""

    step_key: str | None
    attempt: int
    token: int
    error: dict[str, Any]
    at: datetime


class OutcomeUnknownEffect(TypedDict):
    """An effect attempt whose outcome is in doubt, waiting for an operator."""

    step_key: str
    idempotency_key: str
    function_name: str | None
    attempts: int
    token: int
    started_at: datetime
    updated_at: datetime


class ActivityMinute(TypedDict):
    """One minute of the dashboard's activity: completions, failures (failed
    or timed out) and unacknowledged deliveries (released or expired)."""

    minute: datetime
    completed: int
    failed: int
    unacknowledged: int


class TreeCancelled(TypedDict):
    """A cancel (or terminate) that reached an unfinished execution: its
    status after the request ('cancelled', or unchanged while its cleanup
    may run) and how many of it and its descendants were cancelled at once."""

    status: str
    cancelled_now: int


class QueueSettings(TypedDict):
    """A queue's settings: what code declares and what an operator set at
    run time (each as given), and the effective ones (the run-time setting
    of a field wins; NULL: no such limit)."""

    name: str
    declared: dict[str, Any]
    override: dict[str, Any]
    updated_at: datetime
    concurrency: int | None
    per_key_concurrency: int | None
    rate_limit: int | None
    rate_period: float | None
    rate_per_key: bool
    hold_while_suspended: bool
    paused: bool


class DashboardQueue(QueueSettings):
    """A queue as the dashboard shows it: its settings (QueueSettings), the
    slots it holds now (`running`, as the claim counts), its starts within
    the rate period when rate-limited per queue (`starts`, the oldest at
    `oldest_start`), its due executions and how many of those its limits or
    a pause hold back (`limited`)."""

    running: int
    starts: int | None
    oldest_start: datetime | None
    due: int
    limited: int



class QueueCounts(TypedDict):
    """What a queue holds now: slots held (`running`, as the claim counts),
    executions due, and starts within the rate period (None without a rate limit)."""

    running: int
    due: int
    starts_in_period: int | None


class QueueChangeRecord(TypedDict):
    """One change of a queue's settings: when, who (`code` for a changed
    declaration) and what changed."""

    change_id: int
    at: datetime
    actor: str | None
    change: dict[str, Any]


# --------------------------------------------------------------------- workers


class WorkerHolder(TypedDict):
    """The live worker that holds a worker ID another process asked for."""

    host: str
    pid: int
    heartbeat_at: datetime


class WorkerRecord(TypedDict):
    """A registered worker, whether it is alive (not stopped, heartbeat
    recent), and the deliveries the database sees it running: `in_flight`
    every running row it owns, `leases_held` those with a live lease."""

    worker_id: str
    host: str
    pid: int
    workflows: list[str]
    versions: dict[str, str | None]
    concurrency: int
    started_at: datetime
    heartbeat_at: datetime
    stopped_at: datetime | None
    alive: bool
    leases_held: int
    in_flight: int


class MetricsSnapshot(TypedDict):
    """The gauges of one scrape, over unfinished executions as reads report
    them: counts per status (and per workflow), parked per reason, waiting
    per (reason, workflow), the oldest wait per reason in seconds, and the
    live workers and their capacity."""

    by_status: dict[str, int]
    by_status_workflow: dict[tuple[str, str], int]
    parked: dict[str, int]
    waiting: dict[tuple[str, str], int]
    oldest_by_reason: dict[str, float]
    outcome_unknown: int
    unacknowledged_executions: int
    unacknowledged_sum: int
    integrity_conflicts: int
    live_workers: int
    live_capacity: int
    queues: dict[str, QueueGauges]


class QueueLimits(TypedDict):
    """A queue's effective limits (None: no such limit)."""

    concurrency: int | None
    per_key_concurrency: int | None
    rate_limit: int | None
    rate_period_seconds: float | None


class QueueGauges(TypedDict):
    """One queue's gauges: slots held now (`running`, as the claim counts),
    due executions, those of them its limits or a pause hold back, and its
    effective limits."""

    running: int
    due: int
    limited: int
    limits: QueueLimits


# ------------------------------------------------------------ tokens, sessions


class TokenRecord(TypedDict):
    """An API token as listed (never its secret's hash), with its quotas (NULL: none)."""

    token_id: str
    name: str
    role: str
    created_at: datetime
    revoked_at: datetime | None
    admissions_per_minute: int | None
    signals_per_minute: int | None


class TokenSecret(TypedDict):
    """A live token, with the SHA-256 of its secret to check a bearer against."""

    token_id: str
    name: str
    role: str
    secret_sha256: str


class SessionToken(TypedDict):
    """The token a valid dashboard session was opened with."""

    token_id: str
    name: str
    role: str


# ------------------------------------------------------------------- schedules


class ScheduleRecord(TypedDict):
    """A schedule: its definition (`source` 'code' or 'api'), whether it is
    paused, its catch-up bound (NULL: the worker's) and the last slot evaluated."""

    schedule_id: str
    workflow_id: str
    cron: str
    timezone: str
    params: Any
    paused: bool
    catch_up: int | None
    source: str
    created_at: datetime
    last_slot: datetime
    updated_at: datetime


class ScheduleRead(ScheduleRecord):
    """A schedule with the database's time of the read (to say when it fires next)."""

    db_now: datetime


class ScheduleEventRecord(TypedDict):
    """One event of a schedule's own history."""

    event_id: int
    at: datetime
    kind: str
    detail: dict[str, Any] | None


# ------------------------------------------------------------- bulk operations


class OperationFailure(TypedDict):
    """An execution a bulk operation's action failed on, with the error code
    the single-execution API answers with."""

    execution_id: str
    code: str
    message: str


class OperationRecord(TypedDict):
    """A bulk operation, its progress (items done, failed, pending) and its
    first failed items."""

    operation_id: str
    action: str
    filter: dict[str, Any]
    options: dict[str, Any]
    reason: str | None
    created_by: str
    status: str
    matched: int
    created_at: datetime
    finished_at: datetime | None
    done: int
    failed: int
    pending: int
    failures: list[OperationFailure]
