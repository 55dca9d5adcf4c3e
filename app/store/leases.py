"""Leases: where one is taken (claim_due), renewed (renew), and ended
(release, acknowledge, or the reaper's reap_expired; sweep_interrupted ends
what nobody may run again). Where a lease is checked: every fenced write
carries the token and checks it in its own statement (the fence, see
app/store/fencing.py)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, Literal, cast

import asyncpg

from app.db import encode_json
from app.dberrors import is_infrastructure
from app.metrics import METRICS
from app.schema import TERMINAL_STATUSES
from app.store.buckets import bucket_of
from app.store.compose import ENDED_NOTICE, WAKE_PARENTS
from app.store.fencing import interrupt_at, rejected
from app.store.group_commit import GroupCommit
from app.store.handle import Handle, StoreConfig, StoreObject
from app.store.on_shard import NEXT_ATTEMPT_ID, NEXT_EVENT_ID, OnShard
from app.store.placement import ClaimRotation, Placement, placement_of
from app.store.policy import (
    CANCELLED_OUTCOME,
    TIMED_OUT_OUTCOME,
    WATCHED,
    after_ends,
    settle,
    sweep,
)
from app.store.retry import Connection, RetryingPool
from app.store.steps import ATTEMPT_HISTORY
from app.store.types import (
    NOTIFY_CHANNEL,
    Acknowledged,
    Delivery,
    Interrupt,
    InvalidEvent,
    Lease,
    LeaseLost,
    ReapResult,
)

log = logging.getLogger("fencepost.leases")

# A suspension acknowledged after a cancel request or the deadline, by code
# that had not met it, within the cleanup window: the execution stays
# suspended and is due at once, so the next delivery raises it at the wait.
_CLEANUP_DUE = """(i.reported = 'suspended'
    AND (e.cancel_requested_at IS NOT NULL OR e.deadline <= now())
    AND fencepost_cleanup_ends(e.cancel_requested_at, e.deadline, e.cleanup_seconds) > now())"""

# Acknowledgements, one row of input each ($1..$6 parallel arrays: execution,
# token, reported status, outcome, traceback, waiting_on as JSON text). Each
# row keeps its own fence (its token, still running) and its own outcome
# rules; what one row's answer is never depends on another row of the batch.
# {lock} is how the rows are taken before anything is written: a batch locks
# its rows and the parents they would wake with SKIP LOCKED (never waiting),
# a lone acknowledgement takes them as its writes reach them (it may wait).
#
# One Postgres: one statement takes the rows, writes them, wakes the parents
# their ends wake and notifies. Citus (_ACKNOWLEDGE_*_ON_SHARD): one statement
# per shard writes that shard's rows alone, and the notices follow it
# (policy.after_ends). In a batch there a row with a parent is skipped (sent
# alone), so that no batch waits for a parent's lock; alone, the parent is
# woken (maybe on another node) in the statement's transaction.
_ACK_INPUT = """
WITH i AS (
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[],
                         $6::text[])
        WITH ORDINALITY AS i(execution_id, token, reported, outcome, traceback,
                             waiting_on, n)
)"""
_ACK_TAKE = """
    held_back AS (
    -- The parent of an execution acknowledged in the same statement is left
    -- out, to be acknowledged after it, alone: the child's end wakes its
    -- parent, and one statement must not write one row twice (only one
    -- write would stand). Children hold their parent's ID from admission on.
    SELECT DISTINCT c.parent_execution_id AS execution_id
    FROM i JOIN executions c
        ON c.execution_id = i.execution_id AND c.bucket = fencepost_bucket(i.execution_id)
    WHERE c.parent_execution_id IS NOT NULL
), wanted AS (
    SELECT execution_id FROM i WHERE execution_id NOT IN (SELECT execution_id FROM held_back)
    UNION
    SELECT c.parent_execution_id
    FROM i JOIN executions c
        ON c.execution_id = i.execution_id AND c.bucket = fencepost_bucket(i.execution_id)
    WHERE c.parent_execution_id IS NOT NULL
      AND i.execution_id NOT IN (SELECT execution_id FROM held_back)
), {locked}, ready AS (
    -- Written here: the rows whose own row and parent (if it still exists)
    -- this statement holds. The others are answered `skipped`, nothing of
    -- them written, and sent alone: a row another transaction holds then
    -- waits for it alone.
    SELECT i.* FROM i JOIN locked l ON l.execution_id = i.execution_id
    WHERE i.execution_id NOT IN (SELECT execution_id FROM held_back)
      AND (l.parent_execution_id IS NULL
           OR l.parent_execution_id IN (SELECT execution_id FROM locked)
           OR NOT EXISTS (SELECT 1 FROM executions p
                          WHERE p.execution_id = l.parent_execution_id
                            AND p.bucket = fencepost_bucket(l.parent_execution_id)))
)"""
_ACK_TAKE_ON_SHARD = """
    {locked}, ready AS (
    -- Written here: the rows this statement holds (in a batch, of those
    -- with no parent).
    SELECT i.* FROM i JOIN locked l ON l.execution_id = i.execution_id {ready}
)"""
# Every row the statement may write (`{rows}`: on one Postgres the
# acknowledged ones and the parents their ends wake; on a shard, that shard's
# acknowledged ones), in execution_id order: in a batch, locked here in this
# one pass (SKIP LOCKED), before any of them is written.
def _ack_locked(rows: str, lock: str) -> str:
    return f"""locked AS MATERIALIZED (
    SELECT x.execution_id, x.parent_execution_id FROM executions x
    WHERE (x.execution_id, x.bucket) IN (SELECT execution_id, fencepost_bucket(execution_id)
                                         FROM {rows})
    ORDER BY x.execution_id
    {lock}
)"""


_ACK_WRITE = """
    a AS (
    -- The fence, atomic: the token check and the write are one step on a
    -- row locked from before the check until the commit, so no claim can
    -- land between them; a claim committed since this statement's snapshot
    -- is seen by the re-check of this WHERE on the row's latest version.
    UPDATE executions e
    SET status = CASE WHEN {cleanup_due} THEN 'suspended'
                      WHEN e.cancel_requested_at IS NOT NULL THEN 'cancelled'
                      WHEN e.deadline <= now() AND i.reported <> 'cancelled'
                      THEN 'timed_out'
                      ELSE i.reported END,
        outcome = CASE WHEN {cleanup_due} THEN NULL
                       WHEN e.cancel_requested_at IS NOT NULL
                       THEN {cancelled}
                       WHEN e.deadline <= now() AND i.reported <> 'cancelled'
                       THEN {timed_out}
                       ELSE i.outcome::jsonb END,
        ever_suspended = e.ever_suspended OR i.reported = 'suspended',
        waiting_on = CASE WHEN i.reported = 'suspended' THEN i.waiting_on::jsonb END,
        -- A wait ends at the deadline at the latest: the execution is due
        -- then, and that delivery raises DeadlineExceeded where the code waits.
        due_at = CASE WHEN {cleanup_due} THEN now()
                      WHEN i.reported = 'suspended' AND e.cancel_requested_at IS NULL
                       AND (e.deadline IS NULL OR e.deadline > now())
                      THEN least(e.due_at, e.deadline) END,
        covered_due_at = NULL,
        lease_owner = NULL,
        lease_expires_at = NULL,
        unacknowledged_deliveries = 0,
        last_unacknowledged_at = NULL,
        redeliver_after = NULL,
        -- The places of the acknowledgement's events (at most two: see ev).
        event_seq = e.event_seq + 2,
        updated_at = now()
    FROM ready i
    WHERE e.execution_id = i.execution_id AND e.bucket = fencepost_bucket(i.execution_id)
      AND e.token = i.token AND e.status = 'running'
    RETURNING i.n, i.reported, i.traceback, e.execution_id, e.token, e.status, e.outcome,
              e.due_at, e.parent_execution_id, e.workflow_id,
              extract(epoch FROM now() - e.admitted_at) AS age, e.event_seq
)"""
_ACK_EVENTS = """
    ev AS (
    INSERT INTO execution_events (event_id, execution_id, bucket, seq, kind, token, detail)
    SELECT {next_event}, execution_id, fencepost_bucket(execution_id), event_seq - 1,
           'acknowledged', token,
           jsonb_strip_nulls(jsonb_build_object(
               'status', status, 'reported', reported, 'traceback', traceback))
    FROM a
    UNION ALL
    SELECT {next_event}, execution_id, fencepost_bucket(execution_id), event_seq, status,
           token, NULL
    FROM a
    WHERE status IN ('cancelled', 'timed_out')
)"""
_ACK_ANSWER = """
SELECT n, false AS held_back, false AS skipped, status, outcome, workflow_id, age,
       CASE WHEN due_at <= now() OR EXISTS (SELECT 1 FROM parent_wake)
            THEN pg_notify('{channel}', '') END,
       {ended_notice}
