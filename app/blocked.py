"""`blockedBy`: why an execution is not moving right now, computed from its
(healed) record. One answer per record, checked in this order:

| reason | meaning | what to do |
|---|---|---|
| (none) | terminal | nothing |
| `parked` | `outcome_unknown` (a step's effect is in doubt) or `poison` | resolve the step / fix the cause, then resume |
| `leased` | a worker holds a live lease (owner, until) | wait; a cancel request is seen at its next step |
| `lease-expired` | the holder stopped renewing; another worker takes over after the redelivery delay | check the holder |
| `redelivery-delay` | the last delivery ended unacknowledged; not claimable until T | look at the events and logs |
| `sleeping` | a durable timer, due at T | wait, or wake it now |
| `waiting-for-signal` | waits for signal NAME (until T, if it has a timeout) | send the signal |
| `waiting-for-child` | waits for child execution ID to end | look at the child |
| `no-worker` | due, but no live worker runs this workflow | start a worker with this workflow |
| `due` | due, waiting for a free worker | add workers or concurrency if it lasts |
"""

from __future__ import annotations

from datetime import datetime

from app.schema import TERMINAL_STATUSES


def blocked_by(row: dict, live_workflows: set[str] | None) -> dict | None:
    """`row` is a record from ExecutionStore.get/list (healed, with read_at =
    the database's now). `live_workflows`: workflows some live worker runs;
    None when unknown."""
    status = row["status"]
    now: datetime = row["read_at"]
    if status in TERMINAL_STATUSES:
        return None
    if status == "parked":
        return {"reason": "parked", "parkedReason": row["parked_reason"], "step": row["parked_step"]}
    if status == "running":
        answer = {"reason": "leased", "owner": row["lease_owner"], "until": row["lease_expires_at"]}
        if row["cancel_requested_at"] is not None:
            answer["cancelRequested"] = True
        return answer
    redeliver_after = row["redeliver_after"]
    if row["lease_expired"]:
        return {"reason": "lease-expired", "since": row["last_unacknowledged_at"],
                "until": redeliver_after}
    if redeliver_after is not None and redeliver_after > now:
        return {"reason": "redelivery-delay", "until": redeliver_after}
    due_at = row["due_at"]
    waiting_on = row.get("waiting_on") or {}
    if due_at is None or due_at > now:
        if "child" in waiting_on:
            return {"reason": "waiting-for-child", "child": waiting_on["child"]}
        if "signal" in waiting_on:
            return {"reason": "waiting-for-signal", "signal": waiting_on["signal"], "until": due_at}
        return {"reason": "sleeping", "step": waiting_on.get("sleep"), "until": due_at}
    if live_workflows is not None and row["workflow_id"] not in live_workflows:
        return {"reason": "no-worker", "workflowId": row["workflow_id"], "since": due_at}
    return {"reason": "due", "since": due_at}
