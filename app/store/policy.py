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

from collections.abc import Sequence

import asyncpg

from app.schema import TERMINAL_STATUSES
from app.store.compose import WAKE_PARENT, WAKEABLE_PARENT
from app.store.handle import Handle
from app.store.on_shard import NEXT_EVENT_ID, OnShard, send_notices
from app.store.placement import SINGLE_NODE, Placement
from app.store.retry import Connection
from app.store.types import ENDED_CHANNEL, NOTIFY_CHANNEL

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

# What the statements that end unheld executions answer (settle, sweep): per
# ended row its new status, its parent and whether a long-poll waits for it
# (watched_executions), for after_ends.
ENDED_COLUMNS = (("execution_id", "text"), ("status", "text"),
                  ("parent_execution_id", "text"), ("watched", "boolean"))
# Whether a long-poll waits for a row of {ended} (watched_executions).
WATCHED = """EXISTS (SELECT 1 FROM watched_executions w
                    WHERE w.execution_id = {ended}.execution_id
                      AND w.bucket = fencepost_bucket({ended}.execution_id)) AS watched"""
_WATCHED = WATCHED.format(ended="s")

_SETTLE = OnShard("settle", f"""
WITH target AS (
    -- On Citus: the leases of one shard (settle splits them by shard).
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
        event_seq = e.event_seq + 1,
        updated_at = now()
    FROM target t
    WHERE e.execution_id = t.execution_id AND e.bucket = t.bucket
    RETURNING e.execution_id, e.status, e.token, e.unacknowledged_deliveries, e.parent_execution_id,
              e.event_seq
), ev AS (
    INSERT INTO execution_events (event_id, execution_id, bucket, seq, kind, token, detail)
    SELECT {NEXT_EVENT_ID}, execution_id, fencepost_bucket(execution_id), event_seq, status,
           token,
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
SELECT execution_id, status, parent_execution_id, {_WATCHED}
FROM s
""", ("text[]", "integer"), ENDED_COLUMNS)

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

_SWEEP = OnShard("sweep", f"""
WITH target AS (
    -- On Citus: the rows of one shard (sweep_interrupted visits each).
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
        event_seq = e.event_seq + 1, updated_at = now()
    FROM target t
    WHERE e.execution_id = t.execution_id AND e.bucket = t.bucket
    RETURNING e.execution_id, e.token, e.status, e.parent_execution_id, e.event_seq
), ev AS (
    INSERT INTO execution_events (event_id, execution_id, bucket, seq, kind, token)
    SELECT {NEXT_EVENT_ID}, execution_id, fencepost_bucket(execution_id), event_seq, status,
           token
    FROM s
)
SELECT execution_id, status, parent_execution_id, {_WATCHED}
FROM s
""", ("bigint",), ENDED_COLUMNS)


# Parents whose children ended ($1): due now, unless ended themselves. Run
# in the transaction of the statement that ended the children, right after
# it, so a parent waiting for a child cannot miss the end; a statement of its
# own, not a CTE of that one, because on Citus a parent's row may be on
# another shard than its child's.
_WAKE_PARENTS = OnShard("wake_parents", f"""
UPDATE executions p SET {WAKE_PARENT}
WHERE p.execution_id = ANY($1::text[]) AND p.bucket = fencepost_bucket(p.execution_id)
  AND {WAKEABLE_PARENT}
RETURNING p.execution_id
""", ("text[]",), (("execution_id", "text"),))


async def after_ends(db: Handle | Connection, placement: Placement,
                     ended: Sequence[asyncpg.Record], *, due: bool = False) -> None:
    """What follows the rows `ended` (execution_id, status, parent_execution_id,
    watched), in the caller's transaction: the parents of those that reached
    a terminal status are woken (on Citus, one statement per shard they are
    in), and idle workers and long-polls are told at commit (idle workers
    also when `due`: one of the rows itself is due now), on the caller's
    connection (on_shard.send_notices)."""
    terminal = [r for r in ended if r["status"] in TERMINAL_STATUSES]
    parents = sorted({r["parent_execution_id"] for r in terminal
                      if r["parent_execution_id"] is not None})

    async def wake(part: list[str], buckets: list[int] | None) -> list[bool]:
        got = {r["execution_id"] for r in await _WAKE_PARENTS.fetch(db, buckets, part)}
        return [parent in got for parent in part]

    woken: list[bool] = await placement.per_shard(parents, lambda p: p, wake) if parents else []
    notices = [(ENDED_CHANNEL, r["execution_id"]) for r in terminal if r["watched"]]
    if due or any(woken):
        notices.append((NOTIFY_CHANNEL, ""))  # a woken parent is due now
    await send_notices(db, notices)


async def settle(db: Handle | Connection, execution_ids: list[str], threshold: int,
                 placement: Placement = SINGLE_NODE) -> dict[str, str]:
    """Apply cancel / deadline / poison (`threshold` unacknowledged deliveries
    in a row) to just-ended leases, in the caller's transaction, then what
    follows their ends (after_ends). Returns {execution_id: new status} for those
    that changed."""
    if not execution_ids:
        return {}

    async def settle_part(part: list[str], buckets: list[int] | None
                          ) -> list[asyncpg.Record | None]:
        got = {r["execution_id"]: r for r in await _SETTLE.fetch(db, buckets, part, threshold)}
        return [got.get(execution_id) for execution_id in part]

    rows = [r for r in await placement.per_shard(execution_ids, lambda e: e, settle_part)
            if r is not None]
    await after_ends(db, placement, rows)
    return {r["execution_id"]: r["status"] for r in rows}


async def sweep(db: Connection, limit: int, placement: Placement,
                buckets: list[int] | None) -> list[asyncpg.Record]:
    """End at most `limit` unheld executions a cancel or the deadline left
    with no cleanup to run (SWEPT), of every bucket (`buckets` None) or of
    one shard's (Citus: `buckets`, all of one shard), then what follows
    their ends (after_ends), in the caller's transaction."""
    rows = await _SWEEP.fetch(db, buckets, limit)
    await after_ends(db, placement, rows)
    return rows