FROM a
UNION ALL
SELECT n, true, false, NULL, NULL, NULL, NULL, NULL, NULL FROM i
WHERE execution_id IN (SELECT execution_id FROM held_back)
UNION ALL
-- Its row or parent held by another transaction: nothing of it written.
SELECT n, false, true, NULL, NULL, NULL, NULL, NULL, NULL FROM i
WHERE execution_id NOT IN (SELECT execution_id FROM held_back)
  AND n NOT IN (SELECT n FROM ready)
  AND EXISTS (SELECT 1 FROM executions x
              WHERE x.execution_id = i.execution_id
                AND x.bucket = fencepost_bucket(i.execution_id))
"""
_ACK_ANSWER_ON_SHARD = """
SELECT n, false AS held_back, false AS skipped, status, outcome, workflow_id, age,
       due_at <= now() AS due_now, parent_execution_id, {watched}
FROM a
UNION ALL
-- Its row held by another transaction (or, in a batch, it has a parent):
-- nothing of it written.
SELECT n, false, true, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM i
WHERE n NOT IN (SELECT n FROM ready)
  AND EXISTS (SELECT 1 FROM executions x
              WHERE x.execution_id = i.execution_id
                AND x.bucket = fencepost_bucket(i.execution_id))
"""


def _acknowledge_sql(lock: str) -> str:
    return (_ACK_INPUT + ", " + _ACK_TAKE.format(locked=_ack_locked("wanted", lock)).lstrip() + ", "
            + _ACK_WRITE.lstrip() + ", " + WAKE_PARENTS.format(ended="a").lstrip() + ", "
            + _ACK_EVENTS.lstrip() + _ACK_ANSWER).format(
        cleanup_due=_CLEANUP_DUE, cancelled=CANCELLED_OUTCOME, timed_out=TIMED_OUT_OUTCOME,
        next_event=NEXT_EVENT_ID, channel=NOTIFY_CHANNEL,
        ended_notice=ENDED_NOTICE.format(ended="a"))


def _acknowledge_on_shard(name: str, lock: str, ready: str) -> OnShard:
    return OnShard(name, (
        _ACK_INPUT + ", " + _ACK_TAKE_ON_SHARD.format(locked=_ack_locked("i", lock), ready=ready).lstrip() + ", "
        + _ACK_WRITE.lstrip() + ", " + _ACK_EVENTS.lstrip() + _ACK_ANSWER_ON_SHARD).format(
        cleanup_due=_CLEANUP_DUE, cancelled=CANCELLED_OUTCOME, timed_out=TIMED_OUT_OUTCOME,
        next_event=NEXT_EVENT_ID, watched=WATCHED.format(ended="a")), (
        "text[]", "bigint[]", "text[]", "text[]", "text[]", "text[]"), (
        ("n", "bigint"), ("held_back", "boolean"), ("skipped", "boolean"), ("status", "text"),
        ("outcome", "jsonb"), ("workflow_id", "text"), ("age", "numeric"),
        ("due_now", "boolean"), ("parent_execution_id", "text"), ("watched", "boolean")))


# Inside the group commit a statement waits for no lock, even for one
# acknowledgement: one row another transaction holds (an operator's cancel of
# a tree, a bulk update) must not stall the rest of its batch, nor hold one of
# the group's few flushes in flight while every other acknowledgement queues
# behind it; and two batches each holding what the other wants would
# deadlock. FOR NO KEY UPDATE, as the UPDATE itself locks: event inserts
# (foreign key checks) are not blocked by it.
_ACKNOWLEDGE_BATCH = _acknowledge_sql("FOR NO KEY UPDATE OF x SKIP LOCKED")
# Alone, outside the group commit (a caller's transaction, or one a batch sent
# back): the rows are locked as the UPDATE and the parent wake reach them,
# waiting for another transaction's lock as any single write does.
_ACKNOWLEDGE_ALONE = _acknowledge_sql("")
# On Citus (see _ACKNOWLEDGE): the same two ways, one shard at a time.
_ACKNOWLEDGE_BATCH_ON_SHARD = _acknowledge_on_shard(
    "acknowledge_batch", "FOR NO KEY UPDATE OF x SKIP LOCKED", "WHERE l.parent_execution_id IS NULL")
_ACKNOWLEDGE_ALONE_ON_SHARD = _acknowledge_on_shard("acknowledge_alone", "", "")


def _ack_arrays(acks: Sequence[_Ack]) -> tuple[list[Any], ...]:
    """The acknowledgement statements' parameters ($1..$6) for `acks`."""
    return ([a.lease.execution_id for a in acks], [a.lease.token for a in acks],
            [a.status for a in acks], [a.outcome for a in acks], [a.traceback for a in acks],
            [a.waiting_on for a in acks])


def _unstorable(exc: BaseException) -> BaseException:
    """A failed acknowledgement statement's error as its caller gets it: a
    value Postgres cannot store exactly (nothing written) is InvalidEvent."""
    return InvalidEvent(str(exc)) if isinstance(exc, _UNSTORABLE) else exc


class _SendAlone:
    """A batch's answer to an acknowledgement it did not write: its caller
    sends it alone (after that batch committed)."""


SEND_ALONE = _SendAlone()
# What became of one acknowledgement of a batch statement: its row, None
# (nothing written), SEND_ALONE, or the error of a failed statement.
_Written = asyncpg.Record | _SendAlone | BaseException | None

# What makes an acknowledgement's values unstorable (nothing of it written).
_UNSTORABLE = (ValueError, TypeError, asyncpg.DataError)


@dataclass(frozen=True)
class _Ack:
    """One acknowledgement: the lease it ends, the status its holder reports,
    and the outcome, traceback and wait as sent (JSON text)."""

    lease: Lease
    status: str
    outcome: str | None
    traceback: str | None
    waiting_on: str | None


# What the claimer can run: the workflow ($6, NULL: any), and for an
# execution admitted under a code version, that version of it ($9, parallel
# to $6; NULL: any version). A claimer never takes an execution its code
# version might replay differently.
CARRIED = """($6::text[] IS NULL OR (e.workflow_id = ANY($6::text[])
                 AND (e.code_version IS NULL OR $9::text[] IS NULL OR EXISTS (
                     SELECT 1 FROM unnest($6::text[], $9::text[]) AS c(workflow_id, version)
                     WHERE c.workflow_id = e.workflow_id AND c.version = e.code_version))))"""


