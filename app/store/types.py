"""Values the store returns and the errors it answers with."""

from __future__ import annotations

import base64
import functools
import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import asyncpg

from app.schema import TERMINAL_STATUSES

NOTIFY_CHANNEL = "fencepost_due"
# Every statement that ends executions names each on this channel (payload:
# the execution ID) at commit, for whoever waits for an end (long-polls).
ENDED_CHANNEL = "fencepost_ended"


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
    context: dict[str, Any]
    status_before: str
    outcome: dict[str, Any] | None
    unacknowledged_deliveries: int
    deadline: datetime | None
    code_version: str | None
    claimed_at: datetime  # database time of the claim
    # The claim took over a lease that had expired unacknowledged (a crash,
    # a pause): counted as a lease expiry, like the reaper's.
    taken_over: bool = False
    # A cleanup delivery: "cancel" (a cancel was requested) or "deadline" (the
    # deadline passed) - raised into the code at its first step that is not a
    # replay; and when its cleanup window closes (no code runs after).
    interrupt: str | None = None
    cleanup_ends: datetime | None = None
    # Steps may be recorded: a holder came before this one (token > 1), or
    # a fork copied them before its first claim.
    has_history: bool = True
    # The admission's W3C trace context: this delivery's span is its child.
    traceparent: str | None = None
    # Its queue, and whether it took a slot of a concurrency limit (its end
    # frees one, so the worker claims again at once rather than at its poll).
    queue: str = "default"
    slot_limited: bool = False


@dataclass(frozen=True)
class Interrupt:
    """A renewal's word to a holder that must stop: `kind` "cancel" or
    "deadline", and `remaining` seconds until its cleanup window closes (its
    lease is not extended past that)."""

    kind: str
    remaining: float


@dataclass(frozen=True)
class Admitted:
    execution_id: str
    status: str


@dataclass(frozen=True)
class Conflict:
    """The ID is held by another execution (or retired: status "retired",
    and the workflow unknown when only the fork found it)."""

    execution_id: str
    status: str
    workflow_id: str | None


@dataclass(frozen=True)
class StepRecord:
    step_key: str
    status: str
    value: Any
    error: dict[str, Any] | None
    function_name: str | None
    attempts: int
    token: int
    recorded_at: datetime
    # Where in the code's order of asks it was asked for (None: before
    # positions were recorded, or from a concurrent branch).
    position: int | None = None
    # Set on a fenced write's answer when the holder should stop at this step:
    # "cancel" (a cancel was requested) or "deadline" (the deadline passed).
    interrupt: str | None = None


@dataclass(frozen=True)
class Acknowledged:
    status: str
    outcome: dict[str, Any] | None


@dataclass(frozen=True)
class ReapResult:
    expired: int
    execution_ids: list[str]


WakeAnswer = Literal["requested", "ignored", "not_found"]

TERMINAL_SQL = "(" + ", ".join(f"'{s}'" for s in TERMINAL_STATUSES) + ")"

# ------------------------------------------------------------ the healed view
#
# Reads heal lazily: a record is reported as the reaper (app/reaper.py) will
# leave it, before the reaper has written it. The reaper does two things, and
# these expressions predict both with the statements' own rules:
#
# * an expired lease is ended (status back to suspended/admitted, counter +1,
#   covered wakes pending again, redelivery delay from the expiry), then
#   settled in the same transaction by app/store/policy.py's settled_end (the
#   one rule, written by `settle` and predicted here): a cancel request ends
#   it `cancelled`; a deadline at or before the later of now and the
#   redelivery time ends it `timed_out`; reaching the poison threshold parks
#   it (`poison`);
# * an unheld record (admitted, suspended, parked) that was cancelled or
#   passed its deadline and can run no cleanup is ended `cancelled` or
#   `timed_out` (policy.py's SWEPT_END, which the sweep writes).
#
# The rules and the outcomes are policy.py's own SQL. Each column below is one expression
# over the raw row (a select list cannot name its own results), generated
# from the few predicates here. `record_columns(threshold)` takes the poison
# threshold (the store's max_unacknowledged); $1 = redelivery base seconds,
# $2 = cap seconds, as before.

# The lease ran out and nobody has ended it yet.
_EXPIRED = "(status = 'running' AND lease_expires_at <= now())"
# When the next delivery may start once the reaper has ended the lease.
_HEALED_REDELIVER = (
    f"CASE WHEN {_EXPIRED} THEN lease_expires_at"
    " + fencepost_redelivery_delay(unacknowledged_deliveries + 1, $1, $2)"
    " ELSE redeliver_after END"
)


