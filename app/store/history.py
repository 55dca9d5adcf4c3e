"""Reads of executions and their history: the healed record (one execution,
a page of them, which have ended), its steps, events, attempts and late
observations, and their keyset pages; and retention, which deletes ended
executions' history for good. Nothing here changes an execution's state."""

from __future__ import annotations

import builtins
from datetime import datetime
from typing import Any

from app.blocked import (
    QUEUE_STATE_CTES,
    Live,
    live_sql,
    queue_state_joins,
    queue_states,
    reason_sql,
)
from app.schema import TERMINAL_STATUSES
from app.store.handle import StoreObject
from app.store.on_shard import OnShard
from app.store.placement import placement_of
from app.store.records import (
    AttemptRecord,
    EventRecord,
    HealedExecution,
    LateObservation,
    StepDetail,
    StepPageRow,
    record,
    records,
)
from app.store.types import (
    TERMINAL_SQL,
    StepRecord,
    decode_cursor,
    encode_cursor,
    record_columns,
    step_record,
)

# Where a page of execution $1's history continues: after the place of its
# event $2 (an eventId a client was given). A number that is not one of its
# event IDs continues after the last event with a lower ID (0: from the
# start), as when event IDs were the order.
_PLACE_AFTER = """coalesce(
    (SELECT a.seq FROM execution_events a
     WHERE a.event_id = $2 AND a.bucket = fencepost_bucket($1) AND a.execution_id = $1),
    (SELECT max(a.seq) FROM execution_events a
     WHERE a.execution_id = $1 AND a.bucket = fencepost_bucket($1) AND a.event_id < $2),
    0)"""

# Ended executions past retention ($1: seconds since their last update; $2:
# at most that many) deleted with what hangs off them, each leaving its
# tombstone in the same statement.
_PRUNE = OnShard("prune", """
WITH doomed AS (
    -- On Citus: of one shard (prune_terminal visits each shard).
    SELECT execution_id, bucket FROM executions
    WHERE status IN ('completed', 'failed', 'cancelled', 'timed_out')
      AND updated_at < now() - make_interval(secs => $1)
    ORDER BY updated_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), ev AS (
    DELETE FROM execution_events
    WHERE (execution_id, bucket) IN (SELECT execution_id, bucket FROM doomed)
), lo AS (
    DELETE FROM late_observations
    WHERE (execution_id, bucket) IN (SELECT execution_id, bucket FROM doomed)
), d AS (
    -- Re-checked on the locked row: only terminal records go.
    DELETE FROM executions
    WHERE (execution_id, bucket) IN (SELECT execution_id, bucket FROM doomed)
      AND status IN ('completed', 'failed', 'cancelled', 'timed_out')
    RETURNING execution_id, token, workflow_id
), tomb AS (
    -- Every deleted row leaves its tombstone, or the delete does not commit.
    INSERT INTO retired_executions AS r (execution_id, bucket, last_token, workflow_id)
    SELECT d.execution_id, fencepost_bucket(d.execution_id), d.token, d.workflow_id
    FROM d
    ON CONFLICT (execution_id, bucket) DO UPDATE
    SET last_token = greatest(r.last_token, EXCLUDED.last_token),
        workflow_id = EXCLUDED.workflow_id, retired_at = now()
    RETURNING 1
)
SELECT count(*) AS pruned FROM tomb
""", ("float8", "bigint"), (("pruned", "bigint"),))