# A holder's renewal of its leases ($1, $2: execution and token, parallel;
# $3: the lease's length in seconds): one row per lease renewed, and one per
# lease whose row another transaction holds (busy); the others are lost.
_RENEW = OnShard("renew", """
WITH held AS (
    -- On Citus: the leases of one shard (see Leases.renew_with_interrupts).
    SELECT * FROM unnest($1::text[], $2::bigint[]) AS h(execution_id, token)
), free AS (
    -- A row locked by a running transactional step (or a step write) is
    -- skipped this round rather than waited for: one long transaction must
    -- not stall the renewal of every other lease in the batch. Skipped
    -- leases are neither renewed nor lost.
    SELECT e.execution_id
    FROM executions e
    JOIN held h
        ON e.execution_id = h.execution_id
       AND e.bucket = fencepost_bucket(h.execution_id)
    FOR NO KEY UPDATE OF e SKIP LOCKED
), renewed AS (
    UPDATE executions e
    -- Bounded even when the holder's code never returns: a lease never
    -- reaches past the end of the cleanup window after a cancel request or
    -- the deadline; a wedged holder's lease then lapses and the reaper ends
    -- the execution.
    SET lease_expires_at = least(now() + make_interval(secs => $3),
            coalesce(fencepost_cleanup_ends(e.cancel_requested_at, e.deadline,
                                            e.cleanup_seconds), 'infinity'))
    FROM held h
    -- The fence: current token and a lease not ended by acknowledge,
    -- release or the reaper; the row lock (taken in `free`, on this one
    -- node on Citus) makes the check and the write one.
    WHERE e.execution_id = h.execution_id
      AND e.bucket = fencepost_bucket(h.execution_id) AND e.token = h.token
      AND e.status = 'running'
      AND e.execution_id IN (SELECT execution_id FROM free)
    RETURNING e.execution_id, e.token, e.lease_expires_at,
              CASE WHEN e.cancel_requested_at IS NOT NULL THEN 'cancel'
                   WHEN e.deadline <= now() THEN 'deadline' END AS interrupt,
              extract(epoch FROM fencepost_cleanup_ends(
                  e.cancel_requested_at, e.deadline, e.cleanup_seconds)
                  - now())::float8 AS remaining
), lost AS (
    -- Lost to a newer claim or to the reaper; a lease this holder has just
    -- ended itself (acknowledged: same token, counter 0; or released) is
    -- not news. Its event's place taken on the row `free` locked (never one
    -- `renewed` wrote: a row is updated once per statement).
    UPDATE executions e SET event_seq = e.event_seq + 1
    FROM held h
    WHERE e.execution_id = h.execution_id
      AND e.bucket = fencepost_bucket(h.execution_id)
      AND NOT EXISTS (SELECT 1 FROM renewed r WHERE r.execution_id = h.execution_id)
      AND h.execution_id IN (SELECT execution_id FROM free)
      AND (e.token <> h.token OR e.unacknowledged_deliveries > 0)
      AND NOT EXISTS (SELECT 1 FROM execution_events x
                      WHERE x.execution_id = h.execution_id
                        AND x.bucket = fencepost_bucket(h.execution_id)
                        AND x.token = h.token
                        AND x.kind = 'released')
    RETURNING h.execution_id, h.token, e.event_seq
), ev AS (
    INSERT INTO execution_events (event_id, execution_id, bucket, seq, kind, token)
    SELECT """ + NEXT_EVENT_ID + """, execution_id, fencepost_bucket(execution_id), event_seq,
           'renewal_lost', token
    FROM lost
)
SELECT execution_id, token, lease_expires_at, interrupt, remaining, false AS busy
FROM renewed
UNION ALL
SELECT execution_id, token, NULL, NULL, NULL, true FROM held
WHERE execution_id NOT IN (SELECT execution_id FROM free)
""", ("text[]", "bigint[]", "float8"), (
    ("execution_id", "text"), ("token", "bigint"), ("lease_expires_at", "timestamptz"),
    ("interrupt", "text"), ("remaining", "float8"), ("busy", "boolean")))


# Expired leases ended by the reaper ($1: at most that many; $2, $3: the
# redelivery delay's base and cap): status back, counter +1, covered wakes
# pending again, redelivery delay counted from the expiry.
_REAP = OnShard("reap", """
WITH expired AS (
    -- On Citus: in the buckets of one shard (reap_expired visits each).
    SELECT execution_id, bucket, lease_owner AS old_owner FROM executions
    WHERE status = 'running' AND lease_expires_at <= now()
    ORDER BY lease_expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), r AS (
    UPDATE executions e
    SET status = CASE WHEN e.ever_suspended THEN 'suspended' ELSE 'admitted' END,
        unacknowledged_deliveries = e.unacknowledged_deliveries + 1,
        last_unacknowledged_at = e.lease_expires_at,
        redeliver_after = e.lease_expires_at
            + fencepost_redelivery_delay(e.unacknowledged_deliveries + 1, $2, $3),
        due_at = least(e.due_at, e.covered_due_at),
        covered_due_at = NULL,
        lease_owner = NULL,
        lease_expires_at = NULL,
        event_seq = e.event_seq + 1,
        updated_at = now()
    FROM expired x
    WHERE e.execution_id = x.execution_id AND e.bucket = x.bucket
    RETURNING e.execution_id, e.token, e.last_unacknowledged_at, x.old_owner, e.event_seq
), ev AS (
    INSERT INTO execution_events (event_id, execution_id, bucket, seq, kind, token, detail)
    SELECT """ + NEXT_EVENT_ID + """, execution_id, fencepost_bucket(execution_id), event_seq,
           'lease_expired', token,
           jsonb_build_object('owner', old_owner, 'expiredAt', last_unacknowledged_at)
    FROM r
)
SELECT execution_id, token, old_owner, last_unacknowledged_at FROM r
""", ("bigint", "float8", "float8"), (
    ("execution_id", "text"), ("token", "bigint"), ("old_owner", "text"),
    ("last_unacknowledged_at", "timestamptz")))


# A holder ends its lease without an outcome ($1, $2: execution and token;
# $3, $4: the redelivery delay's base and cap; $5: the reason, or NULL; $6:
# the attempts kept): fenced by the token on the row it updates.
_RELEASE = OnShard("release", """
WITH r AS (
    UPDATE executions
    SET status = CASE WHEN ever_suspended THEN 'suspended' ELSE 'admitted' END,
        unacknowledged_deliveries = unacknowledged_deliveries + 1,
        last_unacknowledged_at = now(),
        redeliver_after = now()
            + fencepost_redelivery_delay(unacknowledged_deliveries + 1, $3, $4),
        due_at = least(due_at, covered_due_at),
        covered_due_at = NULL,
        lease_owner = NULL,
        lease_expires_at = NULL,
        event_seq = event_seq + 1,
        updated_at = now()
    WHERE execution_id = $1 AND bucket = fencepost_bucket($1)
      AND token = $2 AND status = 'running'
    RETURNING execution_id, token, unacknowledged_deliveries, redeliver_after, event_seq
), ev AS (
    INSERT INTO execution_events (event_id, execution_id, bucket, seq, kind, token, detail)
    SELECT """ + NEXT_EVENT_ID + """, execution_id, fencepost_bucket(execution_id), event_seq,
           'released', token,
           jsonb_strip_nulls(jsonb_build_object(
               'unacknowledgedDeliveries', unacknowledged_deliveries,
               'redeliverAfter', redeliver_after,
               'reason', $5::jsonb ->> 'message'))
    FROM r
), why AS (
    INSERT INTO attempt_history
        (attempt_id, execution_id, bucket, step_key, attempt, token, error)
    SELECT """ + NEXT_ATTEMPT_ID + """, execution_id, fencepost_bucket(execution_id), NULL,
           unacknowledged_deliveries, token, $5::jsonb
    FROM r WHERE $5::jsonb IS NOT NULL
    RETURNING attempt_id
), trim AS (
    DELETE FROM attempt_history
    WHERE execution_id = $1 AND bucket = fencepost_bucket($1)
      AND step_key IS NULL AND EXISTS (SELECT 1 FROM why)
      AND attempt_id <= (
          SELECT attempt_id FROM attempt_history
          WHERE execution_id = $1 AND bucket = fencepost_bucket($1)
            AND step_key IS NULL
          ORDER BY attempt_id DESC OFFSET $6 - 1 LIMIT 1)
)
SELECT execution_id, token, unacknowledged_deliveries, redeliver_after FROM r
""", ("text", "bigint", "float8", "float8", "jsonb", "integer"), (
    ("execution_id", "text"), ("token", "bigint"), ("unacknowledged_deliveries", "integer"),
    ("redeliver_after", "timestamptz")))


