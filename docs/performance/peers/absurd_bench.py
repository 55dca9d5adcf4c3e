"""Absurd's side of the peer comparison (run with the venv run.sh makes).

    absurd_bench.py URL [--executions N] [--workers K] [--concurrency C] [--clients S]

The workload of `fencepost bench`'s end-to-end phase: a task of three
checkpointed steps, each returning a small value (n * 2). K worker processes
(absurd-sdk's asyncio worker, C tasks claimed and run at a time each) run
while S concurrent spawners, each on its own connection, spawn N tasks. The
rate is N divided by the time from the first task's enqueue to the last run's
completion, both as Absurd recorded them (the database clock). Prints one JSON
line.

Absurd keeps its state in an `absurd` schema that its SQL file creates: the
absurdctl package (same release as the SDK) bundles that file, and this script
applies it to an empty database, as `absurdctl init` would, then creates the
queue, as `absurdctl create-queue` would.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from importlib.metadata import version

import psycopg
from absurd_sdk import AsyncAbsurd
from common import Meter, load_average

QUEUE = "bench"
TASK = "bench-3-steps"


async def _double(n: int) -> int:
    return n * 2


def _app(url: str) -> AsyncAbsurd:
    app = AsyncAbsurd(url, queue_name=QUEUE)

    @app.register_task(name=TASK)
    async def three_steps(params: dict, ctx) -> dict:
        n = params["n"]
        a = await ctx.step("one", lambda: _double(n))
        b = await ctx.step("two", lambda: _double(a))
        c = await ctx.step("three", lambda: _double(b))
        return {"n": c}

    return app


def worker(url: str, concurrency: int) -> None:
    asyncio.run(_app(url).start_worker(concurrency=concurrency))


def install_schema(url: str) -> None:
    from absurdctl import BUNDLED_SCHEMA_SQL  # type: ignore[import-untyped]

    with psycopg.connect(url, autocommit=True) as conn:
        installed = conn.execute(
            "SELECT to_regproc('absurd.get_schema_version') IS NOT NULL").fetchone()
        if installed is None or not installed[0]:
            # No parameters: sent as one simple query, so its many statements run in turn.
            conn.execute(BUNDLED_SCHEMA_SQL)
        conn.execute("SELECT absurd.create_queue(%s)", (QUEUE,))


async def _spawn_all(url: str, n: int, first: int, spawners: int) -> list[str]:
    async def spawner(numbers: range) -> list[str]:
        client = AsyncAbsurd(url, queue_name=QUEUE)
        try:
            return [str((await client.spawn(TASK, {"n": i}, queue=QUEUE))["task_id"])
                    for i in numbers]
        finally:
            await client.close()

    shares = await asyncio.gather(*(spawner(range(first + s, first + n, spawners))
                                    for s in range(spawners)))
    return [task for share in shares for task in share]


def _wait_completed(url: str, ids: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            row = conn.execute(
                f"SELECT count(*) FROM absurd.t_{QUEUE} "
                "WHERE task_id = ANY(%s::uuid[]) AND state = 'completed'", (ids,)).fetchone()
            if row is not None and row[0] == len(ids):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {row and row[0]} of {len(ids)} tasks completed in time")
            time.sleep(0.1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url", help="Postgres URL of the database Absurd may install its schema in")
    p.add_argument("--executions", type=int, default=2000)
    p.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    p.add_argument("--concurrency", type=int, default=16,
                   help="tasks each worker claims and runs at a time (default 16)")
    p.add_argument("--clients", type=int, default=32, help="concurrent spawners (default 32)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.url, args.concurrency)
        return 0

    install_schema(args.url)
    command = [sys.executable, __file__, args.url, "--worker",
               "--concurrency", str(args.concurrency)]
    # The workers print nothing to stdout, which carries the result line only.
    workers = [subprocess.Popen(command, stdout=sys.stderr) for _ in range(args.workers)]
    try:
        # The warm-up also waits for every worker to be up and claiming.
        warm = asyncio.run(_spawn_all(args.url, min(100, args.executions), -1_000_000,
                                      args.clients))
        _wait_completed(args.url, warm, 120)
        meter = Meter(args.url, [os.getpid()] + [w.pid for w in workers])
        meter.start()
        load, t0 = load_average(), time.perf_counter()
        ids = asyncio.run(_spawn_all(args.url, args.executions, 0, args.clients))
        spawn_seconds = time.perf_counter() - t0
        _wait_completed(args.url, ids, max(120, args.executions / 20))
        wall = time.perf_counter() - t0
        costs = meter.per_execution(args.executions)
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait()
    with psycopg.connect(args.url) as conn:
        row = conn.execute(
            f"SELECT count(*), extract(epoch FROM max(r.completed_at) - min(t.enqueue_at)), "
            f"  bool_and(r.result = jsonb_build_object('n', 8 * (t.params->>'n')::int)) "
            f"FROM absurd.t_{QUEUE} t JOIN absurd.r_{QUEUE} r ON r.run_id = t.last_attempt_run "
            "WHERE t.task_id = ANY(%s::uuid[])", (ids,)).fetchone()
    assert row is not None and row[0] == args.executions and row[2], row
    span = float(row[1])
    print(json.dumps({
        "system": "absurd",
        "version": version("absurd-sdk"),
        "executions": args.executions,
        "steps_per_execution": 3,
        "executions_per_second": round(args.executions / span, 2),
        "spawns_per_second": round(args.executions / spawn_seconds, 2),
        "wall_seconds": round(span, 2),
        "client_wall_seconds": round(wall, 2),
        **costs,
        "settings": {"workers": args.workers, "concurrency": args.concurrency,
                     "clients": args.clients, "processes": args.workers + 1,
                     "worker": "AsyncAbsurd.start_worker", "poll_interval_s": 0.25,
                     "in_process": False},
        "cpus": os.cpu_count(),
        "load_average_1m_at_start": load,
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
