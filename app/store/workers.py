"""Worker registration: who is alive, what it runs, when it last spoke."""

from __future__ import annotations

from app.blocked import QUEUE_REASONS, QUEUE_STATE_CTES, live_sql, queue_state_joins, reason_sql
from app.store.handle import StoreObject
from app.store.records import MetricsSnapshot, WorkerHolder, WorkerRecord, record, records
from app.store.types import record_columns


class Workers(StoreObject):
    async def register_worker(
        self, worker_id: str, *, host: str, pid: int, workflows: list[str], concurrency: int,
        live_within_seconds: float | None = None, versions: dict[str, str | None] | None = None,
    ) -> WorkerHolder | None:
        """Register (or re-register) `worker_id`, starting now, carrying
        `workflows` at `versions` ({workflow: code version or None}). With
        `live_within_seconds`, an ID another live worker holds (not stopped,
        heartbeat within that long, another host or pid) is not taken: its
        holder's row is returned, unchanged; None when registered."""
        registered = await self.db.fetchval(
            """
            -- The time is the inserted row's (excluded.started_at): Citus
            -- refuses now() in ON CONFLICT DO UPDATE (workers is a reference table).
            INSERT INTO workers (worker_id, host, pid, workflows, concurrency, versions,
                                 started_at, heartbeat_at)
            VALUES ($1, $2, $3, $4, $5, $7, now(), now())
            ON CONFLICT (worker_id) DO UPDATE
            SET host = excluded.host, pid = excluded.pid, workflows = excluded.workflows,
                versions = excluded.versions, concurrency = excluded.concurrency,
                started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at,
                stopped_at = NULL
            WHERE $6::float8 IS NULL OR workers.stopped_at IS NOT NULL
               -- (timestamptz - timestamptz: IMMUTABLE, as Citus requires here)
               OR excluded.started_at - workers.heartbeat_at >= make_interval(secs => $6::float8)
               OR (workers.host = excluded.host AND workers.pid = excluded.pid)
            RETURNING true
            """,
            worker_id,
            host,
            pid,
            workflows,
            concurrency,
            live_within_seconds,
            versions or {},
        )
        if registered:
            return None
        holder = await self.db.fetchrow(
            "SELECT host, pid, heartbeat_at FROM workers WHERE worker_id = $1", worker_id)
        return record(WorkerHolder, holder) if holder is not None else None

    async def heartbeat(self, worker_id: str) -> None:
        await self.db.execute(
            "UPDATE workers SET heartbeat_at = now() WHERE worker_id = $1", worker_id
        )

    async def worker_stopped(self, worker_id: str) -> None:
        await self.db.execute(
            "UPDATE workers SET stopped_at = now(), heartbeat_at = now() WHERE worker_id = $1",
            worker_id,
        )

    async def list_workers(self, *, stale_after_seconds: float, recent_seconds: float = 3600) -> list[WorkerRecord]:
        """Live workers (heartbeat within `stale_after_seconds`, not stopped)
        and those that stopped or went silent within `recent_seconds`, each
        with the code version it carries of each workflow (`versions`:
        {workflow: version or null}; a workflow not in it: unversioned)."""
        rows = await self.db.fetch(
            """
            SELECT w.worker_id, w.host, w.pid, w.workflows, w.versions, w.concurrency, w.started_at,
                   w.heartbeat_at, w.stopped_at,
                   (w.stopped_at IS NULL
                    AND w.heartbeat_at > now() - make_interval(secs => $1)) AS alive,
                   coalesce(l.held, 0) AS leases_held, coalesce(l.in_flight, 0) AS in_flight
            FROM workers w
            LEFT JOIN (
                -- Deliveries the database sees each worker running: all its
                -- running rows (in flight), those whose lease is unexpired (held).
                -- Citus: counts over every bucket.
                SELECT lease_owner, count(*) AS in_flight,
                       count(*) FILTER (WHERE lease_expires_at > now()) AS held
                FROM executions WHERE status = 'running' GROUP BY lease_owner
            ) l ON l.lease_owner = w.worker_id
            WHERE w.heartbeat_at > now() - make_interval(secs => $2)
            ORDER BY w.started_at DESC
            """,
            float(stale_after_seconds),
            float(recent_seconds),
        )
        return records(WorkerRecord, rows)

    async def metrics_snapshot(self, live_within_seconds: float = 31.0) -> MetricsSnapshot:
        """Gauges over unfinished rows, each read as the API reports it (the
        healed view of app/store/types.py: an expired lease counts as the
        reaper will leave it), and why each waits by app/blocked.py's rule,
        with the workflows (and the versions carried of them) some worker
        heartbeating within `live_within_seconds` runs."""
        async with self.db.connection() as conn:
            rows = await conn.fetch(
                f"""
                -- Citus: gauges over every bucket.
                WITH live AS (SELECT {live_sql("$3")} AS workflows), {QUEUE_STATE_CTES}, x AS (
                    SELECT r.*, {reason_sql("r", "l.workflows", "q", "k")} AS reason
                    FROM (SELECT {record_columns(self.config.max_unacknowledged)} FROM executions
                          WHERE status IN ('admitted', 'running', 'suspended', 'parked')) r
                    CROSS JOIN live l
                    {queue_state_joins("r", "q", "k")}
                    WHERE r.status IN ('admitted', 'running', 'suspended', 'parked')
                )
                SELECT x.status, x.parked_reason, x.workflow_id, x.queue, x.reason,
                       count(*) AS n,
                       count(*) FILTER (WHERE x.unacknowledged_deliveries > 0) AS unacked,
                       coalesce(sum(x.unacknowledged_deliveries), 0) AS unacked_sum,
                       -- Due (no-worker, held back by its queue) since due_at;
                       -- every other reason since the record last changed.
                       extract(epoch FROM max(x.read_at - CASE
                           WHEN x.reason IN ({_DUE_REASONS}) THEN x.due_at
                           ELSE x.updated_at END)) AS oldest
                FROM x
                GROUP BY x.status, x.parked_reason, x.workflow_id, x.queue, x.reason
                """,
                self.config.redelivery_base,
                self.config.redelivery_cap,
                float(live_within_seconds),
            )
            queues = await conn.fetch(
                # Citus: each queue's held slots are counted over every bucket.
                f"WITH {QUEUE_STATE_CTES} SELECT * FROM queue_state")
            live = await conn.fetchrow(
                """
                SELECT count(*) AS workers, coalesce(sum(concurrency), 0) AS capacity
                FROM workers
                WHERE stopped_at IS NULL AND heartbeat_at > now() - make_interval(secs => $1)
                """,
                float(live_within_seconds),
            )
            # Terminal executions too: a conflict stays worth knowing about.
            # Every increment of integrity_conflicts inserts its conflicting
            # late observation in the same statement, so the executions are
            # found through that small table and the primary key, not by
            # scanning every execution at each scrape.
            conflicted = await conn.fetchval(
                """
                -- Citus: a count over every bucket.
                SELECT count(*) FROM executions
                WHERE integrity_conflicts > 0
                  AND (execution_id, bucket) IN (SELECT execution_id, bucket
                                                 FROM late_observations WHERE conflict)
                """
            )
        by_status: dict[str, int] = {}
        by_status_workflow: dict[tuple[str, str], int] = {}
        parked: dict[str, int] = {}
        waiting: dict[tuple[str, str], int] = {}
        oldest_by_reason: dict[str, float] = {}
        queue_due: dict[str, int] = {}
        queue_limited: dict[str, int] = {}
        for r in rows:
            if r["reason"] in _DUE:
                queue_due[r["queue"]] = queue_due.get(r["queue"], 0) + r["n"]
            if r["reason"] in QUEUE_REASONS:
                queue_limited[r["queue"]] = queue_limited.get(r["queue"], 0) + r["n"]
            by_status[r["status"]] = by_status.get(r["status"], 0) + r["n"]
            key = (r["status"], r["workflow_id"])
            by_status_workflow[key] = by_status_workflow.get(key, 0) + r["n"]
            if r["status"] == "parked":
                parked[r["parked_reason"]] = parked.get(r["parked_reason"], 0) + r["n"]
            key = (r["reason"], r["workflow_id"])
            waiting[key] = waiting.get(key, 0) + r["n"]
            if r["oldest"] is not None:
                oldest_by_reason[r["reason"]] = max(oldest_by_reason.get(r["reason"], 0.0),
                                                    max(0.0, float(r["oldest"])))
        assert live is not None  # the statement always returns its row
        return {
            "by_status": by_status,
            "by_status_workflow": by_status_workflow,
            "parked": parked,
            "waiting": waiting,
            "oldest_by_reason": oldest_by_reason,
            # Executions waiting for an operator's decision on a step whose
            # outcome is unknown (one step each); an effect row left behind by
            # an execution that was resolved or ended does not count.
            "outcome_unknown": parked.get("outcome_unknown", 0),
            "unacknowledged_executions": sum(r["unacked"] for r in rows),
            "unacknowledged_sum": int(sum(r["unacked_sum"] for r in rows)),
            "integrity_conflicts": int(conflicted),
            "live_workers": live["workers"],
            "live_capacity": int(live["capacity"]),
            # Per queue: slots held now, due executions (waiting to be
            # claimed), those of them its limits or a pause hold back, and
            # its effective limits (None: no such limit).
            "queues": {
                q["name"]: {
                    "running": q["running"], "due": queue_due.get(q["name"], 0),
                    "limited": queue_limited.get(q["name"], 0),
                    "limits": {"concurrency": q["concurrency"],
                               "per_key_concurrency": q["per_key_concurrency"],
                               "rate_limit": q["rate_limit"],
                               "rate_period_seconds": q["rate_period"]},
                }
                for q in queues
            },
        }


# Due: waiting to be claimed, by a worker that may be missing or behind its
# queue's limits.
_DUE = ("due", "no-worker", "no-worker-for-version", *QUEUE_REASONS)
_DUE_REASONS = ", ".join(f"'{r}'" for r in _DUE)
