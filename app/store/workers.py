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
