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

import asyncpg

from app.metrics import METRICS
from app.store.compose import ENDED_NOTICE, WAKE_PARENTS
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

# A redelivery that would begin after the deadline is not scheduled.
# (coalesce: no deadline is never past it, and NOT NULL would be NULL.)
_PAST_DEADLINE = "coalesce(e.deadline <= greatest(now(), coalesce(e.redeliver_after, now())), false)"

_SETTLE = f"""
WITH target AS (
    SELECT execution_id FROM executions e
    WHERE e.execution_id = ANY($1::text[]) AND e.status IN ('admitted', 'suspended')
      AND (e.cancel_requested_at IS NOT NULL OR {_PAST_DEADLINE}
           OR e.unacknowledged_deliveries >= $2)
    FOR UPDATE
), s AS (
    UPDATE executions e
    SET status = CASE WHEN e.cancel_requested_at IS NOT NULL THEN 'cancelled'
                      WHEN {_PAST_DEADLINE} THEN 'timed_out'
                      ELSE 'parked' END,
        outcome = CASE WHEN e.cancel_requested_at IS NOT NULL THEN {CANCELLED_OUTCOME}
                       WHEN {_PAST_DEADLINE} THEN {TIMED_OUT_OUTCOME} END,
        parked_reason = CASE WHEN e.cancel_requested_at IS NULL AND NOT ({_PAST_DEADLINE})
                             THEN 'poison' END,
        parked_step = NULL,
        -- A parked execution keeps its pending wakes for when it is resumed;
        -- a terminal one has none.
        due_at = CASE WHEN e.cancel_requested_at IS NULL AND NOT ({_PAST_DEADLINE})
                      THEN e.due_at END,
        redeliver_after = NULL,
        updated_at = now()
    FROM target t
    WHERE e.execution_id = t.execution_id
    RETURNING e.execution_id, e.status, e.token, e.unacknowledged_deliveries, e.parent_execution_id
), {WAKE_PARENTS.format(ended="s")}, ev AS (
    INSERT INTO execution_events (execution_id, kind, token, detail)
    SELECT execution_id, status, token,
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

_SWEEP = f"""
WITH target AS (
    SELECT execution_id FROM executions e
    WHERE {SWEPT}
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), s AS (
    UPDATE executions e
    SET status = CASE WHEN e.cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE 'timed_out' END,
        outcome = CASE WHEN e.cancel_requested_at IS NOT NULL THEN {CANCELLED_OUTCOME}
                       ELSE {TIMED_OUT_OUTCOME} END,
        due_at = NULL, redeliver_after = NULL, parked_reason = NULL, parked_step = NULL,
        updated_at = now()
    FROM target t
    WHERE e.execution_id = t.execution_id
    RETURNING e.execution_id, e.token, e.status, e.parent_execution_id
), {WAKE_PARENTS.format(ended="s")}, ev AS (
    INSERT INTO execution_events (execution_id, kind, token)
    SELECT execution_id, status, token FROM s
)
SELECT execution_id, status,
       (SELECT count(pg_notify('{NOTIFY_CHANNEL}', '')) FROM parent_wake) AS woke,
       {ENDED_NOTICE.format(ended="s")}
FROM s
"""


class PolicyStatements:
    pool: asyncpg.Pool
    max_unacknowledged: int

    async def _settle(self, conn: asyncpg.Connection, execution_ids: list[str]) -> dict[str, str]:
        """Apply cancel / deadline / poison to just-ended leases, in the
        caller's transaction. Returns {execution_id: new status} for those
        that changed."""
        if not execution_ids:
            return {}
        rows = await conn.fetch(_SETTLE, execution_ids, self.max_unacknowledged)
        return {r["execution_id"]: r["status"] for r in rows}

    async def sweep_interrupted(self, limit: int = 500) -> list[str]:
        """End unheld executions that were cancelled or passed their deadline
        and can run no cleanup (SWEPT): `cancelled` or `timed_out`."""
        rows = await self.pool.fetch(_SWEEP, limit)
        METRICS.ended(r["status"] for r in rows)
        return [r["execution_id"] for r in rows]

    async def prune_terminal(self, older_than_seconds: float, limit: int) -> int:
        """Delete up to `limit` terminal executions last updated more than
        `older_than_seconds` ago, with everything that hangs off them
        (steps, signals and effects go by ON DELETE CASCADE), and leave a
        tombstone (ID, last token, workflow) for each in the same statement:
        the ID stays taken for good (admission refuses it) and its fencing
        token never restarts."""
        return await self.pool.fetchval(
            """
            WITH doomed AS (
                SELECT execution_id FROM executions
                WHERE status IN ('completed', 'failed', 'cancelled', 'timed_out')
                  AND updated_at < now() - make_interval(secs => $1)
                ORDER BY updated_at
                LIMIT $2
                FOR UPDATE SKIP LOCKED
            ), ev AS (
                DELETE FROM execution_events WHERE execution_id IN (SELECT execution_id FROM doomed)
            ), lo AS (
                DELETE FROM late_observations
                WHERE execution_id IN (SELECT execution_id FROM doomed)
            ), d AS (
                -- Re-checked on the locked row: only terminal records go.
                DELETE FROM executions
                WHERE execution_id IN (SELECT execution_id FROM doomed)
                  AND status IN ('completed', 'failed', 'cancelled', 'timed_out')
                RETURNING execution_id, token, workflow_id
            ), tomb AS (
                -- Every deleted row leaves its tombstone, or the delete does not commit.
                INSERT INTO retired_executions (execution_id, last_token, workflow_id)
                SELECT execution_id, token, workflow_id FROM d
                ON CONFLICT (execution_id) DO UPDATE
                SET last_token = greatest(retired_executions.last_token, EXCLUDED.last_token),
                    workflow_id = EXCLUDED.workflow_id, retired_at = now()
                RETURNING 1
            )
            SELECT count(*) FROM tomb
            """,
            float(older_than_seconds),
            limit,
        )
