"""What an operator (or a client) decides from outside: cancel or terminate
(with every unfinished descendant), resolve an outcome-unknown step, resume
an execution parked as poison or for nondeterminism, request a wake. Each
decision and who made it is written to the history in the same statement. (Redrive and fork: redrive.py;
bulk operations: bulk.py; signals: signals.py.)"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import asyncpg

from app.metrics import METRICS
from app.schema import TERMINAL_STATUSES
from app.store.handle import StoreObject
from app.store.on_shard import NEXT_EVENT_ID, OnShard
from app.store.placement import Placement, placement_of, shard_buckets, tell_claimers
from app.store.policy import ENDED_COLUMNS, WATCHED, after_ends
from app.store.records import TreeCancelled
from app.store.types import NOTIFY_CHANNEL, TERMINAL_SQL, InvalidEvent, WakeAnswer

CancelAnswer = Literal["cancelled", "requested", "terminal", "not_found"]
ResolveAnswer = Literal["resolved", "not_found", "step_not_found", "not_outcome_unknown"]
ResumeAnswer = Literal["resumed", "not_found", "not_parked"]


# Each decision below is one statement on the execution's shard (OnShard):
# the row's check (FOR UPDATE / the UPDATE's own row lock), the change and
# its event commit together or not at all. Their NOTIFY reaches no one on
# Citus (it runs on the node holding the row): the caller tells the
# claimers itself when the execution was made due (tell_claimers).

# An outcome-unknown step $2 settled by an operator ($3: retry, succeed or
# fail), the execution made due now.
_RESOLVE = OnShard("resolve_step", f"""
WITH target AS (
    SELECT e.execution_id, e.token, f.function_name
    FROM executions e JOIN effects f
      ON f.execution_id = e.execution_id AND f.bucket = e.bucket
     AND f.step_key = $2
    WHERE e.execution_id = $1 AND e.bucket = fencepost_bucket($1)
      AND e.status = 'parked'
      AND e.parked_reason = 'outcome_unknown' AND e.parked_step = $2
      AND f.status = 'outcome_unknown'
    FOR UPDATE OF e
), step AS (
    INSERT INTO execution_steps
        (execution_id, bucket, step_key, status, value, error, function_name, token)
    SELECT execution_id, fencepost_bucket(execution_id), $2,
           CASE WHEN $3 = 'succeed' THEN 'completed' ELSE 'failed' END,
           CASE WHEN $3 = 'succeed' THEN $4::jsonb END,
           CASE WHEN $3 = 'fail' THEN $5::jsonb END, function_name, token
    FROM target WHERE $3 IN ('succeed', 'fail')
), eff AS (
    UPDATE effects AS ef SET status = 'retry', updated_at = now()
    WHERE ef.execution_id = (SELECT execution_id FROM target)
      AND ef.bucket = fencepost_bucket($1) AND ef.step_key = $2
      AND $3 = 'retry'
), effdone AS (
    -- The recorded step is now the receipt; the attempt is settled.
    DELETE FROM effects AS ed
    WHERE ed.execution_id = (SELECT execution_id FROM target)
      AND ed.bucket = fencepost_bucket($1) AND ed.step_key = $2
      AND $3 IN ('succeed', 'fail')
), e AS (
    UPDATE executions x
    SET status = CASE WHEN x.ever_suspended THEN 'suspended' ELSE 'admitted' END,
        parked_reason = NULL, parked_step = NULL,
        due_at = now(), event_seq = x.event_seq + 1, updated_at = now()
    FROM target t
    WHERE x.execution_id = t.execution_id AND x.bucket = fencepost_bucket($1)
    RETURNING x.execution_id, x.token, x.status, x.event_seq
), ev AS (
    INSERT INTO execution_events (event_id, execution_id, bucket, seq, kind, token, detail)
    -- The decided value is part of the decision's record: an explicit
    -- null result stays a key with null, retry records neither.
    SELECT {NEXT_EVENT_ID}, execution_id, fencepost_bucket(execution_id), event_seq,
           'resolved', token,
           jsonb_build_object('stepKey', $2::text, 'action', $3::text, 'by', $6::text)
           || CASE $3 WHEN 'succeed' THEN jsonb_build_object('result', $4::jsonb)
                      WHEN 'fail' THEN jsonb_build_object('error', $5::jsonb)
                      ELSE '{{}}'::jsonb END
    FROM e
)
SELECT status, pg_notify('{NOTIFY_CHANNEL}', '') IS NULL AS notified FROM e
""", ("text", "text", "text", "jsonb", "jsonb", "text"),
    (("status", "text"), ("notified", "boolean")))

# An execution parked as poison or for nondeterminism made due again.
_RESUME = OnShard("resume", f"""
WITH p AS (
    SELECT execution_id, parked_reason FROM executions
    WHERE execution_id = $1 AND bucket = fencepost_bucket($1) AND status = 'parked'
      AND parked_reason IN ('poison', 'nondeterminism')
    FOR NO KEY UPDATE
), r AS (
    UPDATE executions e
    SET status = CASE WHEN e.ever_suspended THEN 'suspended' ELSE 'admitted' END,
        parked_reason = NULL, parked_step = NULL, parked_detail = NULL,
        redeliver_after = NULL, due_at = now(), event_seq = e.event_seq + 1,
        updated_at = now()
    FROM p WHERE e.execution_id = p.execution_id AND e.bucket = fencepost_bucket($1)
    RETURNING e.execution_id, e.token, e.status, e.unacknowledged_deliveries,
              p.parked_reason, e.event_seq
), ev AS (
    INSERT INTO execution_events (event_id, execution_id, bucket, seq, kind, token, detail)
    SELECT {NEXT_EVENT_ID}, execution_id, fencepost_bucket(execution_id), event_seq,
           'resumed', token,
           jsonb_build_object('by', $2::text,
                              'unacknowledgedDeliveries', unacknowledged_deliveries)
           -- A poison resume's detail is as it always was.
           || CASE WHEN parked_reason = 'nondeterminism'
                   THEN jsonb_build_object('reason', parked_reason)
                   ELSE '{{}}'::jsonb END
    FROM r
)
SELECT status, pg_notify('{NOTIFY_CHANNEL}', '') IS NULL AS notified FROM r
""", ("text", "text"), (("status", "text"), ("notified", "boolean")))

# A wake of $1 at $2 (now when null), for a caller owning it ($3: anyone when
# null); always one row.
_WAKE = OnShard("request_wake", f"""
WITH target AS (
    SELECT true AS found FROM executions
    WHERE execution_id = $1 AND bucket = fencepost_bucket($1)
      AND ($3::text IS NULL OR admitted_by = $3)
), w AS (
    UPDATE executions AS x
    SET due_at = least(x.due_at, coalesce($2::timestamptz, now())),
        event_seq = x.event_seq + 1, updated_at = now()
    WHERE x.execution_id = $1 AND x.bucket = fencepost_bucket($1)
      AND x.status NOT IN {TERMINAL_SQL}
      AND ($3::text IS NULL OR x.admitted_by = $3)
    RETURNING x.execution_id, x.due_at, x.event_seq
), ev AS (
    INSERT INTO execution_events (event_id, execution_id, bucket, seq, kind, detail)
    SELECT {NEXT_EVENT_ID}, execution_id, fencepost_bucket(execution_id), event_seq,
           'wake_requested',
           jsonb_build_object('at', coalesce($2::timestamptz, now()))
    FROM w
)
SELECT EXISTS (SELECT 1 FROM w) AS requested,
       EXISTS (SELECT 1 FROM target) AS found,
       (SELECT count(pg_notify('{NOTIFY_CHANNEL}', '')) FROM w
        WHERE due_at <= now()) > 0 AS notified