# The claim (Leases.claim_due), in two forms composed from one text.
#
# One Postgres: one statement over every bucket; the queues' limits are
# counted inside it (fencepost_claim_limits, which locks the queues and counts
# their held slots and recent starts after the locks are granted), and the
# starts of rate-limited queues are recorded by it.
#
# Citus: the claimer counts the limits first, on the coordinator, then sends
# one statement per shard group in the same transaction (on its shard: the
# group's buckets, $10), each given the limits less what the groups before it
# took ($11), and records the starts after the last (Leases._claim_on_shards).
_CLAIM_TEMPLATE = """
WITH lim AS MATERIALIZED (
    {limits}
), open_queues AS (
    SELECT * FROM lim WHERE NOT is_key AND NOT closed
), due AS (
    -- In every bucket, or in one shard's (Citus).
    SELECT c.* FROM open_queues q, LATERAL (
        -- The queue's priority levels, one index probe each, so
        -- that rows not due yet at one level (sleepers) are
        -- never scanned on the way to the due ones of the next.
        WITH RECURSIVE levels(priority) AS (
            SELECT min(x.priority) FROM executions x
            WHERE x.queue = q.queue AND x.status IN ('admitted', 'suspended') {in_group_x}
            UNION ALL
            SELECT (SELECT min(x.priority) FROM executions x
                    WHERE x.queue = q.queue {in_group_x}
                      AND x.status IN ('admitted', 'suspended')
                      AND x.priority > levels.priority)
            FROM levels WHERE levels.priority IS NOT NULL
        )
        SELECT priority FROM levels WHERE priority IS NOT NULL
    ) l, LATERAL (
        SELECT e.execution_id, e.bucket, 'due'::text AS how, NULL::text AS old_owner,
               NULL::timestamptz AS old_expiry, e.queue, e.concurrency_key,
               e.priority, e.due_at AS since, e.status AS was, e.token
        FROM executions e
        WHERE e.queue = q.queue AND e.priority = l.priority {in_group_e}
          AND e.status IN ('admitted', 'suspended') AND e.due_at <= now()
          AND (e.redeliver_after IS NULL OR e.redeliver_after <= now())
          AND {carried}
          -- Not interrupted, or a cleanup delivery within its window;
          -- the other cancelled and timed-out ends are the sweep's.
          AND ((e.cancel_requested_at IS NULL
                AND (e.deadline IS NULL OR e.deadline > now()))
               OR (e.token > 0 AND fencepost_cleanup_ends(
                       e.cancel_requested_at, e.deadline, e.cleanup_seconds) > now()))
          -- Skip what cannot be taken now, so that the work behind
          -- it (other keys, resumptions) is still reached: keys with
          -- no slot or no start left, and fresh starts once the
          -- queue's starts are spent.
          AND (q.run_free IS NULL OR q.run_free > 0
               OR (q.hold AND e.status = 'suspended'))
          AND (e.token > 0 OR q.start_free IS NULL OR q.start_free > 0)
          AND (e.concurrency_key IS NULL OR NOT EXISTS (
              SELECT 1 FROM lim k
              WHERE k.is_key AND k.queue = e.queue
                AND k.concurrency_key = e.concurrency_key
                AND ((k.run_free = 0 AND NOT (k.hold AND e.status = 'suspended'))
                     OR (k.start_free = 0 AND e.token = 0))))
        ORDER BY e.due_at
        LIMIT $1
        FOR UPDATE OF e SKIP LOCKED
    ) c
), expired AS (
    -- In every bucket, or in one shard's (Citus).
    SELECT e.execution_id, e.bucket, 'expired'::text AS how,
           e.lease_owner AS old_owner,
           e.lease_expires_at AS old_expiry, e.queue, e.concurrency_key,
           e.priority, e.lease_expires_at AS since, e.status AS was, e.token
    FROM executions e JOIN open_queues q ON q.queue = e.queue
    WHERE e.status = 'running' AND e.lease_expires_at <= now() {in_group_e}
      AND e.lease_expires_at
          + fencepost_redelivery_delay(e.unacknowledged_deliveries + 1, $4, $5)
          <= now()
      AND {carried}
      -- Left to the reaper: cancel, deadline, and the delivery
      -- that would reach the poison threshold.
      AND e.cancel_requested_at IS NULL AND (e.deadline IS NULL OR e.deadline > now())
      AND e.unacknowledged_deliveries + 1 < $7
      -- A takeover takes a slot: skip full queues and keys, so
      -- that they do not crowd out takeovers elsewhere.
      AND (q.run_free IS NULL OR q.run_free > 0)
      AND (e.concurrency_key IS NULL OR NOT EXISTS (
          SELECT 1 FROM lim k
          WHERE k.is_key AND k.queue = e.queue
            AND k.concurrency_key = e.concurrency_key AND k.run_free = 0))
    ORDER BY e.lease_expires_at
    LIMIT $1
    FOR UPDATE OF e SKIP LOCKED
), candidates AS (
    SELECT d.*,
           -- A suspended execution of a queue that holds slots while
           -- suspended already holds one; everything else takes one.
           NOT (q.hold AND d.was = 'suspended') AS takes_slot,
           d.token = 0 AS starts,
           q.run_free, q.start_free,
           CASE WHEN d.concurrency_key IS NOT NULL
                THEN coalesce(k.run_free, q.key_run_limit) END AS key_run_free,
           CASE WHEN d.concurrency_key IS NOT NULL
                THEN coalesce(k.start_free, q.key_start_limit) END AS key_start_free
    FROM (SELECT * FROM due UNION ALL SELECT * FROM expired) d
    JOIN open_queues q ON q.queue = d.queue
    LEFT JOIN lim k ON k.is_key AND k.queue = d.queue
                    AND k.concurrency_key = d.concurrency_key
), within_key AS (
    -- In claim order, take while the key has slots and starts left.
    SELECT * FROM (
        SELECT c.*, sum(c.takes_slot::int) OVER w AS key_slots_taken,
               sum(c.starts::int) OVER w AS key_starts_taken
        FROM candidates c
        WINDOW w AS (PARTITION BY c.queue, c.concurrency_key
                     ORDER BY c.priority, c.since, c.execution_id)
    ) x
    WHERE (NOT x.takes_slot OR x.key_run_free IS NULL
           OR x.key_slots_taken <= x.key_run_free)
      AND (NOT x.starts OR x.key_start_free IS NULL
           OR x.key_starts_taken <= x.key_start_free)
), within_queue AS (
    -- Then while the queue has slots and starts left.
    SELECT * FROM (
        SELECT c.*, sum(c.takes_slot::int) OVER w AS slots_taken,
               sum(c.starts::int) OVER w AS starts_taken
        FROM within_key c
        WINDOW w AS (PARTITION BY c.queue ORDER BY c.priority, c.since, c.execution_id)
    ) x
    WHERE (NOT x.takes_slot OR x.run_free IS NULL OR x.slots_taken <= x.run_free)
      AND (NOT x.starts OR x.start_free IS NULL OR x.starts_taken <= x.start_free)
), picked AS (
    SELECT execution_id, bucket, how, old_owner, old_expiry, queue, concurrency_key,
           starts, takes_slot,
           run_free IS NOT NULL OR key_run_free IS NOT NULL AS slot_limited,
           start_free IS NOT NULL OR key_start_free IS NOT NULL AS start_limited
    FROM within_queue ORDER BY priority, since LIMIT $1
){started}, graces AS (
    SELECT * FROM unnest($6::text[], $8::float8[]) AS g(workflow_id, seconds)
), claimed AS (
    UPDATE executions e
    SET status = 'running',
        token = e.token + 1,
        lease_owner = $3,
        cleanup_seconds = coalesce(
            (SELECT seconds FROM graces g WHERE g.workflow_id = e.workflow_id),
            e.cleanup_seconds),
        -- A lease never reaches past the end of the cleanup window
        -- (the code's cleanup window, as just written).
        lease_expires_at = least(now() + make_interval(secs => $2),
            coalesce(fencepost_cleanup_ends(e.cancel_requested_at, e.deadline,
                coalesce((SELECT seconds FROM graces g
                          WHERE g.workflow_id = e.workflow_id),
                         e.cleanup_seconds)), 'infinity')),
        -- A lease taken over after expiry ended unacknowledged: it
        -- counts, and its covered wakes are covered again.
        unacknowledged_deliveries =
            e.unacknowledged_deliveries + (p.how = 'expired')::int,
        last_unacknowledged_at = CASE WHEN p.how = 'expired'
            THEN e.lease_expires_at ELSE e.last_unacknowledged_at END,
        -- The claim covers every wake pending now; later wakes
        -- collect in due_at, apart from these.
        covered_due_at = CASE WHEN p.how = 'expired'
            THEN least(e.covered_due_at, e.due_at) ELSE e.due_at END,
        due_at = NULL,
        redeliver_after = NULL,
        -- The places of this claim's events in the history (see `ev`).
        event_seq = e.event_seq + 1 + (p.how = 'expired')::int,
        updated_at = now()
    FROM picked p
    WHERE e.execution_id = p.execution_id AND e.bucket = p.bucket
    RETURNING e.execution_id, e.token, e.lease_expires_at, e.workflow_id, e.params,
              e.context, e.outcome, e.unacknowledged_deliveries, e.deadline,
              e.code_version, e.ever_suspended, p.how, p.old_owner, p.old_expiry,
              e.updated_at AS claimed_at, {interrupt},
              fencepost_cleanup_ends(e.cancel_requested_at, e.deadline,
                                     e.cleanup_seconds) AS cleanup_ends,
              (e.token > 1 OR e.forked_from IS NOT NULL) AS has_history,
              e.traceparent, e.queue, e.concurrency_key, p.starts, p.takes_slot,
              p.slot_limited, p.start_limited,
              extract(epoch FROM e.updated_at - e.admitted_at) AS since_admitted,
              e.event_seq
), ev AS (
    INSERT INTO execution_events (event_id, execution_id, bucket, seq, kind, token, detail)
    SELECT {next_event}, execution_id, fencepost_bucket(execution_id), event_seq - 1,
           'lease_expired', token - 1,
           jsonb_build_object('owner', old_owner, 'expiredAt', old_expiry)
    FROM claimed WHERE how = 'expired'
    UNION ALL
    SELECT {next_event}, execution_id, fencepost_bucket(execution_id), event_seq, 'claimed',
           token, jsonb_build_object('owner', $3::text)
    FROM claimed
), next_due AS (
    -- The earliest due time still to come, whoever may run it (one
    -- probe of ix_executions_due): the claimer sleeps until then.
    -- A row this claim takes is due now, so it never counts here.
    -- Of every bucket, or of the group's (Citus).
    SELECT extract(epoch FROM min(x.due_at) - now())::float8 AS next_due_in
    FROM executions x
    WHERE x.status IN ('admitted', 'suspended') AND x.due_at > now() {in_group_x}
)
-- One row even when nothing is claimed: the next due time alone.
SELECT c.*, n.next_due_in FROM next_due n LEFT JOIN claimed c ON true
"""

