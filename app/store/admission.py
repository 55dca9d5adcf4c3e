"""Admission: an execution and its first wake recorded in one statement, under
an ID that is never reused."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import asyncpg

from app.store.handle import StoreObject
from app.store.types import NOTIFY_CHANNEL, Admitted, Conflict, InvalidEvent


@dataclass(frozen=True)
class Existing:
    """Admission with ifExists=return found the ID held by an execution of the
    same workflow with equal params: the very same admission, made before."""

    execution_id: str
    status: str


class Admissions(StoreObject):
    async def admit(
        self,
        *,
        workflow_id: str,
        params: Any,
        context: dict[str, Any] | None = None,
        execution_id: str | None = None,
        deadline: datetime | None = None,
        timeout_seconds: float | None = None,
        code_version: str | None = None,
        admitted_by: str | None = None,
        if_exists: Literal["error", "return"] = "error",
        traceparent: str | None = None,
        request_id: str | None = None,
        queue: str = "default",
        concurrency_key: str | None = None,
        priority: int = 0,
        start_at: datetime | None = None,
        delay_seconds: float | None = None,
    ) -> Admitted | Conflict | Existing:
        """Record the execution and its first wake (due now) in one statement,
        or report the record that already holds the ID. IDs are never reused.
        The deadline is `deadline`, else admission time + `timeout_seconds`
        (database clock), else none. With if_exists="return", an ID held by
        an execution of the same workflow with equal params is `Existing`.
        Flow control: the execution is on `queue` (created, unlimited, if no
        one declared it), counted under `concurrency_key`, ordered by
        `priority` among the queue's due executions, and first due at
        `start_at`, else `delay_seconds` after admission, else now."""
        execution_id = execution_id or str(uuid.uuid4())
        for _ in range(3):
            try:
                row = await self.db.fetchrow(
                    f"""
                    WITH ins AS (
                        INSERT INTO executions
                            (execution_id, workflow_id, params, context, status, due_at,
                             deadline, code_version, admitted_by, traceparent, queue,
                             concurrency_key, priority)
                        -- Python None is SQL NULL on the wire; as params it means JSON null.
                        SELECT $1, $2, coalesce($3, 'null'::jsonb), $4, 'admitted',
                               greatest(now(), coalesce($14::timestamptz, now()
                                   + make_interval(secs => coalesce($15::float8, 0)))),
                               coalesce($5, now() + make_interval(secs => $7::float8)), $6, $8,
                               $9, $11, $12, $13
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
                        SELECT execution_id, 'admitted',
                               jsonb_strip_nulls(jsonb_build_object('workflowId', $2::text,
                                                                    'requestId', $10::text))
                        FROM ins
                    ), new_queue AS (
                        -- Claims read the queues table: every execution's queue is in it.
                        INSERT INTO queues (name) SELECT $11 FROM ins
                        WHERE NOT EXISTS (SELECT 1 FROM queues WHERE name = $11)
                        ON CONFLICT DO NOTHING
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
                    traceparent,
                    request_id,
                    queue,
                    concurrency_key,
                    priority,
                    start_at,
                    delay_seconds,
                )
            except (ValueError, TypeError, asyncpg.DataError) as exc:
                # NaN/Infinity (the encoder refuses them), \u0000 and lone
                # surrogates (jsonb refuses them): nothing was stored.
                raise InvalidEvent(str(exc)) from exc
            if row is not None:
                return Admitted(row["execution_id"], row["status"])
            holder = await self._id_holder(execution_id, workflow_id, params)
            if isinstance(holder, Existing) and if_exists == "error":
                return Conflict(holder.execution_id, holder.status, workflow_id)
            if holder is not None:
                return holder
            # Seen, then deleted before this read without a tombstone: again.
        raise RuntimeError(f"admission of {execution_id!r} found the ID taken and then free, "
                           "three times")

    async def _id_holder(self, execution_id: str, workflow_id: str,
                         params: Any) -> Conflict | Existing | None:
        """Who holds an ID admission refused: the execution (`Existing` when
        it has this workflow and JSON-equal params), or its tombstone (status
        'retired': deleted by retention, never to be reused). Workflow and
        params are never updated, so comparing after the refusal sees what
        the refusing statement saw."""
        row = await self.db.fetchrow(
            """
            SELECT execution_id, status, workflow_id,
                   workflow_id = $2 AND params = coalesce($3::jsonb, 'null'::jsonb) AS same
            FROM executions WHERE execution_id = $1
            UNION ALL
            SELECT execution_id, 'retired', workflow_id, false FROM retired_executions
            WHERE execution_id = $1
            LIMIT 1
            """,
            execution_id,
            workflow_id,
            params,
        )
        if row is None:
            return None
        if row["same"]:
            return Existing(row["execution_id"], row["status"])
        return Conflict(row["execution_id"], row["status"], row["workflow_id"])

    # ---------------------------------------------------------------------- reads

    # ---------------------------------------------------------------------- wakes
