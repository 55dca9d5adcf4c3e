"""The claim stays an index scan at 1M stored executions.

A million rows, as a long-running service accumulates them: almost all
terminal, a backlog of due executions in two limited queues (one limited per
key, one by concurrency), suspended executions due only later at a more
urgent priority, running ones with live leases and a few whose leases
expired. The exact statement `claim_due` sends is captured from the store,
then:

- run in a transaction that is rolled back: the transaction's own
  statistics show no sequential scan of `executions` at all, the counting
  function's statements included (EXPLAIN cannot see inside the function);
- explained (FORMAT JSON) with the same arguments, and as the generic plan
  a prepared statement may switch to after a few runs: the due executions
  are read through ix_executions_queue_due, the expired leases through
  ix_executions_lease_expiry, and no node reads `executions` sequentially.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from app.db import asyncpg_dsn
from app.store.handle import ConnectionHandle
from app.store.leases import Leases

ROWS = 1_000_000
DUE_PER_QUEUE = 4_000
SUSPENDED = 2_000
RUNNING_PER_QUEUE = 20
EXPIRED = 10
TERMINAL = ROWS - 2 * DUE_PER_QUEUE - SUSPENDED - 2 * RUNNING_PER_QUEUE - EXPIRED
WORKFLOWS = ["wf-a", "wf-b"]

# Columns every generated row sets; the rest keep their defaults. A row is
# on queue qa (keyed, workflow wf-a) or qb (workflow wf-b) by parity.
FILL = """
INSERT INTO executions (execution_id, bucket, workflow_id, params, status, outcome, queue,
                        concurrency_key, priority, due_at, token, lease_owner,
                        lease_expires_at, ever_suspended, admitted_at, updated_at)
SELECT $1 || g, fencepost_bucket($1 || g), CASE WHEN g % 2 = 0 THEN 'wf-a' ELSE 'wf-b' END, '{}'::jsonb, $2,
       CASE WHEN $2 = 'completed' THEN '{"result": null}'::jsonb END,
       CASE WHEN g % 2 = 0 THEN 'qa' ELSE 'qb' END,
       CASE WHEN g % 2 = 0 THEN 'customer-' || (g % 500) END,
       $3, $4::timestamptz - make_interval(secs => g / 1000.0),
       CASE WHEN $2 = 'admitted' THEN 0 ELSE 1 END,
       CASE WHEN $2 = 'running' THEN 'worker-x' END, $5::timestamptz, $2 = 'suspended',
       now() - interval '30 days' + make_interval(secs => g), now()
FROM generate_series(1, $6::int) g
"""


async def fill(database_url: str) -> None:
    """The million rows, on a connection of its own (no statement timeout)."""
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        await _fill(conn)
    finally:
        await conn.close()


async def _fill(conn: asyncpg.Connection) -> None:
    now = await conn.fetchval("SELECT now()")

    batches = [
        # (prefix, status, priority, due_at, lease_expires_at, count)
        ("done-", "completed", 0, None, None, TERMINAL),
        ("due-", "admitted", 0, now, None, 2 * DUE_PER_QUEUE),
        ("later-", "suspended", -1, now + timedelta(hours=1), None, SUSPENDED),
        ("live-", "running", 0, None, now + timedelta(minutes=5), 2 * RUNNING_PER_QUEUE),
        ("lapsed-", "running", 0, None, now - timedelta(minutes=5), EXPIRED),
    ]
    for prefix, status, priority, due, expiry, count in batches:
        await conn.execute(FILL, prefix, status, priority, due, expiry, count)
    assert await conn.fetchval("SELECT count(*) FROM executions") == ROWS
    # Statistics of `status` from every row: ANALYZE's default sample (30,000
    # rows) held the 50 running ones or none, by chance, and with none the
    # planner took `running` for one row and read the expired leases through
    # ix_executions_status_admitted instead (2 of 15 runs before revision
    # 0012, 3 of 21 after): both index scans, but this test names which.
    await conn.execute("ALTER TABLE executions ALTER COLUMN status SET STATISTICS 10000")
    await conn.execute("ANALYZE executions")


class Capturing(ConnectionHandle):
    """The connection's handle, keeping every statement it is sent."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        super().__init__(conn)
        self.sent: list[tuple[str, tuple[Any, ...]]] = []

    async def fetch(self, query: str, *args: Any, timeout: float | None = None) -> list:
        self.sent.append((query, args))
        return await super().fetch(query, *args, timeout=timeout)