# Rate-limited queues count their starts from these rows: rate-limited as the
# counting saw it after the lock (this statement's own snapshot may predate a
# change), stamped with the time of the start itself, not of the claim's
# transaction start (which precedes any wait for the lock).
_RECORD_STARTS = """, started AS (
    INSERT INTO queue_starts (queue, concurrency_key, started_at)
    SELECT p.queue, p.concurrency_key, clock_timestamp() FROM picked p
    WHERE p.starts AND p.start_limited
)"""
# On Citus, after the last group's claim, on the coordinator ($1, $2: the
# queue and key of each start, parallel).
_RECORD_STARTS_APART = """
INSERT INTO queue_starts (queue, concurrency_key, started_at)
SELECT queue, concurrency_key, clock_timestamp()
FROM unnest($1::text[], $2::text[]) AS s(queue, concurrency_key)
"""
_LIMITS_COLUMNS = (
    ("queue", "text"), ("concurrency_key", "text"), ("is_key", "boolean"),
    ("closed", "boolean"), ("run_free", "integer"), ("start_free", "integer"),
    ("hold", "boolean"), ("key_run_limit", "integer"), ("key_start_limit", "integer"))

_CLAIM = _CLAIM_TEMPLATE.format(
    limits="SELECT * FROM fencepost_claim_limits($6::text[])", in_group_x="", in_group_e="",
    carried=CARRIED, interrupt=interrupt_at("e.updated_at"), next_event=NEXT_EVENT_ID,
    started=_RECORD_STARTS)
_CLAIM_ON_SHARD = OnShard("claim", _CLAIM_TEMPLATE.format(
    limits="SELECT * FROM jsonb_to_recordset($11::jsonb) AS l("
           + ", ".join(f"{c} {t}" for c, t in _LIMITS_COLUMNS) + ")",
    in_group_x="AND x.bucket = ANY($10::smallint[])",
    in_group_e="AND e.bucket = ANY($10::smallint[])",
    carried=CARRIED, interrupt=interrupt_at("e.updated_at"), next_event=NEXT_EVENT_ID,
    started=""), (
    "bigint", "float8", "text", "float8", "float8", "text[]", "integer", "float8[]", "text[]",
    "smallint[]", "jsonb"), (
    ("execution_id", "text"), ("token", "bigint"), ("lease_expires_at", "timestamptz"),
    ("workflow_id", "text"), ("params", "jsonb"), ("context", "jsonb"), ("outcome", "jsonb"),
    ("unacknowledged_deliveries", "integer"), ("deadline", "timestamptz"),
    ("code_version", "text"), ("ever_suspended", "boolean"), ("how", "text"),
    ("old_owner", "text"), ("old_expiry", "timestamptz"), ("claimed_at", "timestamptz"),
    ("interrupt", "text"), ("cleanup_ends", "timestamptz"), ("has_history", "boolean"),
    ("traceparent", "text"), ("queue", "text"), ("concurrency_key", "text"),
    ("starts", "boolean"), ("takes_slot", "boolean"), ("slot_limited", "boolean"),
    ("start_limited", "boolean"), ("since_admitted", "numeric"), ("event_seq", "bigint"),
    ("next_due_in", "float8")))


class Claimed(list[Delivery]):
    """A claim's deliveries, and `next_due_in`: seconds from the claim until
    the earliest due time still to come (a timer, a delayed start, a wake)
    of an execution the claim could not take yet, by the database clock;
    None when nothing waits for a time."""

    def __init__(self, deliveries: list[Delivery], next_due_in: float | None) -> None:
        super().__init__(deliveries)
        self.next_due_in = next_due_in