class History(StoreObject):
    async def get(self, execution_id: str, owner: str | None = None) -> HealedExecution | None:
        """The healed record, or None. With `owner` (a trigger-only token's ID)
        the owner predicate is in this statement: a foreign record is None,
        exactly like a missing one."""
        row = await self.db.fetchrow(
            f"SELECT {record_columns(self.config.max_unacknowledged)} FROM executions "
            "WHERE execution_id = $3 AND bucket = fencepost_bucket($3) "
            "AND ($4::text IS NULL OR admitted_by = $4)",
            self.config.redelivery_base,
            self.config.redelivery_cap,
            execution_id,
            owner,
        )
        return record(HealedExecution, row) if row is not None else None


    async def watch_execution(self, execution_id: str) -> None:
        """A long-poll waits for this execution: its end is announced on
        fencepost_ended from now on (see ENDED_NOTICE)."""
        await self.db.execute(
            "INSERT INTO watched_executions (execution_id, bucket) SELECT $1, fencepost_bucket($1) "
            "WHERE EXISTS (SELECT 1 FROM executions "
            "WHERE execution_id = $1 AND bucket = fencepost_bucket($1)) "
            "ON CONFLICT (execution_id, bucket) DO NOTHING", execution_id)


    async def ended_among(self, execution_ids: builtins.list[str]) -> set[str]:
        """Which of these executions read as terminal now (the healed status,
        as `get` reports it), in one statement: the long-poll waiters' check
        for an end whose notification they missed."""
        rows = await self.db.fetch(
            "-- Citus: several executions, of any buckets (multi-shard)\n"
            f"SELECT execution_id, status FROM (SELECT {record_columns(self.config.max_unacknowledged)} "
            "FROM executions WHERE execution_id = ANY($3::text[])) r",
            self.config.redelivery_base,
            self.config.redelivery_cap,
            execution_ids,
        )
        return {r["execution_id"] for r in rows if r["status"] in TERMINAL_STATUSES}


    async def list(self, *, limit: int = 50, **filters: Any
                   ) -> tuple[builtins.list[HealedExecution], str | None]:
        """Newest first, keyset-paginated on (admitted_at, execution_id).
        `filters`: those of `list_query` (status, workflow_id, cursor, ...);
        they apply to the healed view, as `get` reports it."""
        query, args = self.list_query(limit=limit, **filters)
        rows = await self.db.fetch(query, *args)
        page = records(HealedExecution, rows[:limit])
        next_cursor = None
        if len(rows) > limit:
            last = page[-1]
            next_cursor = encode_cursor(last["admitted_at"], last["execution_id"])
        return page, next_cursor


    def list_query(
        self,
        *,
        status: str | None = None,
        workflow_id: str | None = None,
        code_version: str | None = None,
        min_unacknowledged_deliveries: int | None = None,
        cursor: str | None = None,
        limit: int = 50,
        admitted_by: str | None = None,
        parent_execution_id: str | None = None,
        admitted_after: datetime | None = None,
        admitted_before: datetime | None = None,
        blocked_by: str | None = None,
        live_workflows: set[str] | None = None,
    ) -> tuple[str, builtins.list[Any]]:
        """The listing's one statement and its arguments (tests EXPLAIN it).
        Only the filters given appear in it, each a plain predicate over an
        indexed column, so the planner can use ix_executions_admitted_by_admitted
        (a trigger token's own: the owner predicate is in the statement),
        ix_executions_admitted (admittedAt ranges, newest first),
        ix_executions_status_admitted / _lease_expiry / _deadline (status)."""
        after_at, after_id = decode_cursor(cursor) if cursor else (None, None)
        args: builtins.list[Any] = [self.config.redelivery_base, self.config.redelivery_cap]

        def arg(value: Any) -> str:
            args.append(value)
            return f"${len(args)}"

        inner: builtins.list[str] = []
        if workflow_id is not None:
            inner.append(f"workflow_id = {arg(workflow_id)}")
        if code_version is not None:
            inner.append(f"code_version = {arg(code_version)}")
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
        outer: builtins.list[str] = []
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
        with_queues, joins = "", ""
        if blocked_by is not None:
            # app/blocked.py's one rule, in SQL, over the healed record (a raw
            # terminal row stays terminal: no reason but none), with what its
            # queue and key hold now.
            inner.append(f"status NOT IN {TERMINAL_SQL}")
            live = arg(sorted(live_workflows) if live_workflows is not None else None)
            outer.append(f"{reason_sql('r', f'{live}::text[]', 'q', 'k')} = {arg(blocked_by)}")
            with_queues, joins = f"WITH {QUEUE_STATE_CTES}", queue_state_joins("r", "q", "k")
        where_inner = " AND ".join(inner) or "true"
        where_outer = " AND ".join(outer) or "true"
        query = f"""
            -- Citus: a listing over many executions, of every bucket (multi-shard)
            {with_queues}
            SELECT r.* FROM (SELECT {record_columns(self.config.max_unacknowledged)}
                             FROM executions WHERE {where_inner}) r
            {joins}
            WHERE {where_outer}
            ORDER BY admitted_at DESC, execution_id DESC
            LIMIT {arg(limit + 1)}
            """
        return query, args


    async def steps(self, execution_ids: builtins.list[str]) -> dict[str, dict[str, StepRecord]]:
        """Recorded steps of several executions in one round trip."""
        rows = await self.db.fetch(
            """
            -- Citus: the steps of several executions, of any buckets (multi-shard)
            SELECT execution_id, step_key, status, value, error, function_name, attempts,
                   token, recorded_at, position
            FROM execution_steps WHERE execution_id = ANY($1::text[])
            """,
            execution_ids,
        )
        out: dict[str, dict[str, StepRecord]] = {eid: {} for eid in execution_ids}
        for row in rows:
            out[row["execution_id"]][row["step_key"]] = step_record(row)
        return out


    async def events(self, execution_id: str) -> builtins.list[EventRecord]:
        rows = await self.db.fetch(
            """
            SELECT event_id, seq, at, kind, token, detail FROM execution_events
            WHERE execution_id = $1 AND bucket = fencepost_bucket($1) ORDER BY seq
            """,
            execution_id,
        )
        return records(EventRecord, rows)


    async def late_observations(self, execution_id: str) -> builtins.list[LateObservation]:
        rows = await self.db.fetch(
            """
            SELECT observation_id, step_key, token, owner, value, error, observed_at, conflict
            FROM late_observations
            WHERE execution_id = $1 AND bucket = fencepost_bucket($1) ORDER BY observation_id
            """,
            execution_id,
        )
        return records(LateObservation, rows)


    async def step_details(self, execution_id: str, *, include_values: bool) -> builtins.list[StepDetail]:
        """Recorded steps and effect attempts in doubt, oldest first. Values
        are loaded only when asked; otherwise their size is reported."""
        rows = await self.db.fetch(
            """
            SELECT s.step_key, s.status, s.attempts, s.token, s.function_name,
                   s.recorded_at, f0.started_at, f0.idempotency_key,
                   CASE WHEN $2 THEN s.value END AS value,
                   CASE WHEN $2 THEN s.error END AS error,
                   pg_column_size(s.value) AS value_bytes, s.error ->> 'name' AS error_name
            FROM execution_steps s
            LEFT JOIN effects f0 ON f0.execution_id = s.execution_id AND f0.bucket = s.bucket
                                AND f0.step_key = s.step_key
            WHERE s.execution_id = $1 AND s.bucket = fencepost_bucket($1)
            UNION ALL
            SELECT f.step_key, f.status, f.attempts, f.token, f.function_name,
                   NULL, f.started_at, f.idempotency_key, NULL, NULL, NULL, NULL
            FROM effects f
            WHERE f.execution_id = $1 AND f.bucket = fencepost_bucket($1)
              AND NOT EXISTS (SELECT 1 FROM execution_steps s
                              WHERE s.execution_id = f.execution_id AND s.bucket = f.bucket
                                AND s.step_key = f.step_key)
            ORDER BY recorded_at NULLS LAST, started_at
            """,
            execution_id,
            include_values,
        )
        return records(StepDetail, rows)


    async def events_page(self, execution_id: str, *, after: int, limit: int) -> builtins.list[EventRecord]:
        rows = await self.db.fetch(
            f"""
            SELECT event_id, seq, at, kind, token, detail FROM execution_events
            WHERE execution_id = $1 AND bucket = fencepost_bucket($1)
              AND seq > {_PLACE_AFTER}
            ORDER BY seq LIMIT $3
            """,
            execution_id,
            after,
            limit,
        )
        return records(EventRecord, rows)


    # A trigger-only token's reads carry the owner predicate in the one
    # statement that reads (`$owner IS NULL OR admitted_by = $owner`): a row
    # admitted by another token while the request was on its way is never
    # shown, and a foreign execution reads exactly like a missing one (None).

    async def execution_events_page(self, execution_id: str, *, after: int, limit: int,
                                    owner: str | None = None) -> builtins.list[EventRecord] | None:
        """Events after `after`, oldest first; None when the execution does
        not exist or (with `owner`) was admitted by another token."""
        rows = await self.db.fetch(
            f"""
            SELECT ev.event_id, ev.seq, ev.at, ev.kind, ev.token, ev.detail
            FROM (SELECT execution_id, bucket FROM executions
                  WHERE execution_id = $1 AND bucket = fencepost_bucket($1)
                    AND ($4::text IS NULL OR admitted_by = $4)) e
            LEFT JOIN LATERAL (
                SELECT event_id, seq, at, kind, token, detail FROM execution_events
                -- The execution's bucket as a constant (not e.bucket): Citus routes on it.
                WHERE execution_id = e.execution_id AND bucket = fencepost_bucket($1)
                  AND seq > {_PLACE_AFTER}
                ORDER BY seq LIMIT $3
            ) ev ON true
            """,
            execution_id, after, limit, owner,
        )
        if not rows:
            return None
        return records(EventRecord, (r for r in rows if r["event_id"] is not None))


    async def execution_steps_page(
        self, execution_id: str, *, include_values: bool, limit: int,
        after: tuple[int, datetime, str] | None = None, owner: str | None = None,
    ) -> builtins.list[StepPageRow] | None:
        """Recorded steps (by recorded_at), then effect attempts in doubt (by
        started_at), then steps a redrive superseded (status 'superseded', by
        their recorded_at), keyset-paginated on (group, time, step key);
        `after` is the last row's `position`. None when the execution does not
        exist or (with `owner`) was admitted by another token."""
        group, at, key = after if after is not None else (None, None, None)
        rows = await self.db.fetch(
            """
            SELECT x.*, a.failed_attempts FROM (SELECT execution_id, bucket FROM executions
                             WHERE execution_id = $1 AND bucket = fencepost_bucket($1)
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
                           ON f0.execution_id = s.execution_id AND f0.bucket = s.bucket
                          AND f0.step_key = s.step_key
                    -- The execution's bucket as a constant (not e.bucket): Citus routes on it.
                    WHERE s.execution_id = e.execution_id AND s.bucket = fencepost_bucket($1)
                    UNION ALL
                    SELECT 1, f.started_at, f.step_key, f.status, f.attempts, f.token,
                           f.function_name, NULL, f.started_at, f.idempotency_key, NULL, NULL,
                           NULL, NULL, NULL, NULL
                    FROM effects f
                    WHERE f.execution_id = e.execution_id AND f.bucket = fencepost_bucket($1)
                      AND NOT EXISTS (SELECT 1 FROM execution_steps s
                                      WHERE s.execution_id = f.execution_id
                                        AND s.bucket = f.bucket
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
                           ON f2.execution_id = p.execution_id AND f2.bucket = p.bucket
                          AND f2.step_key = p.step_key
                    WHERE p.execution_id = e.execution_id AND p.bucket = fencepost_bucket($1)
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
                WHERE h.execution_id = $1 AND h.bucket = fencepost_bucket($1)
                  AND h.step_key = x.step_key
            ) a ON true
            """,
            execution_id, include_values, limit, group, at, key, owner,
        )
        if not rows:
            return None
        return records(StepPageRow, (r for r in rows if r["step_key"] is not None))


    async def execution_late_observations_page(
        self, execution_id: str, *, after: int, limit: int, owner: str | None = None,
    ) -> builtins.list[LateObservation] | None:
        """Late observations after `after` (an observation ID), oldest first;
        None when the execution does not exist or (with `owner`) was admitted
        by another token."""
        rows = await self.db.fetch(
            """
            SELECT o.observation_id, o.step_key, o.token, o.owner, o.value, o.error,
                   o.observed_at, o.conflict
            FROM (SELECT execution_id, bucket FROM executions
                  WHERE execution_id = $1 AND bucket = fencepost_bucket($1)
                    AND ($4::text IS NULL OR admitted_by = $4)) e
            LEFT JOIN LATERAL (
                SELECT * FROM late_observations
                -- The execution's bucket as a constant (not e.bucket): Citus routes on it.
                WHERE execution_id = e.execution_id AND bucket = fencepost_bucket($1)
                  AND observation_id > $2
                ORDER BY observation_id LIMIT $3
            ) o ON true
            """,
            execution_id, after, limit, owner,
        )
        if not rows:
            return None
        return records(LateObservation, (r for r in rows if r["observation_id"] is not None))


    async def exists(self, execution_id: str) -> bool:
        return bool(
            await self.db.fetchval(
                "SELECT true FROM executions "
                "WHERE execution_id = $1 AND bucket = fencepost_bucket($1)", execution_id
            )
        )


    async def live_workflow_ids(self, stale_after_seconds: float) -> Live:
        """Workflows some live worker advertises and the code versions
        carried of them (for blockedBy: no-worker, no-worker-for-version),
        and what each queue and key holds now (for blockedBy: queue-paused,
        concurrency-limit, rate-limited), read as app/blocked.py counts."""
        async with self.db.connection() as conn:
            live = await conn.fetchval(f"SELECT {live_sql('$1')}", float(stale_after_seconds))
            queues = await conn.fetch(f"WITH {QUEUE_STATE_CTES} SELECT * FROM queue_state")
            keys = await conn.fetch(f"WITH {QUEUE_STATE_CTES} SELECT * FROM key_state")
        return Live(live, queue_states([dict(q) for q in queues], [dict(k) for k in keys]))


    async def admitted_by(self, execution_id: str) -> tuple[bool, str | None]:
        """(exists, the token ID that admitted it)."""
        row = await self.db.fetchrow(
            "SELECT admitted_by FROM executions "
            "WHERE execution_id = $1 AND bucket = fencepost_bucket($1)", execution_id
        )
        return (row is not None), (row["admitted_by"] if row is not None else None)


    async def attempt_history(self, execution_id: str) -> builtins.list[AttemptRecord]:
        """Failed attempts (step_key set) and `Retry` reasons (step_key NULL), oldest first."""
        rows = await self.db.fetch(
            """
            SELECT step_key, attempt, token, error, at FROM attempt_history
            WHERE execution_id = $1 AND bucket = fencepost_bucket($1) ORDER BY attempt_id
            """,
            execution_id,
        )
        return records(AttemptRecord, rows)


    async def prune_terminal(self, older_than_seconds: float, limit: int) -> int:
        """Delete up to `limit` terminal executions last updated more than
        `older_than_seconds` ago, with everything that hangs off them
        (steps, signals and effects go by ON DELETE CASCADE), and leave a
        tombstone (ID, last token, workflow) for each in the same statement:
        the ID stays taken for good (admission refuses it) and its fencing
        token never restarts. On Citus, up to `limit` in each shard, each
        shard's in a statement on its node."""
        placement = await placement_of(self.db, self.config.placement)
        pruned = 0
        for buckets in placement.each_shard():
            [row] = await _PRUNE.fetch(self.db, buckets, float(older_than_seconds), limit)
            pruned += row["pruned"]
        return pruned



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
