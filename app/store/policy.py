"""What happens to an execution that nobody holds when a rule says it may not
run again: cancellation requested, deadline passed (or a redelivery that
would end after it), or too many unacknowledged deliveries in a row (poison).

`settle` runs inside the transaction that ended a lease without an
acknowledgement (release, reaper), so the record never shows a state in
which it could be claimed once more: a delivery that ran after a cancel or
the deadline (its cleanup) gets no second one. `sweep_interrupted` ends
unheld executions that were cancelled or passed their deadline and can run
no cleanup: never ran, parked, or their cleanup window closed unclaimed.
"""

from __future__ import annotations

from app.store.compose import ENDED_NOTICE, WAKE_PARENTS
from app.store.handle import Handle
from app.store.retry import Connection
from app.store.types import NOTIFY_CHANNEL

# Outcomes of the terminal ends no workflow code chose.
CANCELLED_OUTCOME = """jsonb_build_object('error', jsonb_build_object(
    'name', 'Cancelled',
    'message', 'cancelled at the request of ' || coalesce(e.cancel_requested_by, 'an operator'),
    'requestedAt', e.cancel_requested_at))"""
TIMED_OUT_OUTCOME = """jsonb_build_object('error', jsonb_build_object(
    'name', 'DeadlineExceeded',
    'message', 'the execution''s deadline passed before it finished',
    'deadline', e.deadline))"""


def settled_end(redeliver_after: str, unacknowledged: str, threshold: str) -> str:
    """THE rule for a lease that ended without an acknowledgement, over a row
    aliased `e` (`redeliver_after`, `unacknowledged`: its values once the
    lease has ended; `threshold`: the poison threshold): 'cancelled' when a
    cancel was requested; 'timed_out' when the deadline has passed or would
    pass before the redelivery may begin; 'parked' when the unacknowledged
    deliveries reached the threshold; NULL: claimable again. `settle` writes
    it; a read predicts it for a lease that expired (types.record_columns)."""
    # coalesce: no deadline is never past it (and NOT NULL would be NULL).
    past_deadline = (f"coalesce(e.deadline <= greatest(now(), coalesce({redeliver_after}, now())),"
                     " false)")
    return f"""(CASE WHEN e.cancel_requested_at IS NOT NULL THEN 'cancelled'
                WHEN {past_deadline} THEN 'timed_out'
                WHEN {unacknowledged} >= {threshold} THEN 'parked' END)"""


_END = settled_end("e.redeliver_after", "e.unacknowledged_deliveries", "$2")

_SETTLE = f"""
WITH target AS (
    -- Citus: the leases a reaper's round ended are in many buckets (a release's: one).
    SELECT execution_id, bucket FROM executions e
    WHERE e.execution_id = ANY($1::text[]) AND e.status IN ('admitted', 'suspended')
      AND {_END} IS NOT NULL
    FOR UPDATE
), s AS (
    UPDATE executions e
    SET status = {_END},
        outcome = CASE {_END} WHEN 'cancelled' THEN {CANCELLED_OUTCOME}
                              WHEN 'timed_out' THEN {TIMED_OUT_OUTCOME} END,
        parked_reason = CASE WHEN {_END} = 'parked' THEN 'poison' END,
        parked_step = NULL, parked_detail = NULL,
        -- A parked execution keeps its pending wakes for when it is resumed;
        -- a terminal one has none.
        due_at = CASE WHEN {_END} = 'parked' THEN e.due_at END,
        redeliver_after = NULL,
        updated_at = now()
    FROM target t
    WHERE e.execution_id = t.execution_id AND e.bucket = t.bucket
    RETURNING e.execution_id, e.status, e.token, e.unacknowledged_deliveries, e.parent_execution_id
), {WAKE_PARENTS.format(ended="s")}, ev AS (
    INSERT INTO execution_events (execution_id, bucket, kind, token, detail)
    SELECT execution_id, fencepost_bucket(execution_id), status, token,
           CASE WHEN status = 'parked'
                -- The last reasons the history holds (Retry reasons, failed
                -- attempts), newest first: what the operator reads first.
                THEN jsonb_build_object('reason', 'poison',
                                        'unacknowledgedDeliveries', unacknowledged_deliveries,
                                        'lastReasons', coalesce((
                    SELECT jsonb_agg(jsonb_build_object(
                               'stepKey', h.step_key, 'name', h.error->>'name',
                               'message', h.error->>'message', 'at', h.at)
                           ORDER BY h.attempt_id DESC)
                    FROM (SELECT * FROM attempt_history a
                          WHERE a.execution_id = s.execution_id
                            AND a.bucket = fencepost_bucket(s.execution_id)
                          ORDER BY a.attempt_id DESC LIMIT 5) h), '[]'::jsonb))
           END
    FROM s
)
-- A woken parent is due now: tell idle workers at commit.
SELECT execution_id, status,
       (SELECT count(pg_notify('{NOTIFY_CHANNEL}', '')) FROM parent_wake) AS woke,
       {ENDED_NOTICE.format(ended="s")}
FROM s
"""

# Unheld, interrupted (cancel requested or deadline passed), and no cleanup
# delivery may run any more: it never ran (nothing to clean up), it is parked,
# or its cleanup window closed. Over a row aliased `e`.
SWEPT = """(e.status IN ('admitted', 'suspended', 'parked')
    AND (e.cancel_requested_at IS NOT NULL OR e.deadline <= now())
    AND (e.token = 0 OR e.status = 'parked'
         OR fencepost_cleanup_ends(e.cancel_requested_at, e.deadline, e.cleanup_seconds)
            <= now()))"""
# What the sweep writes over a row aliased `e`: 'cancelled' | 'timed_out', or
# NULL when the row is not SWEPT. A read predicts it (types.record_columns).
SWEPT_END = f"""(CASE WHEN coalesce({SWEPT}, false) THEN
    CASE WHEN e.cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE 'timed_out' END END)"""

SWEEP = f"""
WITH target AS (
    -- Citus: a sweep looks through every bucket.
    SELECT execution_id, bucket FROM executions e
    WHERE {SWEPT}
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), s AS (
    UPDATE executions e
    SET status = {SWEPT_END},
        outcome = CASE WHEN e.cancel_requested_at IS NOT NULL THEN {CANCELLED_OUTCOME}
                       ELSE {TIMED_OUT_OUTCOME} END,
        due_at = NULL, redeliver_after = NULL, parked_reason = NULL, parked_step = NULL,
        updated_at = now()
    FROM target t
    WHERE e.execution_id = t.execution_id AND e.bucket = t.bucket
    RETURNING e.execution_id, e.token, e.status, e.parent_execution_id
), {WAKE_PARENTS.format(ended="s")}, ev AS (
    INSERT INTO execution_events (execution_id, bucket, kind, token)
    SELECT execution_id, fencepost_bucket(execution_id), status, token FROM s
)
SELECT execution_id, status,
       (SELECT count(pg_notify('{NOTIFY_CHANNEL}', '')) FROM parent_wake) AS woke,
       {ENDED_NOTICE.format(ended="s")}
FROM s
"""


async def settle(db: Handle | Connection, execution_ids: list[str], threshold: int) -> dict[str, str]:
    """Apply cancel / deadline / poison (`threshold` unacknowledged deliveries
    in a row) to just-ended leases, in the caller's transaction. Returns
    {execution_id: new status} for those that changed."""
    if not execution_ids:
        return {}
    rows = await db.fetch(_SETTLE, execution_ids, threshold)
    return {r["execution_id"]: r["status"] for r in rows}