class Leases(StoreObject):
    def __init__(self, db: Handle, config: StoreConfig) -> None:
        super().__init__(db, config)
        # On the pool, concurrent acknowledgements (a worker's deliveries
        # ending) go in one statement per batch; in a caller's transaction
        # each is its own statement, so that it joins the transaction.
        self.acknowledgements: GroupCommit[_Ack, Acknowledged | _SendAlone] | None = (
            GroupCommit(self._flush_acknowledgements) if isinstance(db, RetryingPool) else None)
        # Acknowledgements a batch answered SEND_ALONE (held back, a second
        # one of an execution, a row or parent another transaction held, or
        # a batch statement that failed), each then sent alone by its caller.
        self.sent_alone = 0
        # Citus: which shard groups the next claim visits.
        self._rotation: ClaimRotation | None = None

    def wake_claims(self) -> None:
        """Something became due (a NOTIFY): the next claim looks in every
        shard group again, idle ones included (Citus; nothing on one node)."""
        if self._rotation is not None:
            self._rotation.wake()

    async def claim_due(
        self, limit: int, duration: float, owner: str, workflow_ids: list[str] | None = None,
        cleanup_seconds: list[float] | None = None, versions: list[str | None] | None = None,
    ) -> Claimed:
        """Lease at most `limit` due executions in one statement; the answer
        also says when the next one not due yet will be (Claimed.next_due_in),
        so an idle claimer waits until then rather than poll.

        Candidates are due admitted/suspended rows past their redelivery delay,
        and running rows whose lease expired (and whose redelivery delay since
        that expiry has passed). FOR UPDATE SKIP LOCKED makes concurrent claims
        take disjoint rows, so an execution never has two live leases; the
        token increment makes every earlier holder stale. `workflow_ids`
        limits the claim to workflows the caller can run (None: any);
        `cleanup_seconds` (parallel to it) is each one's cleanup window in the
        caller's code, written on the claimed rows (None: keep the stored one).
        `versions` (parallel to it) is the code version the caller carries of
        each: an execution admitted under a version is claimed only by a
        caller carrying that version of its workflow (an unversioned one by
        any caller carrying the workflow); None: any version.

        An execution whose cancel was requested or whose deadline passed is
        claimed only if it has run before (token > 0) and its cleanup window
        is open: that delivery raises Cancelled / DeadlineExceeded where the
        code waits (Delivery.interrupt). The lease never reaches past the
        window's end.
        """
        if limit <= 0:
            return Claimed([], None)
        placement = await placement_of(self.db, self.config.placement)
        if not placement.distributed:
            return await self._claim(limit, duration, owner, workflow_ids, cleanup_seconds,
                                     versions)
        return await self._claim_on_shards(placement, limit, duration, owner, workflow_ids,
                                           cleanup_seconds, versions)

    async def _claim(
        self, limit: int, duration: float, owner: str, workflow_ids: list[str] | None,
        cleanup_seconds: list[float] | None, versions: list[str | None] | None,
    ) -> Claimed:
        """One claim statement over every bucket (one Postgres)."""
        rows = await self.db.fetch(
            _CLAIM, limit, float(duration), owner, self.config.redelivery_base,
            self.config.redelivery_cap, workflow_ids, self.config.max_unacknowledged,
            cleanup_seconds, versions)
        return Claimed(_deliveries(rows, owner), rows[0]["next_due_in"] if rows else None)

    async def _claim_on_shards(
        self, placement: Placement, limit: int, duration: float, owner: str,
        workflow_ids: list[str] | None, cleanup_seconds: list[float] | None,
        versions: list[str | None] | None,
    ) -> Claimed:
        """The claim on Citus, one transaction per node holding groups to
        visit (so that a claim never commits on two nodes: no two-phase
        commit), nodes in the rotation's order, until `limit` are claimed.
        In each: the queues' limits counted on the coordinator (after their
        locks, held to its end), then one claim statement per shard group
        of that node on its shard, then the starts of rate-limited queues
        recorded. Each group's claim sees the limits less what the groups
        before it in the transaction took, so a queue's slots are never
        taken twice over (its lock keeps other claimers out meanwhile)."""
        if self._rotation is None or self._rotation.groups != placement.groups:
            self._rotation = ClaimRotation(placement.groups, self.config.claim_recheck)

        async def run(conn: Any, indexes: list[int], wanted: int
                      ) -> list[tuple[int, list[asyncpg.Record]]]:
            limits = [dict(r) for r in await conn.fetch(
                "SELECT * FROM fencepost_claim_limits($1::text[])", workflow_ids)]
            found: list[tuple[int, list[asyncpg.Record]]] = []
            taken = 0
            for index in indexes:
                group = list(placement.groups[index])
                rows = await _CLAIM_ON_SHARD.fetch(
                    conn, group, wanted - taken, float(duration), owner,
                    self.config.redelivery_base, self.config.redelivery_cap, workflow_ids,
                    self.config.max_unacknowledged, cleanup_seconds, versions, group, limits)
                found.append((index, rows))
                claimed = [r for r in rows if r["execution_id"] is not None]
                _spend(limits, claimed)
                taken += len(claimed)
                if taken >= wanted:
                    break
            starts = [r for _, rows in found for r in rows
                      if r["execution_id"] is not None and r["starts"] and r["start_limited"]]
            if starts:
                await conn.execute(_RECORD_STARTS_APART, [r["queue"] for r in starts],
                                   [r["concurrency_key"] for r in starts])
            return found

        found: list[tuple[int, list[asyncpg.Record]]] = []
        taken = 0
        for indexes in placement.by_node(self._rotation.order()):
            on_node = await self.db.run_in_transaction(
                partial(run, indexes=indexes, wanted=limit - taken))
            found.extend(on_node)
            taken += sum(1 for _, rows in on_node for r in rows if r["execution_id"] is not None)
            if taken >= limit:
                break
        deliveries: list[Delivery] = []
        earliest: float | None = None
        for index, rows in found:
            got = _deliveries(rows, owner)
            next_due_in = rows[0]["next_due_in"] if rows else None
            self._rotation.found(index, len(got), next_due_in)
            deliveries.extend(got)
            if next_due_in is not None:
                earliest = next_due_in if earliest is None else min(earliest, next_due_in)
        return Claimed(deliveries, earliest)

    async def renew(
        self, leases: list[Lease], duration: float
    ) -> tuple[list[Lease], list[Lease]]:
        """Extend every lease that is still current, in one statement (on
        Citus, one per shard the leases are in).
        Returns (renewed, lost); a lost lease must stop its delivery.
        `interrupts` (see renew_with_interrupts) says which renewed leases
        should stop at their next step: cancel requested, deadline passed."""
        renewed, lost, _ = await self.renew_with_interrupts(leases, duration)
        return renewed, lost

    async def renew_with_interrupts(
        self, leases: list[Lease], duration: float
    ) -> tuple[list[Lease], list[Lease], dict[str, Interrupt]]:
        """As `renew`, plus the renewed leases whose holder should stop:
        {execution_id: Interrupt(kind "cancel" | "deadline", seconds left of
        the cleanup window)}. Such a lease is not extended past the window."""
        if not leases:
            return [], [], {}
        placement = await placement_of(self.db, self.config.placement)

        async def renew_part(part: list[Lease], buckets: list[int] | None
                             ) -> list[asyncpg.Record | None]:
            got = {(r["execution_id"], r["token"]): r for r in await _RENEW.fetch(
                self.db, buckets, [lease.execution_id for lease in part],
                [lease.token for lease in part], float(duration))}
            return [got.get((lease.execution_id, lease.token)) for lease in part]

        # On Citus one statement per shard the leases are in, each on its
        # shard; each renews (or skips) its own leases alone.
        answers = await placement.per_shard(leases, lambda lease: lease.execution_id,
                                            renew_part, at_once=isinstance(self.db, RetryingPool))
        rows = [r for r in answers if r is not None]
        busy = {(r["execution_id"], r["token"]) for r in rows if r["busy"]}
        expiry = {(r["execution_id"], r["token"]): r["lease_expires_at"]
                  for r in rows if not r["busy"]}
        interrupts = {r["execution_id"]: Interrupt(r["interrupt"], max(0.0, r["remaining"]))
                      for r in rows if r["interrupt"]}
        renewed, lost = [], []
        for lease in leases:
            key = (lease.execution_id, lease.token)
            if key in expiry:
                renewed.append(Lease(lease.execution_id, lease.token, expiry[key], lease.owner))
            elif key not in busy:
                lost.append(lease)
        return renewed, lost, interrupts

    async def release(self, lease: Lease, *, reason: dict[str, Any] | None = None) -> str | None:
        """End the lease without an outcome: an unacknowledged delivery. The
        covered wakes stay pending and the redelivery delay starts now; a
        pending cancel, a deadline the redelivery would pass, or the poison
        threshold end it instead, in the same transaction (that status is
        returned; None when it stays claimable). `reason` ({name, message},
        e.g. the workflow's `Retry("why")`) is kept on the `released` event
        and in the attempt history (the last 20 kept)."""
        placement = await placement_of(self.db, self.config.placement)

        async def end(conn: asyncpg.Connection) -> dict[str, str]:
            if not await _RELEASE.fetch(
                    conn, [bucket_of(lease.execution_id)] if placement.distributed else None,
                    lease.execution_id, lease.token, self.config.redelivery_base,
                    self.config.redelivery_cap, reason, ATTEMPT_HISTORY):
                raise LeaseLost(lease.execution_id, lease.token)
            return await settle(conn, [lease.execution_id], self.config.max_unacknowledged,
                                placement)

        try:
            settled = await self.db.run_in_transaction(end)
        except LeaseLost:
            # Recorded after the rollback of the refused release.
            raise await rejected(self, lease) from None
        METRICS.ended(settled.values())
        return settled.get(lease.execution_id)

    async def acknowledge(
        self,
        lease: Lease,
        status: Literal["suspended", "completed", "failed", "cancelled", "timed_out"],
        *,
        result: Any = None,
        error: dict[str, Any] | None = None,
        traceback: str | None = None,
        waiting_on: dict[str, Any] | None = None,
    ) -> Acknowledged:
        """End the delivery with an outcome. Stale token → LeaseLost, nothing
        changes. Current token on a terminal record → the recorded outcome.
        Terminal outcomes are immutable; acknowledging clears the covered
        wakes, keeps later ones (suspended) and resets the counter.

        A pending cancel request wins over anything the holder reports (once
        requested, `completed` is never recorded), and a passed deadline turns
        the acknowledgement into `timed_out` - except a suspension by code
        that had not yet met the cancel or deadline: within the cleanup
        window it is made due at once, for the delivery that runs cleanup.

        On the pool, acknowledgements that arrive while earlier ones are in
        flight go together in the next statement (group commit): each keeps
        its own fence and rules and gets its own answer, and a result that
        cannot be stored fails only its own acknowledgement (InvalidEvent)."""
        if status == "completed":
            outcome: dict[str, Any] | None = {"result": result}
        elif status in ("failed", "cancelled", "timed_out"):
            outcome = {"error": error or {"name": "Error", "message": ""}}
        elif status == "suspended":
            outcome = None
        else:
            raise ValueError(f"cannot acknowledge status {status!r}")
        try:
            ack = _Ack(lease, status, None if outcome is None else encode_json(outcome),
                       traceback, None if waiting_on is None else encode_json(waiting_on))
        except _UNSTORABLE as exc:
            # A result or error Postgres cannot store exactly: nothing written.
            raise InvalidEvent(str(exc)) from exc
        if self.acknowledgements is None:
            return await self._acknowledge_alone(ack)
        answer = await self.acknowledgements.submit(ack)
        if isinstance(answer, _SendAlone):
            # Outside the group commit: the rest of its batch was answered,
            # and a wait for another transaction's lock is this one's alone.
            return await self._acknowledge_alone(ack)
        return answer

    async def _acknowledge_alone(self, ack: _Ack) -> Acknowledged:
        """One acknowledgement, outside the group commit: it may wait for a
        row another transaction holds, and is never sent back."""
        [answer] = await self._acknowledge_batch([ack], in_group=False)
        if isinstance(answer, BaseException):
            raise answer
        if isinstance(answer, _SendAlone):  # pragma: no cover - a lone one is never sent back
            raise AssertionError(f"acknowledgement of {ack.lease.execution_id} sent back alone")
        return answer

    async def _flush_acknowledgements(
            self, acks: list[_Ack]) -> list[Acknowledged | _SendAlone | BaseException]:
        """One batch of the group commit (see _acknowledge_batch)."""
        return await self._acknowledge_batch(acks, in_group=True)

    async def _acknowledge_batch(
            self, acks: Sequence[_Ack], *, in_group: bool,
    ) -> list[Acknowledged | _SendAlone | BaseException]:
        """`acks` in one statement, one answer per ack in order: Acknowledged,
        LeaseLost (recorded as a fenced write rejected), or SEND_ALONE for one
        to be sent alone after this statement committed: a second
        acknowledgement of the same execution, the parent of another one in
        the batch, and one whose row or parent another transaction held.
        `in_group` (a flush of the group commit, even of one acknowledgement):
        the statement waits for no lock. Otherwise (`acks` is one, sent alone
        outside the group): it waits for another transaction's lock, and is
        never sent back.

        In the group, an error of the statement that is not the database
        failing (a value of one acknowledgement that cannot be stored, a
        constraint one row breaks) means nothing of it was written: then
        every one is sent alone, so that the error is only its own
        acknowledgement's answer."""
        first: dict[str, int] = {}
        batch: list[_Ack] = []
        later: list[int] = []
        for index, ack in enumerate(acks):
            if ack.lease.execution_id in first:
                later.append(index)
            else:
                first[ack.lease.execution_id] = index
                batch.append(ack)
        placement = await placement_of(self.db, self.config.placement)
        written: list[_Written]
        if placement.distributed:
            written = await self._acknowledge_on_shards(placement, batch, in_group)
        else:
            try:
                rows = await self.db.fetch(
                    _ACKNOWLEDGE_BATCH if in_group else _ACKNOWLEDGE_ALONE, *_ack_arrays(batch))
            except Exception as exc:
                if in_group and not is_infrastructure(exc):
                    self.sent_alone += len(acks)
                    return [SEND_ALONE] * len(acks)
                answer = _unstorable(exc)
                if answer is exc:
                    raise
                raise answer from exc
            by_n = {row["n"]: row for row in rows}
            written = [by_n.get(n) for n in range(1, len(batch) + 1)]
        answers: dict[int, Acknowledged | _SendAlone | BaseException] = {}
        ended: list[str] = []
        for ack, row in zip(batch, written, strict=True):
            index = first[ack.lease.execution_id]
            if row is None:
                continue  # not written: see `missed`
            if isinstance(row, BaseException):
                answers[index] = row
            elif isinstance(row, _SendAlone) or row["held_back"] or row["skipped"]:
                later.append(index)
            else:
                ended.append(row["status"])
                if row["status"] in TERMINAL_STATUSES:
                    METRICS.end_to_end_seconds.labels(row["workflow_id"]).observe(
                        float(row["age"]))
                answers[index] = Acknowledged(row["status"], row["outcome"])
        METRICS.ended(ended)
        missed = [i for i in first.values() if i not in answers and i not in later]
        if missed:
            # Not acknowledged now: acknowledged before with this token (a
            # terminal record keeps its outcome), or the fence refused it.
            current = {r["execution_id"]: r for r in await self.db.fetch(
                # Citus: the batch's executions are in many buckets.
                "SELECT execution_id, token, status, outcome FROM executions "
                "WHERE execution_id = ANY($1::text[])",
                [acks[i].lease.execution_id for i in missed])}
            for i in missed:
                lease = acks[i].lease
                found = current.get(lease.execution_id)
                if (found is not None and found["token"] == lease.token
                        and found["status"] in TERMINAL_STATUSES):
                    answers[i] = Acknowledged(found["status"], found["outcome"])
                else:
                    answers[i] = await rejected(self, lease)
        for i in later:
            answers[i] = SEND_ALONE
        self.sent_alone += len(later)
        return [answers[i] for i in range(len(acks))]

    async def _acknowledge_on_shards(
            self, placement: Placement, batch: list[_Ack], in_group: bool,
    ) -> list[_Written]:
        """`batch` on Citus, one transaction per shard its executions are in:
        the acknowledgements of that shard on it, then the parents their ends
        wake (wherever those are) and the notices (policy.after_ends). One
        answer per acknowledgement: its row; None when nothing was written
        (stale, or acknowledged before); or, for each one of a shard whose
        transaction failed, what _acknowledge_batch answers a failed
        statement (SEND_ALONE, or the error): the other shards' committed."""
        statement = _ACKNOWLEDGE_BATCH_ON_SHARD if in_group else _ACKNOWLEDGE_ALONE_ON_SHARD

        async def part(acks: list[_Ack], buckets: list[int] | None) -> list[_Written]:
            async def run(conn: Connection | Handle) -> list[asyncpg.Record]:
                rows = await statement.fetch(conn, buckets, *_ack_arrays(acks))
                done = [r for r in rows if not r["skipped"]]
                await after_ends(conn, placement, done, due=any(r["due_now"] for r in done))
                return rows

            if in_group:
                # A batch writes no execution with a parent (those are sent
                # alone), so nothing of what follows must commit with it:
                # the notices are sent after it (hints: a worker or a
                # long-poll that misses one finds the end at its next poll).
                rows = await run(self.db)
            else:
                rows = await self.db.run_in_transaction(run)
            by_n = {row["n"]: row for row in rows}
            return [by_n.get(n) for n in range(1, len(acks) + 1)]

        def failed(acks: list[_Ack], exc: BaseException) -> list[_Written]:
            if in_group and not is_infrastructure(exc):
                return [SEND_ALONE] * len(acks)
            return [_unstorable(exc)] * len(acks)

        return await placement.per_shard(batch, lambda ack: ack.lease.execution_id, part,
                                         on_error=failed,
                                         at_once=isinstance(self.db, RetryingPool))

    # -------------------------------------------------------------------- reaper

    async def reap_expired(self, limit: int = 500) -> ReapResult:
        """End expired leases (_REAP), then, in the same transaction, cancel /
        time out / park as the rules say (policy.settle). At most `limit` in
        one transaction; on Citus, one transaction per shard, each reaping at
        most `limit` there."""
        placement = await placement_of(self.db, self.config.placement)

        async def reap(conn: asyncpg.Connection, buckets: list[int] | None
                       ) -> tuple[list[asyncpg.Record], dict[str, str]]:
            rows = await _REAP.fetch(conn, buckets, limit, self.config.redelivery_base,
                                     self.config.redelivery_cap)
            return rows, await settle(conn, [r["execution_id"] for r in rows],
                                      self.config.max_unacknowledged, placement)

        ids: list[str] = []
        for buckets in placement.each_shard():
            rows, settled = await self.db.run_in_transaction(partial(reap, buckets=buckets))
            METRICS.lease_takeovers.labels("reaper").inc(len(rows))
            METRICS.ended(settled.values())
            for r in rows:
                _log_takeover(r["execution_id"], r["old_owner"], r["token"], None,
                              r["last_unacknowledged_at"], settled.get(r["execution_id"]))
            ids += [r["execution_id"] for r in rows]
        return ReapResult(len(ids), ids)

    async def sweep_interrupted(self, limit: int = 500) -> list[str]:
        """End unheld executions that were cancelled or passed their deadline
        and can run no cleanup (policy.SWEPT): `cancelled` or `timed_out`. At
        most `limit` in one transaction; on Citus, one per shard."""
        placement = await placement_of(self.db, self.config.placement)
        ids: list[str] = []
        for buckets in placement.each_shard():
            rows = await self.db.run_in_transaction(
                partial(sweep, limit=limit, placement=placement, buckets=buckets))
            METRICS.ended(r["status"] for r in rows)
            ids += [r["execution_id"] for r in rows]
        return ids


