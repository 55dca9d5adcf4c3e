"""Trying again after a failure, without a new identity: redrive reopens an
ended execution under the same ID (so effects keep their idempotency keys and
completed steps are not run again); fork starts a new execution that copies
the steps recorded before a chosen step.

Both are one transaction on the source row's lock: two redrives at once make
one redrive (the second finds the execution no longer ended), and a stale
holder of the ended execution stays fenced out (every fenced write needs a
`running` row, and the next claim increments the token)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import asyncpg

from app.store.handle import StoreObject
from app.store.on_shard import NEXT_EVENT_ID, NEXT_SUPERSEDED_ID, OnShard
from app.store.placement import shard_buckets, tell_claimers
from app.store.types import NOTIFY_CHANNEL, Conflict, InvalidEvent

RedriveAnswer = Literal["redriven", "not_found", "not_ended", "completed", "step_not_found"]
ForkAnswer = Literal["forked", "not_found", "step_not_found", "conflict"]

REDRIVABLE = ("failed", "timed_out", "cancelled", "completed")


# The redrive of $1 (locked FOR UPDATE by the caller, its status $7): the
# record cut at step $2 (or at the first failure, the cancel $8 or the
# deadline $9), the steps moved aside as superseded, the effects and signals
# they had taken released, the execution reopened due now, and the event,
# in one statement on the execution's shard.
_REDRIVE = OnShard("redrive", f"""
WITH cut AS (
    -- Where the record is cut: least() skips what does not apply.
    SELECT least(
        (SELECT recorded_at FROM execution_steps
         WHERE execution_id = $1 AND bucket = fencepost_bucket($1)
           AND step_key = $2),
        CASE WHEN $7 <> 'completed' THEN least(
            (SELECT min(recorded_at) FROM execution_steps
             WHERE execution_id = $1 AND bucket = fencepost_bucket($1)
               AND status = 'failed'),
            $8::timestamptz,
            CASE WHEN $7 = 'timed_out' THEN $9::timestamptz END) END) AS at
), moved AS (
    DELETE FROM execution_steps s USING cut
    WHERE s.execution_id = $1 AND s.bucket = fencepost_bucket($1)
      AND s.recorded_at >= cut.at
    RETURNING s.*
), ex AS (
    UPDATE executions e
    SET status = CASE WHEN e.ever_suspended THEN 'suspended' ELSE 'admitted' END,
        outcome = NULL,
        due_at = now(), covered_due_at = NULL, redeliver_after = NULL,
        deadline = coalesce($4::timestamptz,
                            now() + make_interval(secs => $5::float8)),
        cancel_requested_at = NULL, cancel_requested_by = NULL,
        parked_reason = NULL, parked_step = NULL, parked_detail = NULL,
        waiting_on = NULL,
        unacknowledged_deliveries = 0, last_unacknowledged_at = NULL,
        redrives = e.redrives + 1,
        event_seq = e.event_seq + 1,
        updated_at = now()
    WHERE e.execution_id = $1 AND e.bucket = fencepost_bucket($1)
    RETURNING e.execution_id, e.status, e.token, e.redrives, e.deadline, e.event_seq
), kept AS (
    INSERT INTO superseded_steps (superseded_id, execution_id, bucket, step_key, status,
                                  value, error, function_name, attempts, token,
                                  recorded_at, redrive)
    SELECT {NEXT_SUPERSEDED_ID}, m.execution_id, fencepost_bucket(m.execution_id),
           m.step_key, m.status, m.value, m.error, m.function_name, m.attempts, m.token,
           m.recorded_at, ex.redrives
    FROM moved m, ex
), eff AS (
    -- The effect's recorded outcome is gone from the record: one
    -- more call with the same idempotency key is allowed.
    UPDATE effects AS f SET status = 'retry', updated_at = now()
    WHERE f.execution_id = $1 AND f.bucket = fencepost_bucket($1)
      AND f.step_key IN (SELECT step_key FROM moved)
), sig AS (
    -- A signal consumed by a superseded step is pending again.
    UPDATE signals AS sg SET consumed_step = NULL, consumed_token = NULL,
                             consumed_at = NULL
    WHERE sg.execution_id = $1 AND sg.bucket = fencepost_bucket($1)
      AND sg.consumed_step IN (SELECT step_key FROM moved)
), superseded AS (
    SELECT coalesce(jsonb_agg(step_key ORDER BY recorded_at, step_key), '[]')
           AS keys
    FROM moved
), ev AS (
    INSERT INTO execution_events (event_id, execution_id, bucket, seq, kind, token, detail)
    SELECT {NEXT_EVENT_ID}, ex.execution_id, fencepost_bucket(ex.execution_id), ex.event_seq,
           'redriven', ex.token,
           jsonb_strip_nulls(jsonb_build_object(
               'by', $3::text, 'reason', $6::text, 'fromStep', $2::text,
               'redrive', ex.redrives, 'deadline', ex.deadline,
               'superseded', superseded.keys))
    FROM ex, superseded
)
SELECT ex.status, ex.redrives, superseded.keys,
       pg_notify('{NOTIFY_CHANNEL}', '') IS NULL AS notified
