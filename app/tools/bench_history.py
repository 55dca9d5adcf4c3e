"""`fencepost bench --history N`: N completed executions kept in the tables
before the second measured run, and whether the claim still reads them
through indexes.

The history is copied in SQL from executions the bench already completed
(their rows, steps and events, one statement per table per chunk), not run
through the service: the claim and the writes see the same tables a
service that ran N executions would have, at a fraction of the time."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, cast

import asyncpg

from app.store import StoreConfig
from app.store.handle import Handle, PlacementCache
from app.store.leases import Leases
from app.store.placement import SINGLE_NODE
from app.tools.bench import TIMER_WORKFLOW, WORKFLOW, _commits, _throughput
from app.tools.bench_cpu import CpuMeter

HISTORY_METHOD = ("bulk SQL copy of completed bench executions (rows, steps, events) "
                  "under new IDs, then ANALYZE")
# Executions per statement: bounds each statement's memory and WAL burst.
CHUNK = 20_000
TABLES = ("executions", "execution_steps", "execution_events")


async def _copyable_columns(conn: asyncpg.Connection, table: str) -> list[str]:
    """The columns an INSERT may name: not identity, generated or serial."""
    rows = await conn.fetch(
        """
        SELECT column_name FROM information_schema.columns
        WHERE table_schema = current_schema() AND table_name = $1
          AND is_identity = 'NO' AND is_generated = 'NEVER'
          AND coalesce(column_default, '') NOT LIKE 'nextval(%'
        ORDER BY ordinal_position
        """,
        table,
    )
    return [r["column_name"] for r in rows]


async def load_history(conn: asyncpg.Connection, templates: list[str], prefix: str,
                       n: int) -> None:
    """Copy `n` completed executions from `templates` (completed executions,
    taken in turn) under IDs `prefix`-0 .. `prefix`-(n-1), then ANALYZE, as
    autovacuum would after such a load."""
    columns = {t: await _copyable_columns(conn, t) for t in TABLES}
    # Each copy sits in its own ID's bucket, not its template's (the CHECK
    # bucket = fencepost_bucket(execution_id) refuses any other).
    own = {"execution_id": "$1 || '-' || g", "bucket": "fencepost_bucket($1 || '-' || g)"}
    template = "($4::text[])[1 + g % cardinality($4::text[])]"
    statements = {}
    for table, cols in columns.items():
        names = ", ".join(f'"{c}"' for c in cols)
        values = ", ".join(own.get(c, f't."{c}"') for c in cols)
        statements[table] = (
            f"-- Citus: copies many executions, into many buckets\n"
            f"INSERT INTO {table} ({names}) SELECT {values} "
            f"FROM generate_series($2::bigint, $3::bigint) g "
            f"JOIN {table} t ON t.execution_id = {template} "
            f"AND t.bucket = fencepost_bucket({template})"
        )
    for start in range(0, n, CHUNK):
        end = min(n, start + CHUNK) - 1
        async with conn.transaction():
            # Parents first: steps and events refer to their execution.
            for table in TABLES:
                await conn.execute(statements[table], prefix, start, end, templates)
    for table in TABLES:
        await conn.execute(f"ANALYZE {table}")


class _Recorder:
    """A store handle that records the statement it is given instead of
    running it."""

    def __init__(self) -> None:
        self.statement: tuple[str, tuple[Any, ...]] | None = None

    async def fetch(self, query: str, *args: Any, **_: Any) -> list[Any]:
        self.statement = (query, args)
        return []


def _scans(plan: dict, found: list[str]) -> list[str]:
    if plan.get("Relation Name") == "executions" and "Scan" in plan["Node Type"]:
        index = plan.get("Index Name")
        found.append(plan["Node Type"] + (f" using {index}" if index else ""))
    for child in plan.get("Plans", []):
        _scans(child, found)
    return found


async def claim_plan(conn: asyncpg.Connection, workflow_ids: list[str],
                     versions: list[str | None]) -> tuple[bool, list[str]]:
    """EXPLAIN the claim statement as a worker carrying `workflow_ids` sends
    it: (no sequential scan of executions, the scans of executions it uses)."""
    recorder = _Recorder()
    # Only fetch is called: the claim is one statement (on one Postgres: the
    # bench's database is never Citus with --history).
    leases = Leases(cast(Handle, recorder),
                    StoreConfig(placement=PlacementCache(placement=SINGLE_NODE)))
    await leases.claim_due(32, 30.0, "bench-explain", workflow_ids,
                           [30.0] * len(workflow_ids), versions)
    assert recorder.statement is not None  # claim_due sends one statement
    query, args = recorder.statement
    raw = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {query}", *args)
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    scans = sorted(set(_scans(plan, [])))
    return not any(s.startswith("Seq Scan") for s in scans), scans


async def measure_with_history(port: int, conn: asyncpg.Connection, run: str,
                        args: argparse.Namespace, meter: CpuMeter) -> dict:
    """Keep --history completed executions, then the end-to-end run again."""
    # The history's rows are copies of the first run's (completed) executions.
    templates = [f"{run}-mixed-{i}" for i in range(min(100, args.executions))]
    t0 = time.perf_counter()
    await load_history(conn, templates, f"{run}-history", args.history)
    load_seconds = time.perf_counter() - t0
    index_scan, scans = await claim_plan(conn, [WORKFLOW, TIMER_WORKFLOW], [None, None])
    commits_before = await _commits(conn)
    meter.start()
    again = await _throughput(port, conn, run, args.executions, args.clients, "after")
    cpu = meter.per_execution(args.executions)
    commits = await _commits(conn) - commits_before
    return {
        "history": args.history,
        "history_method": HISTORY_METHOD,
        "history_load_seconds": load_seconds,
        "executions_per_second_with_history": again["executions_per_second"],
        "commits_per_execution_with_history": commits / args.executions,
        **{f"{k}_with_history": v for k, v in cpu.items() if k.endswith("_per_execution")},
        "claim_index_scan": index_scan,
        "claim_executions_scans": scans,
    }