def _deliveries(rows: Sequence[asyncpg.Record], owner: str) -> list[Delivery]:
    """The deliveries of a claim statement's rows (the row with no execution
    carries only the next due time)."""
    rows = [r for r in rows if r["execution_id"] is not None]
    METRICS.claimed(cast("list[Mapping[str, Any]]", rows))  # rows read by key
    for r in rows:
        if r["how"] == "expired":
            _log_takeover(r["execution_id"], r["old_owner"], r["token"] - 1, owner,
                          r["old_expiry"])
    return [
        Delivery(
            lease=Lease(r["execution_id"], r["token"], r["lease_expires_at"], owner),
            workflow_id=r["workflow_id"],
            params=r["params"],
            context=r["context"],
            status_before="suspended" if r["ever_suspended"] else "admitted",
            outcome=r["outcome"],
            unacknowledged_deliveries=r["unacknowledged_deliveries"],
            deadline=r["deadline"],
            code_version=r["code_version"],
            claimed_at=r["claimed_at"],
            taken_over=r["how"] == "expired",
            interrupt=r["interrupt"],
            cleanup_ends=r["cleanup_ends"],
            has_history=r["has_history"],
            traceparent=r["traceparent"],
            queue=r["queue"],
            slot_limited=r["slot_limited"],
        )
        for r in rows
    ]


