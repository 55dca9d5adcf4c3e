"""Admission, reads and wakes: the unfenced statements."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import asyncpg

from app.store.types import (
    _TERMINAL_SQL,
    NOTIFY_CHANNEL,
    Admitted,
    Conflict,
    InvalidEvent,
    StepRecord,
    WakeAnswer,
    _encode_cursor,
    _step,
    decode_cursor,
    record_columns,
)


class AdmissionStatements:
    pool: asyncpg.Pool
    max_unacknowledged: int
    redelivery_base: float
    redelivery_cap: float

    # ------------------------------------------------------------------ admission

    async def admit(
        self,
        *,
        workflow_id: str,
        params: Any,
        context: dict | None = None,
        execution_id: str | None = None,
        deadline: datetime | None = None,
        timeout_seconds: float | None = None,
        code_version: str | None = None,
        admitted_by: str | None = None,
    ) -> Admitted | Conflict:
        """Record the execution and its first wake (due now) in one statement,
        or report the record that already holds the ID. IDs are never reused.
        The deadline is `deadline`, else admission time + `timeout_seconds`
        (database clock), else none."""
        execution_id = execution_id or str(uuid.uuid4())
        for _ in range(3):
            try:
                row = await self.pool.fetchrow(
                    f"""
                    WITH ins AS (
                        INSERT INTO executions
                            (execution_id, workflow_id, params, context, status, due_at,
                             deadline, code_version, admitted_by)
                        -- Python None is SQL NULL on the wire; as params it means JSON null.
                        SELECT $1, $2, coalesce($3, 'null'::jsonb), $4, 'admitted', now(),
                               coalesce($5, now() + make_interval(secs => $7::float8)), $6, $8
                        -- IDs are never reused: not a retired one, and not one whose
                        -- row this statement sees. (A row being deleted by retention
                        -- is still seen: the insert must not wait for that delete
                        -- and then take the ID its tombstone is retiring.)
                        WHERE NOT EXISTS (SELECT 1 FROM retired_executions
                                          WHERE execution_id = $1)
                          AND NOT EXISTS (SELECT 1 FROM executions WHERE execution_id = $1)
                        ON CONFLICT (execution_id) DO NOTHING
                        RETURNING execution_id, status
                    ), ev AS (
                        INSERT INTO execution_events (execution_id, kind, detail)
                        SELECT execution_id, 'admitted', jsonb_build_object('workflowId', $2::text)
                        FROM ins
                    )
                    -- NOTIFY is delivered on commit, so idle workers start at once.
                    SELECT execution_id, status, pg_notify('{NOTIFY_CHANNEL}', '') FROM ins
                    """,
                    execution_id,
                    workflow_id,
                    params,
                    context if context is not None else {},
                    deadline,
                    code_version,
                    timeout_seconds,
                    admitted_by,
                )
            except (ValueError, TypeError, asyncpg.DataError) as exc:
                # NaN/Infinity (the encoder refuses them), \u0000 and lone
                # surrogates (jsonb refuses them): nothing was stored.
                raise InvalidEvent(str(exc)) from exc
            if row is not None:
                return Admitted(row["execution_id"], row["status"])
            holder = await self._id_holder(execution_id)
            if holder is not None:
                return holder
            # Seen, then deleted before this read without a tombstone: again.
        raise RuntimeError(f"admission of {execution_id!r} found the ID taken and then free, "
                           "three times")

    async def _id_holder(self, execution_id: str) -> Conflict | None:
        """Who holds an ID admission refused: the execution, or its tombstone
        (status 'retired': deleted by retention, never to be reused)."""
        row = await self.pool.fetchrow(
            """
            SELECT execution_id, status, workflow_id FROM executions WHERE execution_id = $1
            UNION ALL
            SELECT execution_id, 'retired', workflow_id FROM retired_executions
            WHERE execution_id = $1
            LIMIT 1
            """,
            execution_id,
        )
        if row is None:
            return None
        return Conflict(row["execution_id"], row["status"], row["workflow_id"])

    # ---------------------------------------------------------------------- reads

    async def get(self, execution_id: str) -> dict | None:
        row = await self.pool.fetchrow(
            f"SELECT {record_columns(self.max_unacknowledged)} FROM executions "
            "WHERE execution_id = $3",
            self.redelivery_base,
            self.redelivery_cap,
            execution_id,
        )
        return dict(row) if row is not None else None

    async def list(
        self,
        *,
        status: str | None = None,
        workflow_id: str | None = None,
        min_unacknowledged_deliveries: int | None = None,
        cursor: str | None = None,
        limit: int = 50,
        admitted_by: str | None = None,
        parent_execution_id: str | None = None,
    ) -> tuple[list[dict], str | None]:
        """Newest first, keyset-paginated on (admitted_at, execution_id).
        Filters apply to the healed view, as `get` reports it."""
        after_at, after_id = decode_cursor(cursor) if cursor else (None, None)
        rows = await self.pool.fetch(
            f"""
            SELECT * FROM (SELECT {record_columns(self.max_unacknowledged)} FROM executions
                           WHERE ($4::text IS NULL OR workflow_id = $4)
                             AND ($9::text IS NULL OR admitted_by = $9)
                             AND ($10::text IS NULL OR parent_execution_id = $10)
                             AND ($6::timestamptz IS NULL
                                  OR (admitted_at, execution_id) < ($6, $7::text))) r
            WHERE ($3::text IS NULL OR r.status = $3)
              AND ($5::int IS NULL OR r.unacknowledged_deliveries >= $5)
            ORDER BY admitted_at DESC, execution_id DESC
            LIMIT $8
            """,
            self.redelivery_base,
            self.redelivery_cap,
            status,
            workflow_id,
            min_unacknowledged_deliveries,
            after_at,
            after_id,
            limit + 1,
            admitted_by,
            parent_execution_id,
        )
        page = [dict(r) for r in rows[:limit]]
        next_cursor = None
        if len(rows) > limit:
            last = page[-1]
            next_cursor = _encode_cursor(last["admitted_at"], last["execution_id"])
        return page, next_cursor

    async def steps(self, execution_ids: list[str]) -> dict[str, dict[str, StepRecord]]:
        """Recorded steps of several executions in one round trip."""
        rows = await self.pool.fetch(
            """
            SELECT execution_id, step_key, status, value, error, function_name, attempts,
                   token, recorded_at
            FROM execution_steps WHERE execution_id = ANY($1::text[])
            """,
            execution_ids,
        )
        out: dict[str, dict[str, StepRecord]] = {eid: {} for eid in execution_ids}
        for row in rows:
            out[row["execution_id"]][row["step_key"]] = _step(row)
        return out

    async def events(self, execution_id: str) -> list[dict]:
        rows = await self.pool.fetch(
            """
            SELECT event_id, at, kind, token, detail FROM execution_events
            WHERE execution_id = $1 ORDER BY event_id
            """,
            execution_id,
        )
        return [dict(r) for r in rows]

    async def late_observations(self, execution_id: str) -> list[dict]:
        rows = await self.pool.fetch(
            """
            SELECT observation_id, step_key, token, owner, value, error, observed_at, conflict
            FROM late_observations WHERE execution_id = $1 ORDER BY observation_id
            """,
            execution_id,
        )
        return [dict(r) for r in rows]

    # ---------------------------------------------------------------------- wakes

    async def request_wake(self, execution_id: str, at: datetime | None = None) -> WakeAnswer:
        """Unfenced: an extra wake costs at most one extra delivery. Pending
        wakes merge to the earliest; during a delivery they stay apart from the
        wakes the claim covers (due_at vs covered_due_at)."""
        row = await self.pool.fetchrow(
            f"""
            WITH w AS (
                UPDATE executions
                SET due_at = least(due_at, coalesce($2::timestamptz, now())), updated_at = now()
                WHERE execution_id = $1 AND status NOT IN {_TERMINAL_SQL}
                RETURNING execution_id, due_at
            ), ev AS (
                INSERT INTO execution_events (execution_id, kind, detail)
                SELECT execution_id, 'wake_requested',
                       jsonb_build_object('at', coalesce($2::timestamptz, now()))
                FROM w
            )
            SELECT execution_id,
                   CASE WHEN due_at <= now() THEN pg_notify('{NOTIFY_CHANNEL}', '') END
            FROM w
            """,
            execution_id,
            at,
        )
        if row is not None:
            return "requested"
        exists = await self.pool.fetchval(
            "SELECT true FROM executions WHERE execution_id = $1", execution_id
        )
        return "ignored" if exists else "not_found"