""", ("text", "timestamptz", "text"),
    (("requested", "boolean"), ("found", "boolean"), ("notified", "boolean")))


class Operator(StoreObject):
    async def request_cancel(self, execution_id: str, by: str) -> tuple[CancelAnswer, str | None]:
        """Request-first cancellation: the request is persisted (with an event)
        before anyone acts on it, and reaches every unfinished descendant
        (child workflows) in the same statement. Each execution then:
        - held by a worker: keeps running; its code meets `Cancelled` at its
          next step or wait and may clean up until its window closes;
        - unheld, has run before, with a cleanup window: is made due at once,
          and its next delivery raises `Cancelled` where the code waits;
        - never ran, parked, or without a window (`cancel_grace=0`): is
          cancelled at once.
        `cancelled` is recorded whatever the cleanup code returns.
        Returns (answer, status) for `execution_id`."""
        return await self._end_tree(execution_id, by, terminate=False)

    async def terminate(self, execution_id: str, by: str) -> tuple[CancelAnswer, str | None]:
        """Cancel with no code run: the execution and its unfinished
        descendants are cancelled at once, held or not. A holder's later
        writes are refused (its lease ended), so no cleanup step is recorded.
        For when the cleanup itself is what is stuck."""
        return await self._end_tree(execution_id, by, terminate=True)

    async def _end_tree(self, execution_id: str, by: str, *,
                        terminate: bool) -> tuple[CancelAnswer, str | None]:
        # Cancel locks top-down, a child's end bottom-up: a deadlock between
        # them is rare and the whole request is safe to repeat (it is
        # idempotent), so the transaction is retried as a whole.
        placement = await placement_of(self.db, self.config.placement)
        row = await self.db.run_in_transaction(
            lambda conn: cancel_tree(conn, placement, execution_id, by, terminate))
        if row is not None:
            METRICS.ended(["cancelled"] * row["cancelled_now"])
            return ("cancelled" if row["status"] == "cancelled" else "requested"), row["status"]
        status = await self.db.fetchval(
            "SELECT status FROM executions "
            "WHERE execution_id = $1 AND bucket = fencepost_bucket($1)", execution_id
        )
        return ("not_found", None) if status is None else ("terminal", status)

    async def resolve_step(
        self,
        execution_id: str,
        step_key: str,
        action: Literal["retry", "succeed", "fail"],
        *,
        by: str,
        result: Any = None,
        error: dict[str, Any] | None = None,
    ) -> tuple[ResolveAnswer, str | None]:
        """Settle an outcome-unknown step and make the execution due now.
        succeed/fail record the step (as the operator says it ended); retry
        lets the next delivery call out once more with the same request
        identity. Returns (answer, current status)."""
        try:
            buckets = await shard_buckets(self, execution_id)
            rows = await _RESOLVE.fetch(self.db, buckets, execution_id, step_key, action,
                                        result, error, by)
            row = rows[0] if rows else None
            if row is not None:
                await tell_claimers(self.db, buckets)
        except (ValueError, TypeError, asyncpg.DataError) as exc:
            raise InvalidEvent(str(exc)) from exc
        if row is not None:
            return "resolved", row["status"]
        return await self._why_not_resolved(execution_id, step_key)

    async def _why_not_resolved(self, execution_id: str, step_key: str
                                ) -> tuple[ResolveAnswer, str | None]:
        """Why a resolution changed nothing: no such execution, a step key the
        execution never recorded nor called out for (404), or a step that is
        not waiting for a decision (409). Read-only; the decision already
        failed atomically, so this only chooses the answer."""
        row = await self.db.fetchrow(
            """
            SELECT e.status,
                   -- The execution's bucket as a constant (not e.bucket): Citus routes on it.
                   EXISTS (SELECT 1 FROM execution_steps s
                           WHERE s.execution_id = e.execution_id
                             AND s.bucket = fencepost_bucket($1) AND s.step_key = $2)
                   OR EXISTS (SELECT 1 FROM effects f
                              WHERE f.execution_id = e.execution_id
                                AND f.bucket = fencepost_bucket($1) AND f.step_key = $2)
                   OR e.parked_step = $2 AS known
            FROM executions e WHERE e.execution_id = $1 AND e.bucket = fencepost_bucket($1)
            """,
            execution_id, step_key,
        )
        if row is None:
            return "not_found", None
        if not row["known"]:
            return "step_not_found", row["status"]
        return "not_outcome_unknown", row["status"]

    async def resume(self, execution_id: str, by: str) -> tuple[ResumeAnswer, str | None]:
        """Make an execution parked as poison, or for nondeterminism (the
        operator says the code now deployed fits its history), due again.
        A poison one keeps its counter, so one more unacknowledged delivery
        parks it again; a nondeterminism one parks again if its code still
        does not fit."""
        buckets = await shard_buckets(self, execution_id)
        rows = await _RESUME.fetch(self.db, buckets, execution_id, by)
        if rows:
            await tell_claimers(self.db, buckets)
            return "resumed", rows[0]["status"]
        status = await self.db.fetchval(
            "SELECT status FROM executions "
            "WHERE execution_id = $1 AND bucket = fencepost_bucket($1)", execution_id
        )
        return ("not_found", None) if status is None else ("not_parked", status)

    async def request_wake(self, execution_id: str, at: datetime | None = None,
                           owner: str | None = None) -> WakeAnswer:
        """Unfenced: an extra wake costs at most one extra delivery. Pending
        wakes merge to the earliest; during a delivery they stay apart from the
        wakes the claim covers (due_at vs covered_due_at). With `owner` (a
        trigger-only token's ID) the owner predicate is in this one statement:
        a foreign execution is `not_found` and nothing is written, whatever
        was admitted while the request was on its way."""
        buckets = await shard_buckets(self, execution_id)
        [row] = await _WAKE.fetch(self.db, buckets, execution_id, at, owner)
        if row["notified"]:
            await tell_claimers(self.db, buckets)
        if row["requested"]:
            return "requested"
        return "ignored" if row["found"] else "not_found"



# Who keeps running after a cancel request ($3: terminate, nobody), over a
# row aliased `e`: a holder, until its window closes; an unheld execution
# that has run before (token > 0) and whose cleanup window is open, made due
# now. Everyone else is cancelled at once.
_HELD = "(NOT $3 AND e.status = 'running' AND e.lease_expires_at > now())"
_CLEANS = ("(NOT $3 AND e.status IN ('admitted', 'suspended') AND e.token > 0"
           " AND fencepost_cleanup_ends(coalesce(e.cancel_requested_at, now()),"
           " e.deadline, e.cleanup_seconds) > now())")
_STAYS = f"({_HELD} OR {_CLEANS})"

# The request reaches executions $1 (those of one shard, of the tree of $4),
# each on the row this UPDATE locks and only while it has not ended, with its
# events. The wake of parents on other shards and the notices follow in the
# caller's transaction (policy.after_ends).
_CANCEL = OnShard("cancel", f"""
WITH c AS (
    UPDATE executions e
    SET cancel_requested_at = coalesce(e.cancel_requested_at, now()),
        cancel_requested_by = coalesce(e.cancel_requested_by, $2),
        status = CASE WHEN {_STAYS} THEN e.status ELSE 'cancelled' END,
        outcome = CASE WHEN {_STAYS} THEN NULL
                       ELSE jsonb_build_object('error', jsonb_build_object(
                           'name', 'Cancelled',
                           'message', CASE WHEN $3 THEN 'terminated' ELSE 'cancelled'
                                      END || ' at the request of '
                                      || coalesce(e.cancel_requested_by, $2),
                           'requestedAt', coalesce(e.cancel_requested_at, now())))
                  END,
        lease_owner = CASE WHEN {_HELD} THEN e.lease_owner END,
        lease_expires_at = CASE WHEN {_HELD} THEN e.lease_expires_at END,
        -- The cleanup delivery is due now, past any redelivery delay.
        due_at = CASE WHEN {_HELD} THEN e.due_at WHEN {_CLEANS} THEN now() END,
        covered_due_at = CASE WHEN {_HELD} THEN e.covered_due_at END,
        parked_reason = NULL, parked_step = NULL, redeliver_after = NULL,
        -- The places of the (at most two) events below.
        event_seq = e.event_seq + 2,
        updated_at = now()
    WHERE e.execution_id = ANY($1::text[]) AND e.bucket = fencepost_bucket(e.execution_id)
      AND e.status NOT IN {TERMINAL_SQL}
    RETURNING e.execution_id, e.token, e.status, e.parent_execution_id, e.due_at, e.event_seq
), ev AS (
    INSERT INTO execution_events (event_id, execution_id, bucket, seq, kind, token, detail)
    SELECT {NEXT_EVENT_ID}, execution_id, fencepost_bucket(execution_id), seq, kind, token,
           detail
    FROM (
        SELECT execution_id, event_seq - 1 AS seq, 'cancel_requested' AS kind, token,
               jsonb_strip_nulls(jsonb_build_object(
                   'by', $2::text,
                   'terminate', CASE WHEN $3 THEN true END,
                   'parentExecutionId', CASE WHEN execution_id <> $4
                                             THEN parent_execution_id END)) AS detail
        FROM c
        UNION ALL
        SELECT execution_id, event_seq, 'cancelled', token, jsonb_build_object('by', $2::text)
        FROM c WHERE status = 'cancelled'
    ) AS written
)
SELECT execution_id, status, parent_execution_id, {WATCHED.format(ended="c")},
       coalesce(due_at <= now(), false) AS due
FROM c
""", ("text[]", "text", "boolean", "text"), ENDED_COLUMNS + (("due", "boolean"),))

# The unfinished children of executions $1 (read on every shard on Citus).
_CHILDREN = f"""
SELECT execution_id FROM executions
WHERE parent_execution_id = ANY($1::text[]) AND status NOT IN {TERMINAL_SQL}
"""


async def cancel_tree(conn: asyncpg.Connection, placement: Placement, execution_id: str,
                      by: str, terminate: bool) -> TreeCancelled | None:
    """Cancel (or, `terminate`, end at once) `execution_id` and every
    unfinished descendant, in the caller's transaction; the root's status
    after the request and how many were cancelled at once, or None when it
    is missing or already ended."""
    # Lock the root first, then find the descendants, a generation per
    # statement, each in a new snapshot: a child whose start is waiting on
    # this row either committed before (and is found) or sees the request
    # and withdraws (start_child checks the parent after inserting).
    root = await conn.fetchval(
        "SELECT status FROM executions WHERE execution_id = $1 AND bucket = fencepost_bucket($1) "
        "FOR UPDATE", execution_id)
    if root is None or root in TERMINAL_STATUSES:
        return None
    tree, generation = [execution_id], [execution_id]
    while generation:
        generation = [r["execution_id"] for r in await conn.fetch(_CHILDREN, generation)]
        tree += generation

    async def cancel(part: list[str], buckets: list[int] | None) -> list[asyncpg.Record | None]:
        got = {r["execution_id"]: r
               for r in await _CANCEL.fetch(conn, buckets, part, by, terminate, execution_id)}
        return [got.get(e) for e in part]

    rows = [r for r in await placement.per_shard(tree, lambda e: e, cancel) if r is not None]
    await after_ends(conn, placement, rows, due=any(r["due"] for r in rows))
    [status] = [r["status"] for r in rows if r["execution_id"] == execution_id]
    return {"status": status,
            "cancelled_now": sum(1 for r in rows if r["status"] == "cancelled")}