def _spend(limits: list[dict[str, Any]], claimed: Sequence[asyncpg.Record]) -> None:
    """Take what a group's claim took off `limits` (rows as
    fencepost_claim_limits answers them), for the next group's claim: a slot
    for each row that took one, a start for each first claim, from its queue
    and from its key. A key with no row yet gets one, starting from its
    queue's per-key limits (as the claim statement reads a key not listed)."""
    queues = {q["queue"]: q for q in limits if not q["is_key"]}
    keys = {(k["queue"], k["concurrency_key"]): k for k in limits if k["is_key"]}
    for r in claimed:
        queue = queues[r["queue"]]
        spent = [queue]
        if r["concurrency_key"] is not None and (queue["key_run_limit"] is not None
                                                 or queue["key_start_limit"] is not None):
            key = keys.get((r["queue"], r["concurrency_key"]))
            if key is None:
                key = dict(queue, concurrency_key=r["concurrency_key"], is_key=True,
                           closed=False, run_free=queue["key_run_limit"],
                           start_free=queue["key_start_limit"])
                keys[(r["queue"], r["concurrency_key"])] = key
                limits.append(key)
            spent.append(key)
        for row in spent:
            if r["takes_slot"] and row["run_free"] is not None:
                row["run_free"] -= 1
            if r["starts"] and row["start_free"] is not None:
                row["start_free"] -= 1


def _log_takeover(execution_id: str, old_owner: str | None, token: int, new_owner: str | None,
                  expired_at: datetime | None, settled: str | None = None) -> None:
    """One line per expired lease ended, by whichever claim or reaper ended it."""
    by = f"taken over by {new_owner}" if new_owner else "ended by the reaper"
    log.warning("lease of %s (token %d, owner %s) expired at %s; %s%s", execution_id, token,
                old_owner, expired_at.isoformat() if expired_at else None, by,
                f"; now {settled}" if settled else "",
                extra={"kind": "lease_takeover", "execution_id": execution_id,
                       "old_owner": old_owner, "new_owner": new_owner, "token": token,
                       "settled": settled})