def _outcome_sql(fragment: str) -> str:
    """policy.py's outcome SQL names the row `e`; the healed columns read an
    unaliased `executions` row."""
    return re.sub(r"\be\.", "", fragment)


def _settled(threshold: int) -> str:
    """What the reaper writes: 'cancelled' | 'timed_out' | 'parked' (poison),
    'requeued' (lease ended, no rule applies), or NULL (nothing to do)."""
    # policy.py imports this module (through compose.py): import it late.
    from app.store.policy import SWEPT_END, settled_end

    # The reaped row: counter +1, redelivery counted from the expiry.
    reaped = settled_end(_HEALED_REDELIVER, "unacknowledged_deliveries + 1", str(int(threshold)))
    return f"""(CASE WHEN {_EXPIRED} THEN coalesce({_outcome_sql(reaped)}, 'requeued')
         ELSE {_outcome_sql(SWEPT_END)} END)"""


def healed_status_sql(threshold: int) -> str:
    """The status a read reports (see above), over an unaliased `executions` row."""
    settled = _settled(threshold)
    return f"""CASE {settled}
         WHEN 'requeued' THEN CASE WHEN ever_suspended THEN 'suspended' ELSE 'admitted' END
         WHEN 'cancelled' THEN 'cancelled' WHEN 'timed_out' THEN 'timed_out'
         WHEN 'parked' THEN 'parked'
         ELSE status END"""


@functools.cache
def record_columns(threshold: int) -> str:
    """The healed record's select list, for `SELECT ... FROM executions`."""
    # policy.py imports this module (through compose.py): import it late.
    from app.store.policy import CANCELLED_OUTCOME, TIMED_OUT_OUTCOME

    settled = _settled(threshold)
    cancelled = _outcome_sql(CANCELLED_OUTCOME)
    timed_out = _outcome_sql(TIMED_OUT_OUTCOME)
    return f"""
    execution_id, workflow_id, params, context, code_version,
    admitted_at, updated_at, token, deadline, cancel_requested_at,
    ever_suspended, waiting_on, cancel_requested_by, admitted_by,
    parent_execution_id, integrity_conflicts, redrives, forked_from, forked_from_step,
    queue, concurrency_key, priority,
    {_EXPIRED} AS lease_expired,
    {healed_status_sql(threshold)} AS status,
    CASE {settled} WHEN 'cancelled' THEN {cancelled} WHEN 'timed_out' THEN {timed_out}
         ELSE outcome END AS outcome,
    CASE {settled} WHEN 'parked' THEN 'poison' WHEN 'cancelled' THEN NULL
         WHEN 'timed_out' THEN NULL ELSE parked_reason END AS parked_reason,
    CASE {settled} WHEN 'parked' THEN NULL WHEN 'cancelled' THEN NULL
         WHEN 'timed_out' THEN NULL ELSE parked_step END AS parked_step,
    CASE WHEN {settled} IS NULL THEN parked_detail END AS parked_detail,
    unacknowledged_deliveries + {_EXPIRED}::int AS unacknowledged_deliveries,
    CASE {settled} WHEN 'cancelled' THEN NULL WHEN 'timed_out' THEN NULL
         ELSE CASE WHEN {_EXPIRED} THEN least(due_at, covered_due_at) ELSE due_at END
         END AS due_at,
    CASE WHEN {_EXPIRED} THEN lease_expires_at ELSE last_unacknowledged_at END
        AS last_unacknowledged_at,
    CASE coalesce({settled}, 'requeued') WHEN 'requeued' THEN {_HEALED_REDELIVER} END
        AS redeliver_after,
    CASE WHEN status = 'running' AND lease_expires_at > now() THEN lease_owner END AS lease_owner,
    CASE WHEN status = 'running' AND lease_expires_at > now() THEN lease_expires_at END
        AS lease_expires_at,
    now() AS read_at
"""


def encode_cursor(admitted_at: datetime, execution_id: str) -> str:
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


def step_record(row: asyncpg.Record, interrupt: str | None = None) -> StepRecord:
    return StepRecord(
        step_key=row["step_key"],
        status=row["status"],
        value=row["value"],
        error=row["error"],
        function_name=row["function_name"],
        attempts=row["attempts"],
        token=row["token"],
        recorded_at=row["recorded_at"],
        position=row["position"] if "position" in row else None,
        interrupt=interrupt,
    )
