"""Admission, reads and wakes: the unfenced statements."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import asyncpg

from app.blocked import reason_sql
from app.schema import TERMINAL_STATUSES
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


@dataclass(frozen=True)
class Existing:
    """Admission with ifExists=return found the ID held by an execution of the
    same workflow with equal params: the very same admission, made before."""

    execution_id: str
    status: str


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
        if_exists: Literal["error", "return"] = "error",
        traceparent: str | None = None,
        request_id: str | None = None,
    ) -> Admitted | Conflict | Existing:
        """Record the execution and its first wake (due now) in one statement,
        or report the record that already holds the ID. IDs are never reused.
        The deadline is `deadline`, else admission time + `timeout_seconds`
        (database clock), else none. With if_exists="return", an ID held by
        an execution of the same workflow with equal params is `Existing`."""
        execution_id = execution_id or str(uuid.uuid4())
        for _ in range(3):
            try:
                row = await self.pool.fetchrow(
                    f"""
                    WITH ins AS (
                        INSERT INTO executions
                            (execution_id, workflow_id, params, context, status, due_at,
                             deadline, code_version, admitted_by, traceparent)
                        -- Python None is SQL NULL on the wire; as params it means JSON null.
                        SELECT $1, $2, coalesce($3, 'null'::jsonb), $4, 'admitted', now(),
                               coalesce($5, now() + make_interval(secs => $7::float8)), $6, $8,
                               $9
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
        row = await self.pool.fetchrow(
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

    async def get(self, execution_id: str, owner: str | None = None) -> dict | None:
        """The healed record, or None. With `owner` (a trigger-only token's ID)
        the owner predicate is in this statement: a foreign record is None,
        exactly like a missing one."""
        row = await self.pool.fetchrow(
            f"SELECT {record_columns(self.max_unacknowledged)} FROM executions "
            "WHERE execution_id = $3 AND ($4::text IS NULL OR admitted_by = $4)",
            self.redelivery_base,
            self.redelivery_cap,
            execution_id,
            owner,
        )
        return dict(row) if row is not None else None

    async def watch_execution(self, execution_id: str) -> None:
        """A long-poll waits for this execution: its end is announced on
        fencepost_ended from now on (see ENDED_NOTICE)."""
        await self.pool.execute(
            "INSERT INTO watched_executions (execution_id) SELECT $1 "
            "WHERE EXISTS (SELECT 1 FROM executions WHERE execution_id = $1) "
            "ON CONFLICT (execution_id) DO NOTHING", execution_id)

    async def ended_among(self, execution_ids: list[str]) -> set[str]:
        """Which of these executions read as terminal now (the healed status,
        as `get` reports it), in one statement: the long-poll waiters' check
        for an end whose notification they missed."""
        rows = await self.pool.fetch(
            f"SELECT execution_id, status FROM (SELECT {record_columns(self.max_unacknowledged)} "
            "FROM executions WHERE execution_id = ANY($3::text[])) r",
            self.redelivery_base,
            self.redelivery_cap,
            execution_ids,
        )
        return {r["execution_id"] for r in rows if r["status"] in TERMINAL_STATUSES}

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
        admitted_after: datetime | None = None,
        admitted_before: datetime | None = None,
        blocked_by: str | None = None,
        live_workflows: set[str] | None = None,
    ) -> tuple[list[dict], str | None]:
        """Newest first, keyset-paginated on (admitted_at, execution_id).
        Filters apply to the healed view, as `get` reports it."""
        query, args = self.list_query(
            status=status, workflow_id=workflow_id,
            min_unacknowledged_deliveries=min_unacknowledged_deliveries, cursor=cursor,
            limit=limit, admitted_by=admitted_by, parent_execution_id=parent_execution_id,
            admitted_after=admitted_after, admitted_before=admitted_before,
            blocked_by=blocked_by, live_workflows=live_workflows,
        )
        rows = await self.pool.fetch(query, *args)
        page = [dict(r) for r in rows[:limit]]
        next_cursor = None
        if len(rows) > limit:
            last = page[-1]
            next_cursor = _encode_cursor(last["admitted_at"], last["execution_id"])
        return page, next_cursor

    def list_query(
        self,
        *,
        status: str | None = None,
        workflow_id: str | None = None,
        min_unacknowledged_deliveries: int | None = None,
        cursor: str | None = None,
        limit: int = 50,
        admitted_by: str | None = None,
        parent_execution_id: str | None = None,
        admitted_after: datetime | None = None,
        admitted_before: datetime | None = None,
        blocked_by: str | None = None,
        live_workflows: set[str] | None = None,
    ) -> tuple[str, list]:
        """The listing's one statement and its arguments (tests EXPLAIN it).
        Only the filters given appear in it, each a plain predicate over an
        indexed column, so the planner can use ix_executions_admitted_by_admitted
        (a trigger token's own: the owner predicate is in the statement),
        ix_executions_admitted (admittedAt ranges, newest first),
        ix_executions_status_admitted / _lease_expiry / _deadline (status)."""
        after_at, after_id = decode_cursor(cursor) if cursor else (None, None)
        args: list = [self.redelivery_base, self.redelivery_cap]

        def arg(value) -> str:
            args.append(value)
            return f"${len(args)}"

        inner: list[str] = []
        if workflow_id is not None:
            inner.append(f"workflow_id = {arg(workflow_id)}")
        if admitted_by is not None:
            inner.append(f"admitted_by = {arg(admitted_by)}")
        if parent_execution_id is not None:
            inner.append(f"parent_execution_id = {arg(parent_execution_id)}")
        if admitted_after is not None:
            inner.append(f"admitted_at >= {arg(admitted_after)}::timestamptz")
        if admitted_before is not None:
            inner.append(f"admitted_at < {arg(admitted_before)}::timestamptz")
        if after_at is not None:
            inner.append(f"(admitted_at, execution_id) < ({arg(after_at)}::timestamptz, "
                         f"{arg(after_id)}::text)")
        outer: list[str] = []
        if min_unacknowledged_deliveries is not None:
            # The healed counter is the raw one, or one more for an expired lease.
            p_min = arg(min_unacknowledged_deliveries)
            inner.append(f"unacknowledged_deliveries >= {p_min} - 1")
            outer.append(f"r.unacknowledged_deliveries >= {p_min}")
        if status is not None:
            # Raw rows whose healed status can be `status` (a read heals an
            # expired lease and applies the deadline sweep), then the healed filter.
            inner.append(_RAW_STATUSES_FOR.get(status, "status = {p}").format(p=arg(status)))
            outer.append(f"r.status = ${len(args)}")
        if blocked_by is not None:
            # app/blocked.py's one rule, in SQL, over the healed record (a raw
            # terminal row stays terminal: no reason but none).
            inner.append(f"status NOT IN {_TERMINAL_SQL}")
            live = arg(sorted(live_workflows) if live_workflows is not None else None)
            outer.append(f"{reason_sql('r', f'{live}::text[]')} = {arg(blocked_by)}")
        where_inner = " AND ".join(inner) or "true"
        where_outer = " AND ".join(outer) or "true"
        query = f"""
            SELECT * FROM (SELECT {record_columns(self.max_unacknowledged)} FROM executions
                           WHERE {where_inner}) r
            WHERE {where_outer}
            ORDER BY admitted_at DESC, execution_id DESC
            LIMIT {arg(limit + 1)}
            """
        return query, args

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

    async def request_wake(self, execution_id: str, at: datetime | None = None,
                           owner: str | None = None) -> WakeAnswer:
        """Unfenced: an extra wake costs at most one extra delivery. Pending
        wakes merge to the earliest; during a delivery they stay apart from the
        wakes the claim covers (due_at vs covered_due_at). With `owner` (a
        trigger-only token's ID) the owner predicate is in this one statement:
        a foreign execution is `not_found` and nothing is written, whatever
        was admitted while the request was on its way."""
        row = await self.pool.fetchrow(
            f"""
            WITH target AS (
                SELECT true AS found FROM executions
                WHERE execution_id = $1 AND ($3::text IS NULL OR admitted_by = $3)
            ), w AS (
                UPDATE executions
                SET due_at = least(due_at, coalesce($2::timestamptz, now())), updated_at = now()
                WHERE execution_id = $1 AND status NOT IN {_TERMINAL_SQL}
                  AND ($3::text IS NULL OR admitted_by = $3)
                RETURNING execution_id, due_at
            ), ev AS (
                INSERT INTO execution_events (execution_id, kind, detail)
                SELECT execution_id, 'wake_requested',
                       jsonb_build_object('at', coalesce($2::timestamptz, now()))
                FROM w
            )
            SELECT EXISTS (SELECT 1 FROM w) AS requested,
                   EXISTS (SELECT 1 FROM target) AS found,
                   (SELECT count(pg_notify('{NOTIFY_CHANNEL}', '')) FROM w
                    WHERE due_at <= now()) AS notified
            """,
            execution_id,
            at,
            owner,
        )
        if row["requested"]:
            return "requested"
        return "ignored" if row["found"] else "not_found"


# Raw statuses a row may have when a read reports it with the healed status
# (app/store/types.py healed_status_sql): an expired lease heals into
# admitted/suspended/parked/cancelled/timed_out; the sweep turns an unheld row
# past its deadline into timed_out, one with a cancel pending into cancelled
# (each a superset: the healed status filters). Each alternative is an
# indexed predicate (ix_executions_status_admitted, ix_executions_lease_expiry,
# ix_executions_deadline, ix_executions_cancel_pending).
_EXPIRED_LEASE = "(status = 'running' AND lease_expires_at <= now())"
_RAW_STATUSES_FOR = {
    "admitted": f"(status = {{p}} OR {_EXPIRED_LEASE})",
    "suspended": f"(status = {{p}} OR {_EXPIRED_LEASE})",
    "parked": f"(status = {{p}} OR {_EXPIRED_LEASE})",
    "cancelled": f"(status = {{p}} OR {_EXPIRED_LEASE} OR "
                 "(status IN ('admitted', 'suspended', 'parked') "
                 "AND cancel_requested_at IS NOT NULL))",
    "timed_out": f"(status = {{p}} OR {_EXPIRED_LEASE} OR "
                 "(status IN ('admitted', 'suspended', 'parked') AND deadline <= now()))",
}
