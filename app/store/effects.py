"""External calls whose outcome must never be guessed: the attempt is
persisted (with its request identity) before the call, so a delivery that
finds an attempt without a recorded result knows the outcome is in doubt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg

from app.metrics import METRICS
from app.store.buckets import bucket_of
from app.store.fencing import FENCE_CTE, rejected
from app.store.handle import StoreObject
from app.store.on_shard import NEXT_EVENT_ID, OnShard
from app.store.placement import placement_of, shard_buckets
from app.store.policy import (
    CANCELLED_OUTCOME,
    ENDED_COLUMNS,
    TIMED_OUT_OUTCOME,
    WATCHED,
    after_ends,
)
from app.store.types import Lease, LeaseLost

# The attempt of step $3 persisted before the call, fenced: the token is
# checked on the row this statement updates (no claim lands between
# the check and the insert), all on the execution's shard.
_BEGIN = OnShard("begin_effect", f"""
WITH {FENCE_CTE}, ins AS (
    INSERT INTO effects (execution_id, bucket, step_key, idempotency_key,
                         function_name, status, token)
    SELECT execution_id, fencepost_bucket(execution_id), $3, $4, $5, 'started', $2
    FROM fence
    ON CONFLICT (execution_id, step_key, bucket) DO NOTHING
    RETURNING idempotency_key, status, token, attempts
), ev AS (
    INSERT INTO execution_events (event_id, execution_id, bucket, seq, kind, token, detail)
    SELECT {NEXT_EVENT_ID}, $1, fencepost_bucket($1), (SELECT event_seq FROM fence),
           'effect_started', $2,
           jsonb_build_object('stepKey', $3::text, 'idempotencyKey', $4::text)
    FROM ins
)
SELECT (SELECT count(*) FROM fence) AS fenced,
       (SELECT interrupt FROM fence) AS interrupt, ins.*
