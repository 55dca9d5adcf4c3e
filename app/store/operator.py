"""What an operator (or a client) decides from outside: cancel, resolve an
outcome-unknown step, resume a poison-parked execution. Each decision and
who made it is written to the history in the same statement."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import asyncpg

from app.metrics import METRICS
from app.store.compose import ENDED_NOTICE, WAKE_PARENTS
from app.store.types import _TERMINAL_SQL, NOTIFY_CHANNEL, InvalidEvent

CancelAnswer = Literal["cancelled", "requested", "terminal", "not_found"]
ResolveAnswer = Literal["resolved", "not_found", "step_not_found", "not_outcome_unknown"]
ResumeAnswer = Literal["resumed", "not_found", "not_parked"]


class OperatorStatements:
    pool: asyncpg.Pool

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
        row = await self.pool.run_in_transaction(
            lambda conn: self._cancel_tree(conn, execution_id, by, terminate))
        if row is not None:
            METRICS.ended(["cancelled"] * row["cancelled_now"])
            return ("cancelled" if row["status"] == "cancelled" else "requested"), row["status"]
        status = await self.pool.fetchval(
            "SELECT status FROM executions WHERE execution_id = $1", execution_id
        )
        return ("not_found", None) if status is None else ("terminal", status)

    async def _cancel_tree(self, conn: asyncpg.Connection, execution_id: str, by: str,
                           terminate: bool):
        # Who keeps running after the request ($3: terminate, nobody):
        # a holder, until its window closes; an unheld execution that has run
        # before (token > 0) and whose cleanup window is open, made due now.
        held = "(NOT $3 AND e.status = 'running' AND e.lease_expires_at > now())"
        cleans = ("(NOT $3 AND e.status IN ('admitted', 'suspended') AND e.token > 0"
                  " AND fencepost_cleanup_ends(coalesce(e.cancel_requested_at, now()),"
                  " e.deadline, e.cleanup_seconds) > now())")
        stays = f"({held} OR {cleans})"
        # Lock the root first, then find the descendants in a new
        # snapshot: a child whose start is waiting on this row either
        # committed before (and is found) or sees the request and
        # withdraws (start_child checks the parent after inserting).
        await conn.execute(
            "SELECT 1 FROM executions WHERE execution_id = $1 FOR UPDATE", execution_id
        )
        return await conn.fetchrow(
            f"""
            WITH RECURSIVE tree AS (
                SELECT execution_id FROM executions
                WHERE execution_id = $1 AND status NOT IN {_TERMINAL_SQL}
                UNION
                SELECT x.execution_id FROM executions x JOIN tree t
                  ON x.parent_execution_id = t.execution_id
                WHERE x.status NOT IN {_TERMINAL_SQL}
            ), c AS (
                UPDATE executions e
                SET cancel_requested_at = coalesce(e.cancel_requested_at, now()),
                    cancel_requested_by = coalesce(e.cancel_requested_by, $2),
                    status = CASE WHEN {stays} THEN e.status ELSE 'cancelled' END,
                    outcome = CASE WHEN {stays} THEN NULL
                                   ELSE jsonb_build_object('error', jsonb_build_object(
                                       'name', 'Cancelled',
                                       'message', CASE WHEN $3 THEN 'terminated' ELSE 'cancelled'
                                                  END || ' at the request of '
                                                  || coalesce(e.cancel_requested_by, $2),
                                       'requestedAt', coalesce(e.cancel_requested_at, now())))
                              END,
                    lease_owner = CASE WHEN {held} THEN e.lease_owner END,
                    lease_expires_at = CASE WHEN {held} THEN e.lease_expires_at END,
                    -- The cleanup delivery is due now, past any redelivery delay.
                    due_at = CASE WHEN {held} THEN e.due_at WHEN {cleans} THEN now() END,
                    covered_due_at = CASE WHEN {held} THEN e.covered_due_at END,
                    parked_reason = NULL, parked_step = NULL, redeliver_after = NULL,
                    updated_at = now()
                FROM tree
                WHERE e.execution_id = tree.execution_id AND e.status NOT IN {_TERMINAL_SQL}
                RETURNING e.execution_id, e.token, e.status, e.parent_execution_id, e.due_at
            ), {WAKE_PARENTS.format(ended="c")}, ev AS (
                INSERT INTO execution_events (execution_id, kind, token, detail)
                SELECT execution_id, 'cancel_requested', token,
                       jsonb_strip_nulls(jsonb_build_object(
                           'by', $2::text,
                           'terminate', CASE WHEN $3 THEN true END,
                           'parentExecutionId', CASE WHEN execution_id <> $1
                                                     THEN parent_execution_id END))
                FROM c
                UNION ALL
                SELECT execution_id, 'cancelled', token, jsonb_build_object('by', $2::text)
                FROM c WHERE status = 'cancelled'
            )
            SELECT status, {ENDED_NOTICE.format(ended="c")},
                   (SELECT count(pg_notify('{NOTIFY_CHANNEL}', '')) FROM parent_wake) AS woke,
                   (SELECT count(pg_notify('{NOTIFY_CHANNEL}', '')) FROM c
                    WHERE due_at <= now()) AS due,
                   (SELECT count(*) FROM c WHERE status = 'cancelled') AS cancelled_now
            FROM c WHERE execution_id = $1
            """,
            execution_id,
            by,
            terminate,
        )

    async def resolve_step(
        self,
        execution_id: str,
        step_key: str,
        action: Literal["retry", "succeed", "fail"],
        *,
        by: str,
        result: Any = None,
        error: dict | None = None,
        db: Any = None,
    ) -> tuple[ResolveAnswer, str | None]:
        """Settle an outcome-unknown step and make the execution due now.
        succeed/fail record the step (as the operator says it ended); retry
        lets the next delivery call out once more with the same request
        identity. Returns (answer, current status). `db`: a connection whose
        transaction it joins (default: the pool)."""
        db = db or self.pool
        try:
            row = await db.fetchrow(
                f"""
                WITH target AS (
                    SELECT e.execution_id, e.token, f.function_name
                    FROM executions e JOIN effects f
                      ON f.execution_id = e.execution_id AND f.step_key = $2
                    WHERE e.execution_id = $1 AND e.status = 'parked'
                      AND e.parked_reason = 'outcome_unknown' AND e.parked_step = $2
                      AND f.status = 'outcome_unknown'
                    FOR UPDATE OF e
                ), step AS (
                    INSERT INTO execution_steps
                        (execution_id, step_key, status, value, error, function_name, token)
                    SELECT execution_id, $2, CASE WHEN $3 = 'succeed' THEN 'completed'
                                                  ELSE 'failed' END,
                           CASE WHEN $3 = 'succeed' THEN $4::jsonb END,
                           CASE WHEN $3 = 'fail' THEN $5::jsonb END, function_name, token
                    FROM target WHERE $3 IN ('succeed', 'fail')
                ), eff AS (
                    UPDATE effects SET status = 'retry', updated_at = now()
                    WHERE execution_id = (SELECT execution_id FROM target) AND step_key = $2
                      AND $3 = 'retry'
                ), effdone AS (
                    -- The recorded step is now the receipt; the attempt is settled.
                    DELETE FROM effects
                    WHERE execution_id = (SELECT execution_id FROM target) AND step_key = $2
                      AND $3 IN ('succeed', 'fail')
                ), e AS (
                    UPDATE executions x
                    SET status = CASE WHEN x.ever_suspended THEN 'suspended' ELSE 'admitted' END,
                        parked_reason = NULL, parked_step = NULL,
                        due_at = now(), updated_at = now()
                    FROM target t WHERE x.execution_id = t.execution_id
                    RETURNING x.execution_id, x.token, x.status
                ), ev AS (
                    INSERT INTO execution_events (execution_id, kind, token, detail)
                    -- The decided value is part of the decision's record: an explicit
                    -- null result stays a key with null, retry records neither.
                    SELECT execution_id, 'resolved', token,
                           jsonb_build_object('stepKey', $2::text, 'action', $3::text,
                                              'by', $6::text)
                           || CASE $3 WHEN 'succeed' THEN jsonb_build_object('result', $4::jsonb)
                                      WHEN 'fail' THEN jsonb_build_object('error', $5::jsonb)
                                      ELSE '{{}}'::jsonb END
                    FROM e
                )
                SELECT status, pg_notify('{NOTIFY_CHANNEL}', '') FROM e
                """,
                execution_id,
                step_key,
                action,
                result,
                error,
                by,
            )
        except (ValueError, TypeError, asyncpg.DataError) as exc:
            raise InvalidEvent(str(exc)) from exc
        if row is not None:
            return "resolved", row["status"]
        return await self._why_not_resolved(db, execution_id, step_key)

    async def _why_not_resolved(self, db: Any, execution_id: str, step_key: str
                                ) -> tuple[ResolveAnswer, str | None]:
        """Why a resolution changed nothing: no such execution, a step key the
        execution never recorded nor called out for (404), or a step that is
        not waiting for a decision (409). Read-only; the decision already
        failed atomically, so this only chooses the answer."""
        row = await db.fetchrow(
            """
            SELECT e.status,
                   EXISTS (SELECT 1 FROM execution_steps s
                           WHERE s.execution_id = e.execution_id AND s.step_key = $2)
                   OR EXISTS (SELECT 1 FROM effects f
                              WHERE f.execution_id = e.execution_id AND f.step_key = $2)
                   OR e.parked_step = $2 AS known
            FROM executions e WHERE e.execution_id = $1
            """,
            execution_id, step_key,
        )
        if row is None:
            return "not_found", None
        if not row["known"]:
            return "step_not_found", row["status"]
        return "not_outcome_unknown", row["status"]

    async def deadline_passed(self, deadline: datetime) -> tuple[bool, datetime]:
        """(deadline <= now, now) by the database clock, the clock every
        deadline is judged by. Admission asks right before it admits: a
        deadline that passes between this read and the insert is one the
        execution reaches at once after admission, which is where it would
        end anyway (timed_out); no request with a past deadline is stored."""
        row = await self.pool.fetchrow(
            "SELECT $1::timestamptz <= now() AS passed, now() AS now", deadline)
        return row["passed"], row["now"]

    async def resume(self, execution_id: str, by: str, *,
                     db: Any = None) -> tuple[ResumeAnswer, str | None]:
        """Make a poison-parked execution due again; its counter is kept, so
        one more unacknowledged delivery parks it again. `db`: a connection
        whose transaction it joins (default: the pool)."""
        db = db or self.pool
        row = await db.fetchrow(
            f"""
            WITH r AS (
                UPDATE executions
                SET status = CASE WHEN ever_suspended THEN 'suspended' ELSE 'admitted' END,
                    parked_reason = NULL, parked_step = NULL, redeliver_after = NULL,
                    due_at = now(), updated_at = now()
                WHERE execution_id = $1 AND status = 'parked' AND parked_reason = 'poison'
                RETURNING execution_id, token, status, unacknowledged_deliveries
            ), ev AS (
                INSERT INTO execution_events (execution_id, kind, token, detail)
                SELECT execution_id, 'resumed', token,
                       jsonb_build_object('by', $2::text,
                                          'unacknowledgedDeliveries', unacknowledged_deliveries)
                FROM r
            )
            SELECT status, pg_notify('{NOTIFY_CHANNEL}', '') FROM r
            """,
            execution_id,
            by,
        )
        if row is not None:
            return "resumed", row["status"]
        status = await db.fetchval(
            "SELECT status FROM executions WHERE execution_id = $1", execution_id
        )
        return ("not_found", None) if status is None else ("not_parked", status)

    async def step_details(self, execution_id: str, *, include_values: bool) -> list[dict]:
        """Recorded steps and effect attempts in doubt, oldest first. Values
        are loaded only when asked; otherwise their size is reported."""
        rows = await self.pool.fetch(
            """
            SELECT s.step_key, s.status, s.attempts, s.token, s.function_name,
                   s.recorded_at, f0.started_at, f0.idempotency_key,
                   CASE WHEN $2 THEN s.value END AS value,
                   CASE WHEN $2 THEN s.error END AS error,
                   pg_column_size(s.value) AS value_bytes, s.error ->> 'name' AS error_name
            FROM execution_steps s
            LEFT JOIN effects f0 ON f0.execution_id = s.execution_id AND f0.step_key = s.step_key
            WHERE s.execution_id = $1
            UNION ALL
            SELECT f.step_key, f.status, f.attempts, f.token, f.function_name,
                   NULL, f.started_at, f.idempotency_key, NULL, NULL, NULL, NULL
            FROM effects f
            WHERE f.execution_id = $1
              AND NOT EXISTS (SELECT 1 FROM execution_steps s
                              WHERE s.execution_id = f.execution_id AND s.step_key = f.step_key)
            ORDER BY recorded_at NULLS LAST, started_at
            """,
            execution_id,
            include_values,
        )
        return [dict(r) for r in rows]

    async def events_page(self, execution_id: str, *, after: int, limit: int) -> list[dict]:
        rows = await self.pool.fetch(
            """
            SELECT event_id, at, kind, token, detail FROM execution_events
            WHERE execution_id = $1 AND event_id > $2 ORDER BY event_id LIMIT $3
            """,
            execution_id,
            after,
            limit,
        )
        return [dict(r) for r in rows]

    # A trigger-only token's reads carry the owner predicate in the one
    # statement that reads (`$owner IS NULL OR admitted_by = $owner`): a row
    # admitted by another token while the request was on its way is never
    # shown, and a foreign execution reads exactly like a missing one (None).

    async def execution_events_page(self, execution_id: str, *, after: int, limit: int,
                                    owner: str | None = None) -> list[dict] | None:
        """Events after `after`, oldest first; None when the execution does
        not exist or (with `owner`) was admitted by another token."""
        rows = await self.pool.fetch(
            """
            SELECT ev.event_id, ev.at, ev.kind, ev.token, ev.detail
            FROM (SELECT execution_id FROM executions
                  WHERE execution_id = $1 AND ($4::text IS NULL OR admitted_by = $4)) e
            LEFT JOIN LATERAL (
                SELECT event_id, at, kind, token, detail FROM execution_events
                WHERE execution_id = e.execution_id AND event_id > $2
                ORDER BY event_id LIMIT $3
            ) ev ON true
            """,
            execution_id, after, limit, owner,
        )
        if not rows:
            return None
        return [dict(r) for r in rows if r["event_id"] is not None]

    async def execution_steps_page(
        self, execution_id: str, *, include_values: bool, limit: int,
        after: tuple[int, datetime, str] | None = None, owner: str | None = None,
    ) -> list[dict] | None:
        """Recorded steps (by recorded_at), then effect attempts in doubt (by
        started_at), then steps a redrive superseded (status 'superseded', by
        their recorded_at), keyset-paginated on (group, time, step key);
        `after` is the last row's `position`. None when the execution does not
        exist or (with `owner`) was admitted by another token."""
        group, at, key = after if after is not None else (None, None, None)
        rows = await self.pool.fetch(
            """
            SELECT x.*, a.failed_attempts FROM (SELECT execution_id FROM executions
                             WHERE execution_id = $1
                               AND ($7::text IS NULL OR admitted_by = $7)) e
            LEFT JOIN LATERAL (
                SELECT * FROM (
                    -- A recorded effect keeps its request identity and start.
                    SELECT 0 AS grp, s.recorded_at AS sort_at, s.step_key, s.status,
                           s.attempts, s.token, s.function_name, s.recorded_at,
                           f0.started_at, f0.idempotency_key,
                           CASE WHEN $2 THEN s.value END AS value,
                           CASE WHEN $2 THEN s.error END AS error,
                           pg_column_size(s.value) AS value_bytes,
                           s.error ->> 'name' AS error_name,
                           NULL::timestamptz AS superseded_at, NULL::int AS redrive
                    FROM execution_steps s
                    LEFT JOIN effects f0
                           ON f0.execution_id = s.execution_id AND f0.step_key = s.step_key
                    WHERE s.execution_id = e.execution_id
                    UNION ALL
                    SELECT 1, f.started_at, f.step_key, f.status, f.attempts, f.token,
                           f.function_name, NULL, f.started_at, f.idempotency_key, NULL, NULL,
                           NULL, NULL, NULL, NULL
                    FROM effects f
                    WHERE f.execution_id = e.execution_id
                      AND NOT EXISTS (SELECT 1 FROM execution_steps s
                                      WHERE s.execution_id = f.execution_id
                                        AND s.step_key = f.step_key)
                    UNION ALL
                    -- Kept as they were when a redrive took them out of the record.
                    SELECT 2, p.recorded_at, p.step_key, 'superseded', p.attempts, p.token,
                           p.function_name, p.recorded_at, f2.started_at, f2.idempotency_key,
                           CASE WHEN $2 THEN p.value END, CASE WHEN $2 THEN p.error END,
                           pg_column_size(p.value), p.error ->> 'name', p.superseded_at,
                           p.redrive
                    FROM superseded_steps p
                    -- An effect's request identity stays the same across a redrive.
                    LEFT JOIN effects f2
                           ON f2.execution_id = p.execution_id AND f2.step_key = p.step_key
                    WHERE p.execution_id = e.execution_id
                ) u
                WHERE $4::int IS NULL
                   OR (u.grp, u.sort_at, u.step_key) > ($4::int, $5::timestamptz, $6::text)
                ORDER BY u.grp, u.sort_at, u.step_key
                LIMIT $3
            ) x ON true
            -- The step's failed attempts (the last 20 kept), oldest first.
            LEFT JOIN LATERAL (
                SELECT jsonb_agg(jsonb_build_object(
                           'attempt', h.attempt, 'at', h.at, 'name', h.error ->> 'name',
                           'message', h.error ->> 'message') ORDER BY h.attempt_id)
                       AS failed_attempts
                FROM attempt_history h
                WHERE h.execution_id = $1 AND h.step_key = x.step_key
            ) a ON true
            """,
            execution_id, include_values, limit, group, at, key, owner,
        )
        if not rows:
            return None
        return [dict(r) for r in rows if r["step_key"] is not None]

    async def execution_late_observations_page(
        self, execution_id: str, *, after: int, limit: int, owner: str | None = None,
    ) -> list[dict] | None:
        """Late observations after `after` (an observation ID), oldest first;
        None when the execution does not exist or (with `owner`) was admitted
        by another token."""
        rows = await self.pool.fetch(
            """
            SELECT o.observation_id, o.step_key, o.token, o.owner, o.value, o.error,
                   o.observed_at, o.conflict
            FROM (SELECT execution_id FROM executions
                  WHERE execution_id = $1 AND ($4::text IS NULL OR admitted_by = $4)) e
            LEFT JOIN LATERAL (
                SELECT * FROM late_observations
                WHERE execution_id = e.execution_id AND observation_id > $2
                ORDER BY observation_id LIMIT $3
            ) o ON true
            """,
            execution_id, after, limit, owner,
        )
        if not rows:
            return None
        return [dict(r) for r in rows if r["observation_id"] is not None]

    async def exists(self, execution_id: str) -> bool:
        return bool(
            await self.pool.fetchval(
                "SELECT true FROM executions WHERE execution_id = $1", execution_id
            )
        )

    async def live_workflow_ids(self, stale_after_seconds: float) -> set[str]:
        """Workflows some live worker advertises (for blockedBy: no-worker)."""
        rows = await self.pool.fetch(
            """
            SELECT DISTINCT jsonb_array_elements_text(workflows) AS workflow_id FROM workers
            WHERE stopped_at IS NULL AND heartbeat_at > now() - make_interval(secs => $1)
            """,
            float(stale_after_seconds),
        )
        return {r["workflow_id"] for r in rows}


    async def admitted_by(self, execution_id: str) -> tuple[bool, str | None]:
        """(exists, the token ID that admitted it)."""
        row = await self.pool.fetchrow(
            "SELECT admitted_by FROM executions WHERE execution_id = $1", execution_id
        )
        return (row is not None), (row["admitted_by"] if row is not None else None)
