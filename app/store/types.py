"""Values the store returns and the errors it answers with."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import asyncpg

from app.schema import TERMINAL_STATUSES

NOTIFY_CHANNEL = "fencepost_due"


class LeaseLost(Exception):
    """A fenced write carried a token that is no longer current, or the lease
    was already ended. Nothing was written; the delivery must stop."""

    def __init__(self, execution_id: str, token: int):
        super().__init__(f"lease on {execution_id} with token {token} is no longer current")
        self.execution_id = execution_id
        self.token = token


class InvalidEvent(Exception):
    """Params or context that Postgres cannot store exactly as given."""


@dataclass(frozen=True)
class Lease:
    execution_id: str
    token: int
    expires_at: datetime
    owner: str


@dataclass(frozen=True)
class Delivery:
    """A claim, with the record prefetched so the worker needs no second read."""

    lease: Lease
    workflow_id: str
    params: Any
    context: dict
    status_before: str
    outcome: dict | None
    unacknowledged_deliveries: int
    deadline: datetime | None
    code_version: str | None
    claimed_at: datetime  # database time of the claim
    # The claim took over a lease that had expired unacknowledged (a crash,
    # a pause): counted as a lease expiry, like the reaper's.
    taken_over: bool = False


@dataclass(frozen=True)
class Admitted:
    execution_id: str
    status: str


@dataclass(frozen=True)
class Conflict:
    execution_id: str
    status: str
    workflow_id: str


@dataclass(frozen=True)
class StepRecord:
    step_key: str
    status: str
    value: Any
    error: dict | None
    function_name: str | None
    attempts: int
    token: int
    recorded_at: datetime
    # Set on a fenced write's answer when the holder should stop at this step:
    # "cancel" (a cancel was requested) or "deadline" (the deadline passed).
    interrupt: str | None = None


@dataclass(frozen=True)
class Acknowledged:
    status: str
    outcome: dict | None


@dataclass(frozen=True)
class ReapResult:
    expired: int
    execution_ids: list[str]


WakeAnswer = Literal["requested", "ignored", "not_found"]

_TERMINAL_SQL = "(" + ", ".join(f"'{s}'" for s in TERMINAL_STATUSES) + ")"

# Reads heal lazily: a running record whose lease has expired is reported as
# the reaper will leave it (status back, counter +1, pending wakes merged,
# redelivery delay from the expiry) before the reaper has written it.
# $1 = redelivery base seconds, $2 = cap seconds.
_RECORD_COLUMNS = """
    execution_id, workflow_id, params, context, code_version, outcome,
    admitted_at, updated_at, token, deadline, cancel_requested_at,
    parked_reason, parked_step, ever_suspended, waiting_on, cancel_requested_by, admitted_by,
    parent_execution_id,
    (status = 'running' AND lease_expires_at <= now()) AS lease_expired,
    CASE WHEN status = 'running' AND lease_expires_at <= now()
         THEN CASE WHEN ever_suspended THEN 'suspended' ELSE 'admitted' END
         ELSE status END AS status,
    unacknowledged_deliveries
        + (status = 'running' AND lease_expires_at <= now())::int AS unacknowledged_deliveries,
    CASE WHEN status = 'running' AND lease_expires_at <= now()
         THEN least(due_at, covered_due_at) ELSE due_at END AS due_at,
    CASE WHEN status = 'running' AND lease_expires_at <= now()
         THEN lease_expires_at ELSE last_unacknowledged_at END AS last_unacknowledged_at,
    CASE WHEN status = 'running' AND lease_expires_at <= now()
         THEN lease_expires_at
              + fencepost_redelivery_delay(unacknowledged_deliveries + 1, $1, $2)
         ELSE redeliver_after END AS redeliver_after,
    CASE WHEN status = 'running' AND lease_expires_at > now() THEN lease_owner END AS lease_owner,
    CASE WHEN status = 'running' AND lease_expires_at > now() THEN lease_expires_at END
        AS lease_expires_at,
    now() AS read_at
"""


def _encode_cursor(admitted_at: datetime, execution_id: str) -> str:
    raw = json.dumps([admitted_at.isoformat(), execution_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """Raises ValueError for a cursor this store did not issue."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at, execution_id = json.loads(raw)
        return datetime.fromisoformat(at), str(execution_id)
    except Exception as exc:  # any malformed cursor is the caller's mistake
        raise ValueError("cursor is not one this server issued") from exc


# Selected by every fence: tells the current holder to stop at this step.
INTERRUPT_SQL = (
    "CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancel' "
    "WHEN deadline <= now() THEN 'deadline' END AS interrupt"
)


def _step(row: asyncpg.Record, interrupt: str | None = None) -> StepRecord:
    return StepRecord(
        step_key=row["step_key"],
        status=row["status"],
        value=row["value"],
        error=row["error"],
        function_name=row["function_name"],
        attempts=row["attempts"],
        token=row["token"],
        recorded_at=row["recorded_at"],
        interrupt=interrupt,
    )