FROM (SELECT 1) AS one LEFT JOIN ins ON true
""", ("text", "bigint", "text", "text", "text"),
    (("fenced", "bigint"), ("interrupt", "text"), ("idempotency_key", "text"),
     ("status", "text"), ("token", "bigint"), ("attempts", "integer")))

# One more attempt of step $3, fenced as above.
_RETRY = OnShard("retry_effect", f"""
WITH {FENCE_CTE}, upd AS (
    UPDATE effects AS f SET status = 'started', token = $2, attempts = f.attempts + 1,
                            updated_at = now()
    WHERE f.execution_id = (SELECT execution_id FROM fence)
      AND f.bucket = fencepost_bucket($1) AND f.step_key = $3
    RETURNING f.attempts
), ev AS (
    INSERT INTO execution_events (event_id, execution_id, bucket, seq, kind, token, detail)
    SELECT {NEXT_EVENT_ID}, $1, fencepost_bucket($1), (SELECT event_seq FROM fence),
           'effect_attempted', $2,
           jsonb_build_object('stepKey', $3::text, 'attempt', attempts)
    FROM upd
)
SELECT (SELECT count(*) FROM fence) AS fenced
""", ("text", "bigint", "text"), (("fenced", "bigint"),))

# The delivery ended by parking the execution for $4 (step $3, detail $5),
# fenced like an acknowledgement: the token and status are checked on the
# row this UPDATE locks. A pending cancel or a passed deadline ends it
# instead. No row: the fence refused it. The parent's wake and the notices
# follow in the caller's transaction (policy.after_ends).
_PARK = OnShard("park", f"""
WITH p AS (
    UPDATE executions e
    SET status = CASE WHEN e.cancel_requested_at IS NOT NULL THEN 'cancelled'
                      WHEN e.deadline <= now() THEN 'timed_out'
                      ELSE 'parked' END,
        outcome = CASE WHEN e.cancel_requested_at IS NOT NULL THEN {CANCELLED_OUTCOME}
                       WHEN e.deadline <= now() THEN {TIMED_OUT_OUTCOME} END,
        parked_reason = CASE WHEN e.cancel_requested_at IS NULL
                              AND NOT coalesce(e.deadline <= now(), false)
                             THEN $4 END,
        parked_step = CASE WHEN e.cancel_requested_at IS NULL
                            AND NOT coalesce(e.deadline <= now(), false)
                           THEN $3 END,
        parked_detail = CASE WHEN e.cancel_requested_at IS NULL
                              AND NOT coalesce(e.deadline <= now(), false)
                             THEN $5::jsonb END,
        due_at = CASE WHEN e.cancel_requested_at IS NULL
                       AND NOT coalesce(e.deadline <= now(), false)
                      THEN least(e.due_at, e.covered_due_at) END,
        covered_due_at = NULL,
        lease_owner = NULL, lease_expires_at = NULL,
        unacknowledged_deliveries = 0, last_unacknowledged_at = NULL,
        redeliver_after = NULL, event_seq = e.event_seq + 1, updated_at = now()
    WHERE e.execution_id = $1 AND e.bucket = fencepost_bucket($1)
      AND e.token = $2 AND e.status = 'running'
    RETURNING e.execution_id, e.token, e.status, e.parent_execution_id, e.event_seq
), eff AS (
    UPDATE effects AS f SET status = 'outcome_unknown', updated_at = now()
    WHERE f.execution_id = (SELECT execution_id FROM p)
      AND f.bucket = fencepost_bucket($1) AND f.step_key = $3
      AND $4 = 'outcome_unknown'
), ev AS (
    INSERT INTO execution_events (event_id, execution_id, bucket, seq, kind, token, detail)
    SELECT {NEXT_EVENT_ID}, execution_id, fencepost_bucket(execution_id), event_seq, status,
           token,
           CASE WHEN status = 'parked'
                THEN jsonb_build_object('reason', $4::text, 'stepKey', $3::text)
                     || CASE WHEN $5::jsonb IS NOT NULL
                             THEN jsonb_build_object('divergence', $5::jsonb)
                             ELSE '{{}}'::jsonb END END
    FROM p
)
SELECT execution_id, status, parent_execution_id, {WATCHED.format(ended="p")}
FROM p
""", ("text", "bigint", "text", "text", "jsonb"), ENDED_COLUMNS)


@dataclass(frozen=True)
class EffectAttempt:
    step_key: str
    idempotency_key: str
    status: str  # started | outcome_unknown | retry
    token: int  # the token of the holder that made the latest attempt
    attempts: int
    fresh: bool  # True: persisted by this call, nobody has called out yet
    interrupt: str | None = None


class Effects(StoreObject):
    async def begin_effect(
        self, lease: Lease, step_key: str, *, idempotency_key: str, function_name: str
    ) -> EffectAttempt:
        """Persist the attempt before the call (fenced: a stale holder cannot
        start one), or return the attempt an earlier delivery left behind."""
        [row] = await _BEGIN.fetch(self.db, await shard_buckets(self, lease.execution_id),
                                   lease.execution_id, lease.token, step_key, idempotency_key,
                                   function_name)
        if not row["fenced"]:
            raise await rejected(self, lease, step_key)
        if row["status"] is not None:
            return EffectAttempt(step_key, row["idempotency_key"], row["status"], row["token"],
                                 row["attempts"], True, row["interrupt"])
        existing = await self.db.fetchrow(
            "SELECT idempotency_key, status, token, attempts FROM effects "
            "WHERE execution_id = $1 AND bucket = fencepost_bucket($1) AND step_key = $2",
            lease.execution_id,
            step_key,
        )
        assert existing is not None  # recorded: the insert above met it
        return EffectAttempt(step_key, existing["idempotency_key"], existing["status"],
                             existing["token"], existing["attempts"], False, row["interrupt"])

    async def retry_effect(self, lease: Lease, step_key: str) -> None:
        """Record one more attempt of a begun effect (idempotent call again,
        reconciled as not found, or retried on an operator's word), fenced."""
        [row] = await _RETRY.fetch(self.db, await shard_buckets(self, lease.execution_id),
                                   lease.execution_id, lease.token, step_key)
        if not row["fenced"]:
            raise await rejected(self, lease, step_key)

    async def park_outcome_unknown(self, lease: Lease, step_key: str) -> str:
        """End the delivery by parking the execution: the effect's outcome is
        unknown and nobody may claim it until an operator resolves the step.
        Returns the status written (see `park`)."""
        return await self.park(lease, "outcome_unknown", step_key)

    async def park(self, lease: Lease, reason: str, step_key: str | None,
                   detail: dict[str, Any] | None = None) -> str:
        """End the delivery by parking the execution for `reason`
        (`outcome_unknown`: the effect of `step_key` is in doubt;
        `nondeterminism`: the code no longer fits its history, `detail` the
        first divergence). Nobody claims it until an operator acts. Fenced
        like an acknowledgement (it is one: the counter resets). A pending
        cancel request or a passed deadline ends it instead, as an
        acknowledgement would. Returns the status written."""
        placement = await placement_of(self.db, self.config.placement)
        buckets = [bucket_of(lease.execution_id)] if placement.distributed else None

        async def end(conn: asyncpg.Connection) -> asyncpg.Record:
            rows = await _PARK.fetch(conn, buckets, lease.execution_id, lease.token, step_key,
                                     reason, detail)
            if not rows:
                raise LeaseLost(lease.execution_id, lease.token)
            # A parent waiting for this execution's end (a cancel or deadline
            # ended it) is woken in the same transaction, on its own shard.
            await after_ends(conn, placement, rows)
            return rows[0]

        try:
            row = await self.db.run_in_transaction(end)
        except LeaseLost:
            # Recorded after the rollback of the refused park.
            raise await rejected(self, lease, step_key) from None
        status: str = row["status"]
        METRICS.ended([status], park_reason=reason)
        return status
