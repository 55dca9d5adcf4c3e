"""`fencepost bench --timers N`: how late durable timers wake.

With the API and the workers running: first one execution sleeping S seconds
on the idle service (a lone timer), then N executions each sleeping S
seconds, admitted over HTTP at an even pace over about S seconds. Lateness
of an execution = its completion − its admission − S, all on the database
clock: what the sleep took beyond S, including the claim after the wake and
the completion's own write."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid

import asyncpg

from app.db import asyncpg_dsn
from app.tools.bench import (
    TIMER_WORKFLOW,
    _admit_over,
    _percentile,
    _wait_completed,
    _wait_ready,
)


async def _lateness_ms(conn: asyncpg.Connection, ids: list[str], seconds: float,
                       timeout: float) -> list[float]:
    await _wait_completed(conn, ids, time.monotonic() + timeout, poll=0.05)
    rows = await conn.fetch(
        "-- Citus: several executions, of any buckets (multi-shard)\n"
        "SELECT extract(epoch FROM updated_at - admitted_at) * 1000 - $2::float8 * 1000 AS ms "
        "FROM executions WHERE execution_id = ANY($1::text[])",
        ids, seconds,
    )
    return [float(r["ms"]) for r in rows]


def _bodies(ids: list[str], seconds: float) -> list[bytes]:
    return [json.dumps({"workflowId": TIMER_WORKFLOW, "executionId": eid,
                        "params": {"seconds": seconds}}).encode() for eid in ids]


async def measure_timers(port: int, conn: asyncpg.Connection, run: str, n: int,
                         seconds: float, clients: int) -> dict:
    lone = [f"{run}-lone"]
    await _admit_over(port, _bodies(lone, seconds), [])
    alone = await _lateness_ms(conn, lone, seconds, seconds + 60)
    ids = [f"{run}-timer-{i}" for i in range(n)]
    bodies = _bodies(ids, seconds)
    # Execution i is sent at i·S/N seconds from now: N admissions spread over S.
    t0 = time.perf_counter()
    at = [t0 + i * seconds / n for i in range(n)]
    clients = min(clients, n)
    await asyncio.gather(*(_admit_over(port, bodies[c::clients], [], send_at=at[c::clients])
                           for c in range(clients)))
    admit_seconds = time.perf_counter() - t0
    late = await _lateness_ms(conn, ids, seconds, seconds + max(120, n / 20))
    return {
        "timer_admission_seconds": admit_seconds,
        "timer_lateness_p50_ms": _percentile(late, 0.5),
        "timer_lateness_p99_ms": _percentile(late, 0.99),
        "timer_lateness_max_ms": max(late),
        "lone_timer_lateness_ms": alone[0],
    }


async def run_timers(url: str, port: int, args: argparse.Namespace) -> dict:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        await _wait_ready(f"http://127.0.0.1:{port}", conn, args.workers)
        return await measure_timers(port, conn, f"bench-{uuid.uuid4().hex[:8]}", args.timers,
                                    args.timer_seconds, args.clients)
    finally:
        await conn.close()


def timers_line(args: argparse.Namespace, embedded: bool, result: dict) -> dict:
    return {
        "benchmark": "fencepost",
        "mode": "timers",
        "timers": args.timers,
        "timer_seconds": args.timer_seconds,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "clients": args.clients,
        "database": "embedded" if embedded else "DATABASE_URL",
        "cpus": os.cpu_count(),
        **{k: round(v, 2) for k, v in result.items()},
    }
