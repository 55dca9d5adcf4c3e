"""Fenced step writes and the evidence a stale holder leaves behind."""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

import asyncpg

from app.store.fencing import INTERRUPT_SQL, rejected
from app.store.handle import StoreObject
from app.store.types import (
    InvalidEvent,
    Lease,
    StepRecord,
    step_record,
)

# The observation, its comparison with the record, and (on a difference) the
# counter and the event, in one statement: the flag can never disagree with
# the counter or the history. Nothing here writes a step or an outcome.
# $1 execution, $2 step key (NULL: an acknowledgement), $3 token, $4 owner,
# $5 value, $6 error, $7 whether a result was observed at all.
_LATE_OBSERVATION = """
WITH cmp AS (
    SELECT CASE
        WHEN NOT $7::boolean THEN NULL
        WHEN $2::text IS NOT NULL THEN (
            SELECT CASE WHEN s.status = 'completed'
                        THEN $6::jsonb IS NOT NULL
                             OR coalesce(s.value, 'null'::jsonb)
                                IS DISTINCT FROM coalesce($5::jsonb, 'null'::jsonb)
                        ELSE $6::jsonb IS NULL
                             OR (s.error ->> 'name') IS DISTINCT FROM ($6::jsonb ->> 'name')
                   END
            FROM execution_steps s WHERE s.execution_id = $1 AND s.step_key = $2)
        WHEN jsonb_typeof($5::jsonb) = 'object'
             AND $5::jsonb ->> 'acknowledge' IN ('completed', 'failed') THEN (
            SELECT CASE WHEN e.status = 'completed'
                        THEN $5::jsonb ->> 'acknowledge' <> 'completed'
                             OR coalesce(e.outcome -> 'result', 'null'::jsonb)
                                IS DISTINCT FROM coalesce($5::jsonb -> 'result', 'null'::jsonb)
                        ELSE $5::jsonb ->> 'acknowledge' <> 'failed'
                             OR (e.outcome -> 'error' ->> 'name')
                                IS DISTINCT FROM ($6::jsonb ->> 'name')
                   END
            FROM executions e
            WHERE e.execution_id = $1 AND e.status IN ('completed', 'failed'))
    END AS conflict
), obs AS (
    INSERT INTO late_observations
        (execution_id, step_key, token, owner, value, error, conflict)
    SELECT $1, $2, $3, $4, $5, $6, conflict FROM cmp
    RETURNING observation_id, conflict
), counted AS (
    UPDATE executions SET integrity_conflicts = integrity_conflicts + 1
    WHERE execution_id = $1 AND (SELECT conflict FROM obs)
    RETURNING 1
), ev AS (
    INSERT INTO execution_events (execution_id, kind, token, detail)
    SELECT $1, 'integrity_conflict', $3,
           jsonb_build_object('stepKey', $2::text, 'observationId', observation_id)
    FROM obs WHERE conflict
)
SELECT conflict FROM obs
"""


# Failed attempts kept per step (and Retry reasons per execution).
ATTEMPT_HISTORY = 20


