"""Reads for the operator's dashboard (app/ui): a filtered, sorted listing
with `blockedBy` computed in SQL from app/blocked.py's rules, counts per status, per-minute activity over
the last hour, and the leases each worker holds. Read-only statements."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import asyncpg

from app.blocked import QUEUE_REASONS, QUEUE_STATE_CTES, queue_state_joins, reason_sql
from app.store.handle import StoreObject
from app.store.records import (
    ActivityMinute,
    DashboardExecution,
    DashboardQueue,
    OutcomeUnknownEffect,
    records,
)
from app.store.types import healed_status_sql, record_columns

# How the listing may be ordered: a fixed set, never built from input.
UI_SORTS: dict[str, str] = {
    "admitted-desc": "admitted_at DESC, execution_id DESC",
    "admitted-asc": "admitted_at ASC, execution_id ASC",
    "unacked-desc": "unacknowledged_deliveries DESC, admitted_at DESC, execution_id DESC",
    "updated-desc": "updated_at DESC, execution_id DESC",
    "deadline-asc": "deadline ASC NULLS LAST, admitted_at DESC, execution_id DESC",
}

# app/blocked.py's RULES over the healed record `r` ('none' when terminal):
# the same table the API's blockedBy is read from. $4: workflows some live
# worker runs; `q` and `k`: what its queue and key hold now.
_BLOCKED_REASON_SQL = reason_sql("r", "$4::text[]", "q", "k")
_HELD_BACK = ", ".join(f"'{r}'" for r in QUEUE_REASONS)


class Dashboard(StoreObject):
    async def ui_list(
        self,
        *,
        live_workflows: set[str],
        status: str | None = None,
        workflow_id: str | None = None,
        min_unacknowledged_deliveries: int | None = None,
        blocked_by: str | None = None,
        admitted_from: datetime | None = None,
        admitted_to: datetime | None = None,
        queue: str | None = None,
        sort: str = "admitted-desc",
        offset: int = 0,
        limit: int = 50,
    ) -> tuple[list[DashboardExecution], int]:
        """One page of the healed records matching every filter given, each
        with `blocked_reason` (app/blocked.py's reason, 'none' when terminal),
        and how many match in all. `admitted_to` is exclusive."""
        order = UI_SORTS[sort]
        where = f"""
            -- Citus: a listing over many executions, of every bucket (multi-shard)
            FROM (SELECT {record_columns(self.config.max_unacknowledged)} FROM executions
                  WHERE ($5::text IS NULL OR workflow_id = $5)
                    AND ($8::timestamptz IS NULL OR admitted_at >= $8)
                    AND ($9::timestamptz IS NULL OR admitted_at < $9)
                    AND ($10::text IS NULL OR queue = $10)) r
            {queue_state_joins("r", "q", "k")}
            WHERE ($3::text IS NULL OR r.status = $3)
              AND ($6::int IS NULL OR r.unacknowledged_deliveries >= $6)
              AND ($7::text IS NULL OR ({_BLOCKED_REASON_SQL}) = $7)
        """
        args = (
            self.config.redelivery_base,
            self.config.redelivery_cap,
            status,
            sorted(live_workflows),
            workflow_id,
            min_unacknowledged_deliveries,
            blocked_by,
            admitted_from,
            admitted_to,
            queue,
        )
        async with self.db.connection() as conn:
            rows = await conn.fetch(
                f"""
                WITH {QUEUE_STATE_CTES}
                SELECT r.*, {_BLOCKED_REASON_SQL} AS blocked_reason {where}
                ORDER BY {order} LIMIT $11 OFFSET $12
                """,
                *args,
                limit,
                offset,
            )
            total = await conn.fetchval(f"WITH {QUEUE_STATE_CTES} SELECT count(*) {where}",
                                        *args)
        return records(DashboardExecution, rows), int(total)

    async def queues(self) -> list[DashboardQueue]:
        """Every queue with its declared, run-time and effective settings,
        what it holds now (running: slots held, as the claim counts), how
        many of its executions are due (waiting to be claimed) and how many
        of those its limits or a pause hold back (app/blocked.py's rule)."""
        rows = await self.db.fetch(
            f"""
            -- Citus: the due executions of every queue, of every bucket (multi-shard)
            WITH {QUEUE_STATE_CTES}, waiting AS (
                SELECT r.queue, {reason_sql("r", "NULL::text[]", "q", "k")} AS reason
                FROM (SELECT {record_columns(self.config.max_unacknowledged)} FROM executions
                      WHERE status IN ('admitted', 'suspended') AND due_at <= now()) r
                {queue_state_joins("r", "q", "k")}
            )
            SELECT qs.*, qu.declared, qu.override, qu.updated_at,
                   (SELECT count(*) FROM waiting w
                    WHERE w.queue = qs.name AND w.reason IN ('due', {_HELD_BACK})
                   )::integer AS due,
                   (SELECT count(*) FROM waiting w
                    WHERE w.queue = qs.name AND w.reason IN ({_HELD_BACK}))::integer
                       AS limited
            FROM queue_state qs JOIN queues qu ON qu.name = qs.name
            ORDER BY qs.name
            """,
            self.config.redelivery_base,
            self.config.redelivery_cap,
        )
        queues = records(DashboardQueue, rows)
        for q in queues:
            q["declared"], q["override"] = _json(q["declared"]), _json(q["override"])
        return queues

    async def queue_waiting(self, queue: str, *, live_workflows: set[str],
                            limit: int = 20) -> list[DashboardExecution]:
        """The queue's due executions in the order the claim takes them
        (priority, then due time), each with `blocked_reason` (app/blocked.py's
        rule: due, no-worker, no-worker-for-version, or what of the queue
        holds it back)."""
        rows = await self.db.fetch(
            f"""
            -- Citus: a queue's due executions, of every bucket (multi-shard)
            WITH {QUEUE_STATE_CTES}
            SELECT * FROM (
                SELECT r.*, {_BLOCKED_REASON_SQL} AS blocked_reason
                FROM (SELECT {record_columns(self.config.max_unacknowledged)} FROM executions
                      WHERE queue = $3 AND status IN ('admitted', 'suspended')
                        AND due_at <= now()) r
                {queue_state_joins("r", "q", "k")}
            ) w
            WHERE w.blocked_reason IN ('due', 'no-worker', 'no-worker-for-version', {_HELD_BACK})
            ORDER BY w.priority, w.due_at, w.execution_id
            LIMIT $5
            """,
            self.config.redelivery_base,
            self.config.redelivery_cap,
            queue,
            sorted(live_workflows),
            limit,
        )
        return records(DashboardExecution, rows)

    async def status_counts(self) -> dict[str, int]:
        """Executions per status, as reads report it (the healed view)."""
        rows = await self.db.fetch(
            "-- Citus: counts over every bucket (multi-shard)\n"
            f"SELECT {healed_status_sql(self.config.max_unacknowledged)} AS status, count(*) AS n "
            "FROM executions GROUP BY 1",
            self.config.redelivery_base,
            self.config.redelivery_cap,
        )
        return {r["status"]: int(r["n"]) for r in rows}

    async def workflow_ids_seen(self, limit: int = 200) -> list[str]:
        rows = await self.db.fetch(
            "-- Citus: over every bucket (multi-shard)\n"
            "SELECT DISTINCT workflow_id FROM executions ORDER BY workflow_id LIMIT $1", limit
        )
        return [r["workflow_id"] for r in rows]

    async def activity_per_minute(self, minutes: int = 60) -> tuple[datetime, list[ActivityMinute]]:
        """(database now, one row per minute, oldest first, of the last
        `minutes`): completions and failures (acknowledged as completed /
        failed or timed_out) and unacknowledged deliveries (released, or a
        lease that expired)."""
        async with self.db.connection() as conn:
            bounds = await conn.fetchrow(
                "SELECT now(), date_trunc('minute', now()) - make_interval(mins => $1 - 1)",
                minutes,
            )
            assert bounds is not None  # the statement always returns its row
            now, since = bounds[0], bounds[1]
            first_id = await self._first_event_id_at(conn, since)
            rows = await conn.fetch(
                """
                -- Citus: the last hour's events of every bucket (multi-shard)
                WITH m AS (
                    -- Ends at the minute of the `now` read above: a later
                    -- statement's now() may be a minute on (61 rows).
                    SELECT generate_series($1::timestamptz, date_trunc('minute', $3::timestamptz),
                                           interval '1 minute') AS minute
                ), ev AS (
                    SELECT date_trunc('minute', at) AS minute, kind, detail ->> 'status' AS status
                    FROM execution_events
                    WHERE event_id >= $2 AND at >= $1
                      AND kind IN ('acknowledged', 'released', 'lease_expired')
                )
                SELECT m.minute,
                       count(ev.kind) FILTER (WHERE ev.kind = 'acknowledged'
                                              AND ev.status = 'completed') AS completed,
                       count(ev.kind) FILTER (WHERE ev.kind = 'acknowledged'
                                              AND ev.status IN ('failed', 'timed_out')) AS failed,
                       count(ev.kind) FILTER (WHERE ev.kind IN ('released', 'lease_expired'))
                           AS unacknowledged
                FROM m LEFT JOIN ev ON ev.minute = m.minute
                GROUP BY m.minute ORDER BY m.minute
                """,
                since,
                first_id,
                now,
            )
        return now, records(ActivityMinute, rows)

    @staticmethod
    async def _first_event_id_at(conn: asyncpg.Connection, since: datetime) -> int:
        """A lower bound for the IDs of events written at or after `since`,
        found by bisecting the primary key (events have no index on `at`), so
        the activity read scans only the last hour's events. `at` is the
        writing transaction's start and event IDs come from a sequence, so
        they are nearly in the same order: the bound is taken 10 minutes early."""
        bounds = await conn.fetchrow(
            "-- Citus: events of every bucket (multi-shard)\n"
            "SELECT min(event_id), max(event_id) FROM execution_events")
        assert bounds is not None  # the statement always returns its row
        low, high = bounds[0], bounds[1]
        if low is None:
            return 0
        target = await conn.fetchval("SELECT $1::timestamptz - interval '10 minutes'", since)
        # Invariant: every event before `low` was written before `target`.
        while low < high:
            mid = (low + high) // 2
            at = await conn.fetchval(
                "-- Citus: events of every bucket (multi-shard)\n"
                "SELECT at FROM execution_events WHERE event_id >= $1 ORDER BY event_id LIMIT 1",
                mid,
            )
            if at is not None and at < target:
                low = mid + 1
            else:
                high = mid
        return int(low)

    async def leases_by_owner(self) -> dict[str, int]:
        """Live leases per holder (reads the lease-expiry partial index)."""
        rows = await self.db.fetch(
            "-- Citus: leases of every bucket (multi-shard)\n"
            "SELECT lease_owner, count(*) AS n FROM executions "
            "WHERE status = 'running' AND lease_expires_at > now() GROUP BY lease_owner"
        )
        return {r["lease_owner"]: int(r["n"]) for r in rows}

    async def outcome_unknown_effects(self, execution_id: str) -> list[OutcomeUnknownEffect]:
        """The effect attempts of one execution waiting for an operator."""
        rows = await self.db.fetch(
            """
            SELECT step_key, idempotency_key, function_name, attempts, token, started_at,
                   updated_at
            FROM effects
            WHERE execution_id = $1 AND bucket = fencepost_bucket($1) AND status = 'outcome_unknown'
            ORDER BY started_at
            """,
            execution_id,
        )
        return records(OutcomeUnknownEffect, rows)


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value
