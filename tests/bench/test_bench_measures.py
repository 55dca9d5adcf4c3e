"""`fencepost bench`'s measures for the throughput work, end to end at tiny
sizes: commits and CPU per execution, `--history`, `--timers`. The test
checks that each field is printed and sane and what the run left in the
database; speed is never asserted (the figures are the command's to measure)."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.bench.test_bench import bench


def _line(proc) -> dict:
    report = f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-5000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and len(lines) == 1, report
    print(lines[0])
    return json.loads(lines[0])


@pytest.mark.acceptance
@pytest.mark.timeout(300)
async def test_bench_history_reports_commits_cpu_and_both_rates(database_url, pool):
    proc = await asyncio.to_thread(
        bench, database_url, "--executions", "20", "--history", "50", "--quota-executions",
        "0", "--latency-samples", "3", "--workers", "2", "--concurrency", "8", timeout=280)
    line = _line(proc)
    assert line["commits_per_execution"] > 0, line
    for side in ("api", "worker"):
        assert line[f"{side}_cpu_s_per_execution"] >= 0, line
    # Postgres's CPU is a figure when its server is on this machine, else
    # null with the reason.
    if line["postgres_cpu_s_per_execution"] is None:
        assert line["postgres_cpu_null_reason"], line
    else:
        assert line["postgres_cpu_s_per_execution"] >= 0, line
    # Both rates, from one invocation: without the history, then with it.
    assert line["executions_per_second"] > 0, line
    assert line["executions_per_second_with_history"] > 0, line
    assert line["commits_per_execution_with_history"] > 0, line
    for side in ("api", "worker"):
        assert line[f"{side}_cpu_s_per_execution_with_history"] >= 0, line
    assert line["history"] == 50 and line["history_method"], line
    assert isinstance(line["claim_index_scan"], bool), line
    assert line["claim_executions_scans"], line
    assert line["claim_index_scan"] == (
        not any(s.startswith("Seq Scan") for s in line["claim_executions_scans"])), line

    # The history is kept: 50 completed executions, each with its three steps.
    row = await pool.fetchrow(
        "SELECT count(*) FILTER (WHERE e.status = 'completed') AS done, count(*) AS n, "
        "(SELECT count(*) FROM execution_steps s WHERE s.execution_id LIKE '%-history-%') "
        "AS steps FROM executions e WHERE e.execution_id LIKE '%-history-%'")
    assert (row["done"], row["n"], row["steps"]) == (50, 50, 150), dict(row)
    # The second run's executions all completed too, beside the first run's.
    counts = await pool.fetchrow(
        "SELECT count(*) FILTER (WHERE execution_id LIKE '%-mixed-%') AS first, "
        "count(*) FILTER (WHERE execution_id LIKE '%-after-%') AS second FROM executions "
        "WHERE status = 'completed'")
    assert (counts["first"], counts["second"]) == (20, 20), dict(counts)


@pytest.mark.acceptance
@pytest.mark.timeout(240)
async def test_bench_timers_prints_lateness_of_a_load_and_of_a_lone_timer(database_url, pool):
    proc = await asyncio.to_thread(
        bench, database_url, "--timers", "5", "--timer-seconds", "1", "--workers", "2",
        "--concurrency", "8", timeout=220)
    line = _line(proc)
    assert (line["mode"], line["timers"], line["timer_seconds"]) == ("timers", 5, 1.0), line
    p50, p99, worst = (line[f"timer_lateness_{q}_ms"] for q in ("p50", "p99", "max"))
    assert 0 <= p50 <= p99 <= worst, line
    assert line["lone_timer_lateness_ms"] >= 0, line
    # Every timer (the load's five and the lone one) slept its second and completed.
    rows = await pool.fetch(
        "SELECT e.status, extract(epoch FROM e.updated_at - e.admitted_at) AS took "
        "FROM executions e WHERE e.workflow_id = 'bench-timer'")
    assert len(rows) == 6 and all(r["status"] == "completed" for r in rows), rows
    assert all(r["took"] >= 1 for r in rows), rows


@pytest.mark.parametrize("flags", [("--history", "-1"), ("--timers", "-1"),
                                   ("--timers", "2", "--timer-seconds", "0")])
def test_bench_refuses_negative_history_and_timers(flags):
    proc = bench(None, *flags, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert flags[0] in proc.stdout