class Steps(StoreObject):
    async def write_step(
        self,
        lease: Lease,
        step_key: str,
        *,
        value: Any = None,
        error: dict[str, Any] | None = None,
        function_name: str | None = None,
        attempts: int = 1,
        position: int | None = None,
    ) -> StepRecord:
        """Record a step result under the lease, or return the one already
        recorded (idempotent for the current holder). Stale → LeaseLost.

        FOR SHARE on the execution row conflicts with the claim's row lock:
        either this statement locks first, and a claim skips the row until this
        step has committed (so the next holder sees it), or the claim commits
        first and the token check here re-reads the row and fails. Check and
        insert can never be split by a claim.
        """
        status = "failed" if error is not None else "completed"
        try:
            row = await self.db.fetchrow(
                f"""
                WITH fence AS (
                    SELECT execution_id, {INTERRUPT_SQL} FROM executions
                    WHERE execution_id = $1 AND token = $2 AND status = 'running'
                    FOR SHARE
                ), ins AS (
                    INSERT INTO execution_steps
                        (execution_id, step_key, status, value, error, function_name,
                         attempts, token, position)
                    SELECT execution_id, $3, $4, $5, $6, $7, $8, $2, $9 FROM fence
                    ON CONFLICT (execution_id, step_key) DO NOTHING
                    RETURNING step_key, status, value, error, function_name, attempts, token,
                              recorded_at
                ), ev AS (
                    INSERT INTO execution_events (execution_id, kind, token, detail)
                    SELECT $1, 'step_recorded', $2,
                           jsonb_build_object('stepKey', $3::text, 'status', $4::text)
                    FROM ins
                )
                SELECT (SELECT count(*) FROM fence) AS fenced, (SELECT interrupt FROM fence) AS interrupt, ins.*
                FROM (SELECT 1) AS one LEFT JOIN ins ON true
                """,
                lease.execution_id,
                lease.token,
                step_key,
                status,
                value,
                error,
                function_name,
                attempts,
                position,
            )
        except (ValueError, TypeError, asyncpg.DataError) as exc:
            raise InvalidEvent(f"step {step_key!r}: {exc}") from exc
        assert row is not None  # the statement always returns its row
        if not row["fenced"]:
            raise await rejected(self.db, lease, step_key)
        if row["step_key"] is not None:
            return step_record(row, row["interrupt"])
        # Already recorded (by this holder or an earlier one): the recorded
        # value stands and is returned unchanged.
        existing = await self.db.fetchrow(
            """
            SELECT step_key, status, value, error, function_name, attempts, token, recorded_at
            FROM execution_steps WHERE execution_id = $1 AND step_key = $2
            """,
            lease.execution_id,
            step_key,
        )
        assert existing is not None  # recorded: the insert above met it
        return step_record(existing, row["interrupt"])

    async def record_late_observation(
        self,
        lease: Lease,
        step_key: str | None,
        *,
        value: Any = None,
        error: dict[str, Any] | None = None,
        observed: bool | None = None,
    ) -> bool | None:
        """Evidence from a stale holder: appended, never applied to state, and
        compared in the same statement with what was recorded. Returns the
        `conflict` flag: None nothing to compare with, False the same, True
        different (an integrity conflict: the execution's integrity_conflicts
        counter moves and an 'integrity_conflict' event is appended, also in
        the same statement).

        A step observation (`step_key` given) is compared with the recorded
        step of that key: a recorded value with an observed value (JSON
        equality), a recorded failure with an observed error (by error name:
        messages carry times and hosts). An acknowledgement observation
        (`step_key` None, value {"acknowledge": kind, "result": ...}) of kind
        completed/failed is compared the same way with the execution's outcome
        once it is completed/failed; suspensions and policy ends (cancelled,
        timed_out) are not compared.

        `observed`: whether a result was observed at all. None (default): only
        when `value` or `error` is given, so a rejected write that carried no
        result (a start_child, a timer) is not mistaken for a step returning
        None; pass True when None itself was the result.
        """
        if observed is None:
            observed = value is not None or error is not None
        try:
            return cast("bool | None", await self.db.fetchval(
                _LATE_OBSERVATION, lease.execution_id, step_key, lease.token, lease.owner,
                value, error, observed,
            ))
        except (ValueError, TypeError, asyncpg.DataError):
            # Not storable, so not comparable either: kept as evidence of that.
            await self.db.execute(
                _LATE_OBSERVATION, lease.execution_id, step_key, lease.token, lease.owner,
                None, {"name": "UnstorableValue", "message": "the observed value is not valid JSON"},
                False,
            )
            return None

    async def record_timer(
        self,
        lease: Lease,
        step_key: str,
        *,
        delay_seconds: float | None = None,
        until: datetime | None = None,
        position: int | None = None,
    ) -> tuple[datetime, datetime, str | None]:
        """Record a durable timer as a fenced step whose value is the wake time,
        computed from the database clock (`now() + delay`) or given (`until`).
        An already-recorded timer keeps its time. Returns (wake_at, db_now,
        interrupt)."""
        row = await self.db.fetchrow(
            f"""
            WITH fence AS (
                -- Same lock as write_step: no claim between check and insert.
                SELECT execution_id, {INTERRUPT_SQL} FROM executions
                WHERE execution_id = $1 AND token = $2 AND status = 'running'
                FOR SHARE
            ), ins AS (
                INSERT INTO execution_steps
                    (execution_id, step_key, status, value, function_name, token, position)
                SELECT execution_id, $3, 'completed',
                       to_jsonb(coalesce($5::timestamptz, now() + make_interval(secs => $4))),
                       'sleep', $2, $6
                FROM fence
                ON CONFLICT (execution_id, step_key) DO NOTHING
                RETURNING value
            ), ev AS (
                INSERT INTO execution_events (execution_id, kind, token, detail)
                SELECT $1, 'step_recorded', $2,
                       jsonb_build_object('stepKey', $3::text, 'status', 'completed',
                                          'wakeAt', value)
                FROM ins
            )
            SELECT (SELECT count(*) FROM fence) AS fenced, (SELECT interrupt FROM fence) AS interrupt,
                   coalesce((SELECT value FROM ins),
                            (SELECT value FROM execution_steps
                             WHERE execution_id = $1 AND step_key = $3)) AS value,
                   now() AS db_now
            """,
            lease.execution_id,
            lease.token,
            step_key,
            float(delay_seconds or 0.0),
            until,
            position,
        )
        assert row is not None  # the statement always returns its row
        if not row["fenced"]:
            raise await rejected(self.db, lease, step_key)
        if row["value"] is None:  # recorded concurrently after this snapshot
            existing = await self.db.fetchval(
                "SELECT value FROM execution_steps WHERE execution_id = $1 AND step_key = $2",
                lease.execution_id,
                step_key,
            )
            assert existing is not None  # recorded: the insert above met it
            return datetime.fromisoformat(existing), row["db_now"], row["interrupt"]
        return datetime.fromisoformat(row["value"]), row["db_now"], row["interrupt"]

    async def record_attempt(self, lease: Lease, step_key: str, attempt: int,
                             error: dict[str, Any]) -> None:
        """Keep one failed attempt of a step (fenced, like the step write),
        with an `attempt_failed` event; the step's history is trimmed to its
        last ATTEMPT_HISTORY attempts in the same statement."""
        try:
            row = await self.db.fetchrow(
                """
                WITH fence AS (
                    SELECT execution_id FROM executions
                    WHERE execution_id = $1 AND token = $2 AND status = 'running'
                    FOR SHARE
                ), ins AS (
                    INSERT INTO attempt_history (execution_id, step_key, attempt, token, error)
                    SELECT execution_id, $3, $4, $2, $5 FROM fence
                    RETURNING attempt_id
                ), trim AS (
                    DELETE FROM attempt_history
                    WHERE execution_id = $1 AND step_key = $3 AND EXISTS (SELECT 1 FROM ins)
                      AND attempt_id <= (
                          SELECT attempt_id FROM attempt_history
                          WHERE execution_id = $1 AND step_key = $3
                          ORDER BY attempt_id DESC OFFSET $6 - 1 LIMIT 1)
                ), ev AS (
                    INSERT INTO execution_events (execution_id, kind, token, detail)
                    SELECT $1, 'attempt_failed', $2,
                           jsonb_build_object('stepKey', $3::text, 'attempt', $4::int,
                                              'error', $5::jsonb)
                    FROM ins
                )
                SELECT (SELECT count(*) FROM fence) AS fenced
                """,
                lease.execution_id,
                lease.token,
                step_key,
                attempt,
                error,
                ATTEMPT_HISTORY,
            )
        except (ValueError, TypeError, asyncpg.DataError) as exc:
            raise InvalidEvent(f"step {step_key!r}: {exc}") from exc
        assert row is not None  # the statement always returns its row
        if not row["fenced"]:
            raise await rejected(self.db, lease, step_key)

