"""Worker registration: who is alive, what it runs, when it last spoke."""

from __future__ import annotations

import asyncpg


class WorkerStatements:
    pool: asyncpg.Pool

    async def register_worker(
        self, worker_id: str, *, host: str, pid: int, workflows: list[str], concurrency: int
    ) -> None:
        await self.pool.execute(
            """
            INSERT INTO workers (worker_id, host, pid, workflows, concurrency)
            VALUES ($1, $2, $3, $4, $5)
            ON CONFLICT (worker_id) DO UPDATE
            SET host = excluded.host, pid = excluded.pid, workflows = excluded.workflows,
                concurrency = excluded.concurrency, heartbeat_at = now(), stopped_at = NULL
            """,
            worker_id,
            host,
            pid,
            workflows,
            concurrency,
        )

    async def heartbeat(self, worker_id: str) -> None:
        await self.pool.execute(
            "UPDATE workers SET heartbeat_at = now() WHERE worker_id = $1", worker_id
        )

    async def worker_stopped(self, worker_id: str) -> None:
        await self.pool.execute(
            "UPDATE workers SET stopped_at = now(), heartbeat_at = now() WHERE worker_id = $1",
            worker_id,
        )

    async def list_workers(self, *, stale_after_seconds: float, recent_seconds: float = 3600) -> list[dict]:
        """Live workers (heartbeat within `stale_after_seconds`, not stopped)
        and those that stopped or went silent within `recent_seconds`."""
        rows = await self.pool.fetch(
            """
            SELECT worker_id, host, pid, workflows, concurrency, started_at, heartbeat_at,
                   stopped_at,
                   (stopped_at IS NULL
                    AND heartbeat_at > now() - make_interval(secs => $1)) AS alive
            FROM workers
            WHERE heartbeat_at > now() - make_interval(secs => $2)
            ORDER BY started_at DESC
            """,
            float(stale_after_seconds),
            float(recent_seconds),
        )
        return [dict(r) for r in rows]

    async def metrics_snapshot(self) -> dict:
        """Cheap gauges: each query reads an index over unfinished rows only."""
        async with self.pool.acquire() as conn:
            by_status = await conn.fetch(
                "SELECT status, count(*) AS n FROM executions "
                "WHERE status IN ('admitted', 'running', 'suspended', 'parked') GROUP BY status"
            )
            parked = await conn.fetch(
                "SELECT parked_reason, count(*) AS n FROM executions "
                "WHERE status = 'parked' GROUP BY parked_reason"
            )
            row = await conn.fetchrow(
                """
                SELECT
                  (SELECT count(*) FROM effects WHERE status = 'outcome_unknown') AS unknown,
                  (SELECT count(*) FROM executions WHERE unacknowledged_deliveries > 0
                     AND status IN ('admitted', 'running', 'suspended', 'parked')) AS unacked,
                  (SELECT coalesce(sum(unacknowledged_deliveries), 0) FROM executions
                   WHERE unacknowledged_deliveries > 0
                     AND status IN ('admitted', 'running', 'suspended', 'parked')) AS unacked_sum,
                  (SELECT coalesce(extract(epoch FROM now() - min(due_at)), 0) FROM executions
                   WHERE status IN ('admitted', 'suspended') AND due_at <= now()) AS oldest
                """
            )
        return {
            "by_status": {r["status"]: r["n"] for r in by_status},
            "parked": {r["parked_reason"]: r["n"] for r in parked},
            "outcome_unknown": row["unknown"],
            "unacknowledged_executions": row["unacked"],
            "unacknowledged_sum": int(row["unacked_sum"]),
            "oldest_due_age": float(row["oldest"]),
        }