FROM ex, superseded
""", ("text", "text", "text", "timestamptz", "float8", "text", "text", "timestamptz",
      "timestamptz"),
    (("status", "text"), ("redrives", "integer"), ("keys", "jsonb"), ("notified", "boolean")))


@dataclass(frozen=True)
class Redriven:
    status: str
    redrive: int  # how many times it has been redriven, this one included
    superseded: list[str]  # step keys moved to the superseded history, in recorded order


@dataclass(frozen=True)
class Forked:
    execution_id: str
    status: str
    copied: list[str]  # step keys copied, in recorded order


class Redrives(StoreObject):
    async def redrive(self, execution_id: str, by: str, *, from_step: str | None = None,
                      deadline: datetime | None = None, timeout_seconds: float | None = None,
                      reason: str | None = None, owner: str | None = None,
                      ) -> tuple[RedriveAnswer, Redriven | str | None]:
        """Reopen an ended execution under the same ID. The steps recorded from
        the cut on move to `superseded_steps` and run again; those before it
        replay. The cut is the earliest of: `from_step`, the first failed
        step, the cancel request, and (timed out) the deadline — so the code
        that failed, and any cleanup that ran after a cancel or the deadline,
        runs again, while nothing that completed before it does. A
        `completed` execution needs `from_step` (only that cut applies).
        A superseded effect may be called again with its idempotency key (as
        an operator's `retry` allows); a signal its superseded step consumed
        is pending again. The new deadline is `deadline`, now +
        `timeout_seconds`, or none. `owner` (a trigger token): only its own.
        Returns (answer, Redriven | the status that refused | None)."""
        return await self.db.run_in_transaction(lambda conn: self._redrive(
            conn, execution_id, by, from_step, deadline, timeout_seconds, reason, owner))

    async def _redrive(self, conn: asyncpg.Connection, execution_id: str, by: str,
                       from_step: str | None, deadline: datetime | None,
                       timeout_seconds: float | None, reason: str | None, owner: str | None,
                       ) -> tuple[RedriveAnswer, Redriven | str | None]:
        row = await conn.fetchrow(
            "SELECT status, cancel_requested_at, deadline FROM executions "
            "WHERE execution_id = $1 AND bucket = fencepost_bucket($1) "
            "AND ($2::text IS NULL OR admitted_by = $2) FOR UPDATE",
            execution_id, owner)
        if row is None:
            return "not_found", None
        status = row["status"]
        if status not in REDRIVABLE:
            return "not_ended", status
        if status == "completed" and from_step is None:
            return "completed", status
        if from_step is not None and not await conn.fetchval(
                "SELECT 1 FROM execution_steps "
                "WHERE execution_id = $1 AND bucket = fencepost_bucket($1) AND step_key = $2",
                execution_id, from_step):
            return "step_not_found", None
        buckets = await shard_buckets(self, execution_id, conn)
        [answer] = await _REDRIVE.fetch(
            conn, buckets, execution_id, from_step, by, deadline, timeout_seconds, reason,
            status, row["cancel_requested_at"], row["deadline"])
        await tell_claimers(conn, buckets)
        return "redriven", Redriven(answer["status"], answer["redrives"], list(answer["keys"]))

    async def fork(self, execution_id: str, by: str, *, from_step: str,
                   new_id: str, params: Any = None, timeout_seconds: float | None = None,
                   owner: str | None = None, admitted_by: str | None = None,
                   ) -> tuple[ForkAnswer, Forked | Conflict | None]:
        """Admit `new_id`, a new execution of the source's workflow (its params
        unless `params` is given; its context and code version), with copies
        of the steps the source recorded before `from_step` (values, errors,
        and the effects' request identities) — the rest runs again under the
        new ID, with a deadline `timeout_seconds` from now (None: none). The
        new record names its source (`forked_from`); the source gets a
        `forked` event naming the fork. `owner` (a trigger token): only its
        own source. Returns (answer, Forked | the Conflict of a taken ID | None)."""
        try:
            return await self.db.run_in_transaction(lambda conn: self._fork(
                conn, execution_id, by, from_step, new_id, params, timeout_seconds, owner,
                admitted_by))
        except (ValueError, TypeError, asyncpg.DataError) as exc:
            raise InvalidEvent(str(exc)) from exc

    async def _fork(self, conn: asyncpg.Connection, execution_id: str, by: str, from_step: str,
                    new_id: str, params: Any, timeout_seconds: float | None, owner: str | None,
                    admitted_by: str | None) -> tuple[ForkAnswer, Forked | Conflict | None]:
        source = await conn.fetchrow(
            "SELECT workflow_id FROM executions "
            "WHERE execution_id = $1 AND bucket = fencepost_bucket($1) "
            "AND ($2::text IS NULL OR admitted_by = $2) FOR SHARE",
            execution_id, owner)
        if source is None:
            return "not_found", None
        if not await conn.fetchval(
                "SELECT 1 FROM execution_steps "
                "WHERE execution_id = $1 AND bucket = fencepost_bucket($1) AND step_key = $2",
                execution_id, from_step):
            return "step_not_found", None
        row = await conn.fetchrow(
            f"""
            -- Citus: reads the source's bucket ($1) and writes the fork's ($3): two shards
            WITH src AS (
                SELECT * FROM executions WHERE execution_id = $1 AND bucket = fencepost_bucket($1)
            ), cut AS (
                SELECT recorded_at AS at FROM execution_steps
                WHERE execution_id = $1 AND bucket = fencepost_bucket($1) AND step_key = $2
            ), ins AS (
                -- An ID is never reused: one a retention tombstone holds is taken.
                INSERT INTO executions (execution_id, bucket, workflow_id, params, context,
                                        code_version, admitted_by, status, due_at, deadline,
                                        forked_from, forked_from_step, queue, concurrency_key,
                                        priority, event_seq)
                -- A fork runs under its source's flow control.
                SELECT $3, fencepost_bucket($3), src.workflow_id,
                       coalesce($4::jsonb, src.params), src.context, src.code_version, $6,
                       'admitted', now(), now() + make_interval(secs => $7::float8), $1, $2,
                       src.queue, src.concurrency_key, src.priority, 1
                FROM src
                WHERE NOT EXISTS (SELECT 1 FROM retired_executions
                                  WHERE execution_id = $3 AND bucket = fencepost_bucket($3))
                ON CONFLICT (execution_id, bucket) DO NOTHING
                RETURNING execution_id, status
            ), copied AS (
                INSERT INTO execution_steps (execution_id, bucket, step_key, status, value,
                                             error, function_name, attempts, token,
                                             recorded_at, position)
                SELECT ins.execution_id, fencepost_bucket(ins.execution_id), s.step_key,
                       s.status, s.value, s.error, s.function_name, s.attempts, 0, s.recorded_at,
                       s.position
                FROM execution_steps s, cut, ins
                WHERE s.execution_id = $1 AND s.bucket = fencepost_bucket($1)
                  AND s.recorded_at < cut.at
                RETURNING step_key, recorded_at
            ), eff AS (
                -- Copied effects keep their request identity: a replay never
                -- calls them, and what the remote side saw stays nameable.
                INSERT INTO effects (execution_id, bucket, step_key, idempotency_key,
                                     function_name, status, token, attempts, started_at)
                SELECT ins.execution_id, fencepost_bucket(ins.execution_id), f.step_key,
                       f.idempotency_key, f.function_name, f.status, 0, f.attempts, f.started_at
                FROM effects f, ins
                WHERE f.execution_id = $1 AND f.bucket = fencepost_bucket($1)
                  AND f.step_key IN (SELECT step_key FROM copied)
            ), keys AS (
                SELECT coalesce(jsonb_agg(step_key ORDER BY recorded_at, step_key), '[]') AS keys
                FROM copied
            ), placed AS (
                -- The place of the source's `forked` event, on its row.
                UPDATE executions SET event_seq = event_seq + 1
                WHERE execution_id = $1 AND bucket = fencepost_bucket($1)
                  AND EXISTS (SELECT 1 FROM ins)
                RETURNING event_seq
            ), ev AS (
                INSERT INTO execution_events (execution_id, bucket, seq, kind, token, detail)
                SELECT ins.execution_id, fencepost_bucket(ins.execution_id), 1, 'admitted',
                       NULL::bigint,
                       jsonb_build_object('workflowId', src.workflow_id, 'by', $5::text,
                                          'forkedFrom', $1::text, 'fromStep', $2::text,
                                          'copied', keys.keys)
                FROM ins, keys, src
                UNION ALL
                SELECT $1, fencepost_bucket($1), placed.event_seq, 'forked', NULL,
                       jsonb_build_object('by', $5::text, 'executionId', ins.execution_id,
                                          'fromStep', $2::text)
                FROM ins, placed
            )
            SELECT ins.execution_id, ins.status, keys.keys,
                   pg_notify('{NOTIFY_CHANNEL}', '') AS notified
            FROM ins, keys
            """,
            execution_id, from_step, new_id, params, by, admitted_by, timeout_seconds,
        )
        if row is None:
            holder = await conn.fetchrow(
                "SELECT status, workflow_id FROM executions "
                "WHERE execution_id = $1 AND bucket = fencepost_bucket($1)", new_id)
            if holder is None:  # retired by retention: taken for good
                return "conflict", Conflict(new_id, "retired", None)
            return "conflict", Conflict(new_id, holder["status"], holder["workflow_id"])
        return "forked", Forked(row["execution_id"], row["status"], list(row["keys"]))
