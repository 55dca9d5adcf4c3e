"""A parent and 50 children finish while two real `fencepost worker`
processes are killed (SIGKILL) and restarted during the run: every child
terminal, each started once (exactly 50 child rows), every step recorded
once (events), and the parent's result aggregates all 50 child results.

Uses tests/support/harness.py (read-only) with a worker command that
loads tests.compose.flows instead of tests.worker_processes.flows.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.support.harness import (
    TERMINAL,
    Harness,
    WorkerProcess,
)

pytestmark = pytest.mark.acceptance

N = 50
PARENT = "cmp-fan-1"


class ComposeHarness(Harness):
    """The worker-process harness, with workers running tests.compose.flows."""

    flows_module = "tests.compose.flows"
    worker_prefix = "cmp-worker"


async def child_counts(h: Harness) -> dict[str, int]:
    rows = await h.pool.fetch(
        "SELECT status, count(*) AS n FROM executions WHERE parent_execution_id = $1 "
        "GROUP BY status", PARENT)
    counts = {r["status"]: r["n"] for r in rows}
    counts["all"] = sum(counts.values())
    return counts


async def holds_a_lease(h: Harness, w: WorkerProcess) -> bool:
    return bool(await h.pool.fetchval(
        "SELECT count(*) FROM executions WHERE lease_owner = $1 AND status = 'running' "
        "AND lease_expires_at > now()", w.worker_id))


async def kill_and_restart(h: ComposeHarness, victim: WorkerProcess) -> WorkerProcess:
    victim.signal(signal.SIGKILL)
    assert await victim.wait_exit(10) == -signal.SIGKILL
    return await h.start_worker(f"{victim.name}2", concurrency=8)


@pytest.mark.citus
async def test_a_parent_and_50_children_finish_under_two_workers_killed_and_restarted(
        database_url: str, tmp_path: Path):
    h = ComposeHarness(database_url, tmp_path)
    await h.open()
    try:
        await run(h)
    except BaseException:
        print(h.logs())
        raise
    finally:
        await h.close()


async def run(h: ComposeHarness) -> None:
    a = await h.start_worker("A", concurrency=8)
    b = await h.start_worker("B", concurrency=8)
    await h.admit(PARENT, {"n": N, "seconds": 0.4}, workflow_id="cmp-fanout")

    # Kill 1: the worker holding the parent, while it is starting children.
    await h.wait_for(lambda: _at_least(h, "all", 10), timeout=30, what="10 children started")
    owner = await h.pool.fetchval(
        "SELECT lease_owner FROM executions WHERE execution_id = $1 AND status = 'running'",
        PARENT)
    assert owner in (a.worker_id, b.worker_id), owner
    first = a if owner == a.worker_id else b
    other = b if first is a else a
    started_at_kill = (await child_counts(h))["all"]
    assert started_at_kill < N, "the parent had started every child before the kill"
    await kill_and_restart(h, first)

    # Kill 2: the other worker, once 20 children have completed, while it
    # holds leases.
    async def half_done_and_busy() -> bool:
        return await _at_least(h, "completed", 20) and await holds_a_lease(h, other)

    await h.wait_for(half_done_and_busy, timeout=60, what="20 children done, B holding leases")
    assert (await child_counts(h)).get("completed", 0) < N
    await kill_and_restart(h, other)

    await h.wait_for(lambda: h.has_status(PARENT, *TERMINAL), timeout=90,
                     what="the parent terminal", interval=0.2)

    # The parent aggregates every child's result.
    record = await h.record(PARENT)
    assert record["status"] == "completed", record["outcome"]
    assert record["outcome"]["result"] == {
        "count": N,
        "sumSquares": sum(i * i for i in range(N)),
        "sumCubes": sum(i ** 3 for i in range(N)),
        "children": list(range(N)),
    }
    # Every child terminal, each started once.
    child_ids = [f"{PARENT}~start-{i}" for i in range(N)]
    rows = await h.pool.fetch(
        "SELECT execution_id, status, parent_step_key FROM executions "
        "WHERE parent_execution_id = $1 ORDER BY execution_id", PARENT)
    assert len(rows) == N
    assert sorted(r["execution_id"] for r in rows) == sorted(child_ids)
    assert {r["status"] for r in rows} == {"completed"}
    assert all(r["parent_step_key"] == r["execution_id"].rsplit("~", 1)[1] for r in rows)
    assert await h.pool.fetchval("SELECT count(*) FROM executions") == N + 1
    events = await h.assert_recorded_once(
        PARENT, [f"{kind}-{i}" for kind in ("pace", "start", "wait") for i in range(N)])
    started = [e["detail"]["childExecutionId"] for e in events if e["kind"] == "child_started"]
    assert sorted(started) == sorted(child_ids)
    expired_owners = {e["detail"]["owner"] for e in events if e["kind"] == "lease_expired"}
    for cid in child_ids:
        child_events = await h.assert_recorded_once(cid, ["square", "nap", "cube"])
        assert [e["kind"] for e in child_events].count("admitted") == 1, cid
        expired_owners |= {e["detail"]["owner"] for e in child_events
                           if e["kind"] == "lease_expired"}
    # Both kills cost leases that were taken over: the crashes were real.
    assert {first.worker_id, other.worker_id} <= expired_owners, expired_owners
    late = await h.pool.fetchval("SELECT count(*) FROM late_observations")
    print(f"children started before kill 1: {started_at_kill}; late observations: {late}")


async def _at_least(h: Harness, status: str, n: int) -> bool:
    return (await child_counts(h)).get(status, 0) >= n
