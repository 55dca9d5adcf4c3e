"""DBOS Transact's side of the peer comparison (run with the venv run.sh makes).

    dbos_bench.py URL [--executions N] [--clients C] [--mode threads|async]

The workload of `fencepost bench`'s end-to-end phase: a workflow of three
recorded steps, each returning a small value (n * 2), N executions started by
C concurrent starters. DBOS runs workflows in the process that starts them, so
starting and running happen in this one process: `threads` (the default)
starts sync workflows, each of which DBOS runs on a thread of its own (its
executor pool has no bound), `async` starts async workflows on one event loop. The rate is N divided by the time from
the first workflow's creation to the last one's completion, both as DBOS
recorded them in its system table. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version

import psycopg
from common import Meter, load_average
from dbos import DBOS, DBOSConfig, SetWorkflowID


@DBOS.step()
async def double(n: int) -> int:
    return n * 2


@DBOS.workflow()
async def three_steps(n: int) -> int:
    a = await double(n)
    b = await double(a)
    return await double(b)


@DBOS.step()
def double_sync(n: int) -> int:
    return n * 2


@DBOS.workflow()
def three_steps_sync(n: int) -> int:
    return double_sync(double_sync(double_sync(n)))


async def _run_async(ids: list[str], clients: int) -> None:
    async def starter(mine: list[tuple[int, str]]) -> list:
        handles = []
        for i, wid in mine:
            with SetWorkflowID(wid):
                handles.append((i, await DBOS.start_workflow_async(three_steps, i)))
        return handles

    numbered = list(enumerate(ids))
    shares = await asyncio.gather(*(starter(numbered[c::clients]) for c in range(clients)))
    started = [pair for share in shares for pair in share]
    results = await asyncio.gather(*(handle.get_result() for _, handle in started))
    assert results == [8 * i for i, _ in started]


def _run_threads(ids: list[str], clients: int) -> None:
    def starter(mine: list[tuple[int, str]]) -> list:
        handles = []
        for i, wid in mine:
            with SetWorkflowID(wid):
                handles.append((i, DBOS.start_workflow(three_steps_sync, i)))
        return handles

    numbered = list(enumerate(ids))
    with ThreadPoolExecutor(clients) as pool:
        shares = list(pool.map(starter, (numbered[c::clients] for c in range(clients))))
    for share in shares:
        for i, handle in share:
            assert handle.get_result() == 8 * i


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url", help="Postgres URL of the database DBOS may use as its system database")
    p.add_argument("--executions", type=int, default=2000)
    p.add_argument("--clients", type=int, default=32, help="concurrent starters (default 32)")
    p.add_argument("--mode", choices=("async", "threads"), default="threads")
    p.add_argument("--pool", type=int, default=20,
                   help="DBOS's system database pool size (default 20, DBOS's own)")
    args = p.parse_args()

    config: DBOSConfig = {"name": "fencepost-peers", "system_database_url": args.url,
                          "sys_db_pool_size": args.pool, "log_level": "WARNING"}
    DBOS(config=config)
    DBOS.launch()
    try:
        run = uuid.uuid4().hex[:8]
        go = (lambda ids: asyncio.run(_run_async(ids, args.clients))) if args.mode == "async" \
            else (lambda ids: _run_threads(ids, args.clients))
        go([f"{run}-warm-{i}" for i in range(min(100, args.executions))])
        ids = [f"{run}-{i}" for i in range(args.executions)]
        meter = Meter(args.url, [os.getpid()])
        meter.start()
        load, t0 = load_average(), time.perf_counter()
        go(ids)
        wall = time.perf_counter() - t0
        costs = meter.per_execution(args.executions)
        with psycopg.connect(args.url) as conn:
            row = conn.execute(
                "SELECT count(*), (max(updated_at) - min(created_at)) / 1000.0 "
                "FROM dbos.workflow_status WHERE workflow_uuid = ANY(%s) AND status = 'SUCCESS'",
                (ids,)).fetchone()
        assert row is not None and row[0] == args.executions, row
        span = float(row[1])
    finally:
        DBOS.destroy()
    print(json.dumps({
        "system": "dbos",
        "version": version("dbos"),
        "executions": args.executions,
        "steps_per_execution": 3,
        "executions_per_second": round(args.executions / span, 2),
        "wall_seconds": round(span, 2),
        "client_wall_seconds": round(wall, 2),
        **costs,
        "settings": {"mode": args.mode, "clients": args.clients, "processes": 1,
                     "sys_db_pool_size": args.pool, "in_process": True},
        "cpus": os.cpu_count(),
        "load_average_1m_at_start": load,
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
