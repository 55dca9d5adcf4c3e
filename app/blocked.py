"""`blockedBy`: why an execution is not moving right now, computed from its
healed record (app/store/types.py's record_columns: the record as the reaper
will leave it). One answer per record, the first rule of RULES that holds:

| reason | meaning | what to do |
|---|---|---|
| (none) | terminal | nothing |
| `parked` | `outcome_unknown` (a step's effect is in doubt) or `poison` | resolve the step / fix the cause, then resume |
| `leased` | a worker holds a live lease (owner, until) | wait; a cancel request is seen at its next step |
| `lease-expired` | the holder stopped renewing; another worker takes over after the redelivery delay | check the holder |
| `redelivery-delay` | the last delivery ended unacknowledged; not claimable until T | look at the events and logs |
| `waiting-for-child` | waits for child execution ID to end | look at the child |
| `waiting-for-signal` | waits for signal NAME (until T, if it has a timeout) | send the signal |
| `sleeping` | a durable timer, due at T | wait, or wake it now |
| `no-worker` | due, but no live worker runs this workflow | start a worker with this workflow |
| `due` | due, waiting for a free worker | add workers or concurrency if it lasts |

Once a cancel is pending, every answer also says `cancelRequested: true`.

The rules are written once, as data; the API and the dashboard's page ask
`blocked_by` (Python), the dashboard's listing filters with `reason_sql`
(SQL), and both are read off the same table. Each condition below knows how
to test a row and how to say the same in SQL; each SQL form is never NULL,
so `CASE WHEN` and Python's `if` take the same branch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from app.schema import TERMINAL_STATUSES

# A healed execution record, by column name.
Row = Mapping[str, Any]

# ------------------------------------------------------------------ conditions


class Condition:
    def holds(self, row: Row, live: set[str] | None) -> bool:
        raise NotImplementedError

    def sql(self, r: str, live: str) -> str:
        """Over the healed record aliased `r`; `live` is a text[] expression
        (NULL: unknown, as `live=None` in Python)."""
        raise NotImplementedError


def _literal(value: str) -> str:
    assert "'" not in value
    return f"'{value}'"


@dataclass(frozen=True)
class StatusIn(Condition):
    statuses: tuple[str, ...]

    def holds(self, row: Row, live: set[str] | None) -> bool:
        return row["status"] in self.statuses

    def sql(self, r: str, live: str) -> str:
        return f"({r}.status IN ({', '.join(map(_literal, self.statuses))}))"


@dataclass(frozen=True)
class Flag(Condition):
    column: str

    def holds(self, row: Row, live: set[str] | None) -> bool:
        return bool(row[self.column])

    def sql(self, r: str, live: str) -> str:
        return f"coalesce({r}.{self.column}, false)"


@dataclass(frozen=True)
class Later(Condition):
    """The time in `column` is set and still ahead of the read."""

    column: str

    def holds(self, row: Row, live: set[str] | None) -> bool:
        return row[self.column] is not None and row[self.column] > row["read_at"]

    def sql(self, r: str, live: str) -> str:
        return f"coalesce({r}.{self.column} > {r}.read_at, false)"


@dataclass(frozen=True)
class NotDue(Condition):
    """No wake pending, or the earliest lies ahead."""

    def holds(self, row: Row, live: set[str] | None) -> bool:
        return row["due_at"] is None or row["due_at"] > row["read_at"]

    def sql(self, r: str, live: str) -> str:
        return f"coalesce({r}.due_at > {r}.read_at, true)"


@dataclass(frozen=True)
class WaitsOn(Condition):
    """The last suspension waits on `key` (waiting_on: {"child": ...} etc)."""

    key: str

    def holds(self, row: Row, live: set[str] | None) -> bool:
        return self.key in (row.get("waiting_on") or {})

    def sql(self, r: str, live: str) -> str:
        return f"coalesce({r}.waiting_on ? {_literal(self.key)}, false)"


@dataclass(frozen=True)
class NoLiveWorker(Condition):
    """Known live workers, none of which runs the workflow."""

    def holds(self, row: Row, live: set[str] | None) -> bool:
        return live is not None and row["workflow_id"] not in live

    def sql(self, r: str, live: str) -> str:
        return f"coalesce(NOT ({r}.workflow_id = ANY({live})), false)"


@dataclass(frozen=True)
class All(Condition):
    parts: tuple[Condition, ...]

    def holds(self, row: Row, live: set[str] | None) -> bool:
        return all(p.holds(row, live) for p in self.parts)

    def sql(self, r: str, live: str) -> str:
        return "(" + " AND ".join(p.sql(r, live) for p in self.parts) + ")"


@dataclass(frozen=True)
class Always(Condition):
    def holds(self, row: Row, live: set[str] | None) -> bool:
        return True

    def sql(self, r: str, live: str) -> str:
        return "true"


# ------------------------------------------------------------------- the rules

NONE = "none"  # terminal: blockedBy is null

# In order: the first that holds is the answer.
RULES: tuple[tuple[str, Condition], ...] = (
    (NONE, StatusIn(tuple(TERMINAL_STATUSES))),
    ("parked", StatusIn(("parked",))),
    ("leased", StatusIn(("running",))),
    ("lease-expired", Flag("lease_expired")),
    ("redelivery-delay", Later("redeliver_after")),
    ("waiting-for-child", All((NotDue(), WaitsOn("child")))),
    ("waiting-for-signal", All((NotDue(), WaitsOn("signal")))),
    ("sleeping", NotDue()),
    ("no-worker", NoLiveWorker()),
    ("due", Always()),
)
REASONS: tuple[str, ...] = tuple(reason for reason, _ in RULES)


def reason_of(row: Row, live_workflows: set[str] | None) -> str:
    for reason, condition in RULES:
        if condition.holds(row, live_workflows):
            return reason
    raise AssertionError("the last rule always holds")


def reason_sql(r: str = "r", live: str = "NULL::text[]") -> str:
    """RULES as one SQL expression over the healed record aliased `r`."""
    whens = "\n".join(f"         WHEN {c.sql(r, live)} THEN {_literal(reason)}"
                      for reason, c in RULES)
    return f"CASE\n{whens}\n    END"


# ----------------------------------------------------------------- the answer


def blocked_by(row: Row, live_workflows: set[str] | None) -> dict[str, Any] | None:
    """`row` is a healed record (store.history.get/list, store.dashboard.ui_list, with read_at =
    the database's now). `live_workflows`: workflows some live worker runs;
    None when unknown."""
    reason = reason_of(row, live_workflows)
    if reason == NONE:
        return None
    answer: dict[str, Any] = {"reason": reason, **_DETAILS[reason](row)}
    if row["cancel_requested_at"] is not None:
        # Not yet ended: its cleanup is running or waits for a delivery.
        answer["cancelRequested"] = True
    return answer


_DETAILS: dict[str, Callable[[Row], dict[str, Any]]] = {
    "parked": lambda row: {"parkedReason": row["parked_reason"], "step": row["parked_step"]},
    "leased": lambda row: {"owner": row["lease_owner"], "until": row["lease_expires_at"]},
    "lease-expired": lambda row: {"since": row["last_unacknowledged_at"],
                                  "until": row["redeliver_after"]},
    "redelivery-delay": lambda row: {"until": row["redeliver_after"]},
    "waiting-for-child": lambda row: {"child": row["waiting_on"]["child"]},
    "waiting-for-signal": lambda row: {"signal": row["waiting_on"]["signal"],
                                       "until": row["due_at"]},
    "sleeping": lambda row: {"step": (row.get("waiting_on") or {}).get("sleep"),
                             "until": row["due_at"]},
    "no-worker": lambda row: {"workflowId": row["workflow_id"], "since": row["due_at"]},
    "due": lambda row: {"since": row["due_at"]},
}
assert set(_DETAILS) | {NONE} == set(REASONS)
