"""The soak's verification, from the database alone (events in their
execution's order, `seq`): every admitted execution ended once with the
right result, no stale write was accepted, no step was recorded twice, and
each step row carries the token of its event."""

from __future__ import annotations

import asyncio
import time

import asyncpg

from app.tools.soakflows import STEP_KEYS

TERMINAL = ("completed", "failed", "cancelled", "timed_out")


async def wait_terminal(conn: asyncpg.Connection, pattern: str, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        open_ = await conn.fetchval(
            "-- Citus: executions by an ID pattern, of every bucket (multi-shard)\n"
            "SELECT count(*) FROM executions WHERE execution_id LIKE $1 "
            "AND status <> ALL($2::text[])", pattern, list(TERMINAL))
        if open_ == 0 or time.monotonic() > deadline:
            return open_
        await asyncio.sleep(0.5)


STALE_SQL = """
-- Citus: executions by an ID pattern, of every bucket (multi-shard)
SELECT w.execution_id, w.event_id, w.seq, w.kind, w.token, w.detail::text AS detail,
       CASE
         WHEN EXISTS (SELECT 1 FROM execution_events c
                      WHERE c.execution_id = w.execution_id AND c.bucket = w.bucket
                        AND c.seq < w.seq AND c.kind = 'claimed' AND c.token > w.token)
           THEN 'after a newer claim'
         WHEN EXISTS (SELECT 1 FROM execution_events x
                      WHERE x.execution_id = w.execution_id AND x.bucket = w.bucket
                        AND x.seq < w.seq
                        AND x.kind IN ('acknowledged', 'released', 'lease_expired')
                        AND x.token = w.token)
           THEN 'after its lease ended'
         WHEN NOT EXISTS (SELECT 1 FROM execution_events c
                          WHERE c.execution_id = w.execution_id AND c.bucket = w.bucket
                            AND c.seq < w.seq AND c.kind = 'claimed'
                            AND c.token = w.token)
           THEN 'without a claim'
       END AS why
FROM execution_events w
WHERE w.execution_id LIKE $1 AND w.kind IN ('step_recorded', 'acknowledged', 'released')
"""


async def verify(conn: asyncpg.Connection, pattern: str, admitted: list[str]) -> dict:
    statuses = {r["status"]: r["n"] for r in await conn.fetch(
        "-- Citus: executions by an ID pattern, of every bucket (multi-shard)\n"
        "SELECT status, count(*) AS n FROM executions WHERE execution_id LIKE $1 "
        "GROUP BY status", pattern)}
    kinds = {r["kind"]: r["n"] for r in await conn.fetch(
        "-- Citus: executions by an ID pattern, of every bucket (multi-shard)\n"
        "SELECT kind, count(*) AS n FROM execution_events WHERE execution_id LIKE $1 "
        "GROUP BY kind ORDER BY kind", pattern)}
    taken_over = await conn.fetchval(
        """
        -- Citus: executions by an ID pattern, of every bucket (multi-shard)
        SELECT count(*) FROM execution_events c
        WHERE c.execution_id LIKE $1 AND c.kind = 'claimed' AND EXISTS (
            SELECT 1 FROM execution_events x
            WHERE x.execution_id = c.execution_id AND x.bucket = c.bucket
              AND x.seq < c.seq
              AND x.kind = 'lease_expired' AND x.token = c.token - 1)
        """, pattern)
    stale = [dict(r) for r in await conn.fetch(
        f"SELECT * FROM ({STALE_SQL}) s WHERE why IS NOT NULL ORDER BY execution_id, seq",
        pattern)]
    twice = [dict(r) for r in await conn.fetch(
        """
        -- Citus: executions by an ID pattern, of every bucket (multi-shard)
        SELECT execution_id, detail->>'stepKey' AS step_key, count(*) AS n
        FROM execution_events WHERE execution_id LIKE $1 AND kind = 'step_recorded'
        GROUP BY 1, 2 HAVING count(*) > 1 ORDER BY 1, 2
        """, pattern)]
    # Every completed execution recorded each of its steps, by the token of its event.
    inconsistent = [dict(r) for r in await conn.fetch(
        """
        -- Citus: executions by an ID pattern, of every bucket (multi-shard)
        SELECT e.execution_id, k.step_key, s.token AS row_token,
               (SELECT array_agg(v.token ORDER BY v.seq) FROM execution_events v
                WHERE v.execution_id = e.execution_id AND v.bucket = e.bucket
                  AND v.kind = 'step_recorded' AND v.detail->>'stepKey' = k.step_key
               ) AS event_tokens
        FROM executions e CROSS JOIN unnest($2::text[]) AS k(step_key)
        LEFT JOIN execution_steps s
          ON s.execution_id = e.execution_id AND s.bucket = e.bucket AND s.step_key = k.step_key
        WHERE e.execution_id LIKE $1 AND e.status = 'completed'
          AND (s.token IS NULL OR s.token IS DISTINCT FROM (
                SELECT max(v.token) FROM execution_events v
                WHERE v.execution_id = e.execution_id AND v.bucket = e.bucket
                  AND v.kind = 'step_recorded' AND v.detail->>'stepKey' = k.step_key))
        ORDER BY 1, 2
        """, pattern, list(STEP_KEYS))]
    wrong_results = await conn.fetchval(
        """
        -- Citus: executions by an ID pattern, of every bucket (multi-shard)
        SELECT count(*) FROM executions
        WHERE execution_id LIKE $1 AND status = 'completed'
          AND (outcome->'result'->>'n')::bigint
              IS DISTINCT FROM (params->>'n')::bigint + 3
        """, pattern)
    terminal_twice = await conn.fetchval(
        """
        -- Citus: executions by an ID pattern, of every bucket (multi-shard)
        SELECT count(*) FROM (
            SELECT execution_id FROM execution_events
            WHERE execution_id LIKE $1 AND kind = 'acknowledged'
              AND detail->>'status' = ANY($2::text[])
            GROUP BY execution_id HAVING count(*) > 1) t
        """, pattern, list(TERMINAL))
    late = await conn.fetchval(
        "-- Citus: executions by an ID pattern, of every bucket (multi-shard)\n"
        "SELECT count(*) FROM late_observations WHERE execution_id LIKE $1", pattern)
    in_db = sum(statuses.values())
    not_admitted = await conn.fetchval(
        "-- Citus: executions by an ID pattern, of every bucket (multi-shard)\n"
        "SELECT count(*) FROM executions WHERE execution_id LIKE $1 "
        "AND execution_id <> ALL($2::text[])", pattern, admitted)
    return {
        "statuses": statuses,
        "event_kinds": kinds,
        "executions_in_database": in_db,
        "executions_not_admitted_by_client": not_admitted,
        "completions": statuses.get("completed", 0),
        "non_terminal": sum(n for s, n in statuses.items() if s not in TERMINAL),
        "leases_taken_over": taken_over,
        "leases_expired": kinds.get("lease_expired", 0),
        "stale_writes_rejected": kinds.get("fenced_write_rejected", 0),
        "late_observations": late,
        "stale_writes_accepted": len(stale),
        "steps_recorded_more_than_once": len(twice),
        "step_rows_inconsistent": len(inconsistent),
        "wrong_results": wrong_results,
        "terminal_outcomes_more_than_once": terminal_twice,
        "_examples": {"stale": stale[:10], "twice": twice[:10], "inconsistent": inconsistent[:10],
                      **(await _why_stuck(conn, pattern))},
    }


async def _why_stuck(conn: asyncpg.Connection, pattern: str) -> dict[str, list[dict]]:
    """When executions are left open: a few of them as their rows stand
    (times relative to the database's now) and the database's sessions that
    are not idle, so a failed drain says what held it up."""
    stuck = [dict(r) for r in await conn.fetch(
        """
        -- Citus: executions by an ID pattern, of every bucket (multi-shard)
        SELECT execution_id, status, token, lease_owner,
               round(extract(epoch FROM lease_expires_at - now())::numeric, 2) AS lease_left_s,
               round(extract(epoch FROM due_at - now())::numeric, 2) AS due_in_s,
               round(extract(epoch FROM redeliver_after - now())::numeric, 2)
                   AS redeliver_in_s,
               unacknowledged_deliveries,
               round(extract(epoch FROM now() - updated_at)::numeric, 2) AS updated_s_ago
        FROM executions WHERE execution_id LIKE $1 AND status <> ALL($2::text[])
        ORDER BY updated_at LIMIT 8
        """, pattern, list(TERMINAL))]
    if not stuck:
        return {}
    sessions = [dict(r) for r in await conn.fetch(
        r"""
        SELECT application_name AS app, state, wait_event_type, wait_event,
               round(extract(epoch FROM now() - xact_start)::numeric, 2) AS xact_s,
               left(regexp_replace(query, '\s+', ' ', 'g'), 100) AS query
        FROM pg_stat_activity
        WHERE datname = current_database() AND pid <> pg_backend_pid()
          AND state IS DISTINCT FROM 'idle'
        ORDER BY xact_start NULLS LAST LIMIT 12
        """)]
    return {"open": stuck, "session": sessions}