def scans(plan: dict) -> list[tuple[str, str | None]]:
    """(node type, index name) of every node of the plan reading `executions`;
    a bitmap heap scan is named with each index its bitmap is built from."""
    out = []
    if plan.get("Relation Name") == "executions":
        if plan["Node Type"] == "Bitmap Heap Scan":
            out.extend((plan["Node Type"], name) for name in bitmap_indexes(plan))
        else:
            out.append((plan["Node Type"], plan.get("Index Name")))
    for child in plan.get("Plans", []):
        out.extend(scans(child))
    return out


def bitmap_indexes(plan: dict) -> list[str]:
    names = [plan["Index Name"]] if plan["Node Type"] == "Bitmap Index Scan" else []
    for child in plan.get("Plans", []):
        names.extend(bitmap_indexes(child))
    return names


def literal(value: Any) -> str:
    """`value` (an argument of the claim) as an SQL literal."""
    if value is None:
        return "NULL"
    if isinstance(value, list):
        return "ARRAY[" + ", ".join(map(literal, value)) + "]"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


def plan_of(explained: Any) -> dict:
    return (json.loads(explained) if isinstance(explained, str) else explained)[0]["Plan"]


@pytest.mark.timeout(600)
async def test_the_claim_reads_executions_only_through_indexes_at_1m_rows(
        store, pool, database_url):
    await store.queues.declare({"qa": {"per_key_concurrency": 2}, "qb": {"concurrency": 50}})
    await fill(database_url)
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        try:
            handle = Capturing(conn)
            leases = Leases(handle, store.config)
            began = time.perf_counter()
            claimed = await leases.claim_due(32, 30.0, "explainer", WORKFLOWS, [30.0, 30.0])
            took = time.perf_counter() - began
            began = time.perf_counter()  # again, planned already: the worker's steady state
            again = await leases.claim_due(32, 30.0, "explainer", WORKFLOWS, [30.0, 30.0])
            took_again = time.perf_counter() - began
            seq, idx = await conn.fetchrow(
                "SELECT seq_scan, idx_scan FROM pg_stat_xact_user_tables "
                "WHERE relname = 'executions'")
            (sql, args), _ = handle.sent
            # EXPLAIN takes no bound arguments: the statement is prepared and
            # executed with the same values written out.
            await conn.execute("PREPARE fp_claim AS " + sql)
            explain = f"EXPLAIN (FORMAT JSON) EXECUTE fp_claim({', '.join(map(literal, args))})"
            await conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")
            custom = plan_of(await conn.fetchval(explain))
            await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            generic = plan_of(await conn.fetchval(explain))
        finally:
            await tx.rollback()

    # The claim did its work: the limited queues gave what they allow.
    ids = [d.lease.execution_id for d in claimed]
    assert len(ids) == 32, ids
    # Expired leases taken over; nothing due only later (however urgent).
    assert {f"lapsed-{i}" for i in range(1, EXPIRED + 1)} <= set(ids), ids
    assert not [i for i in ids if i.startswith("later-")], ids
    print(f"1M rows: {len(ids)} claimed in {took * 1000:.1f} ms, {len(again)} more in "
          f"{took_again * 1000:.1f} ms; executions read by {idx} index scans, "
          f"{seq} sequential scans")
    assert seq == 0 and idx > 0, (seq, idx)
    for name, plan in (("custom", custom), ("generic", generic)):
        read = scans(plan)
        print(f"{name} plan reads executions by: {sorted(set(read), key=str)}")
        assert not [s for s in read if "Seq Scan" in s[0]], (name, read)
        indexes = {index for _, index in read}
        assert {"ix_executions_queue_due", "ix_executions_lease_expiry"} <= indexes, (name, read)
