"""`fencepost bench --queues`: the real command as a subprocess on this
test's fresh database, its workers draining a queue limited per key and an
unlimited one; the test checks the JSON line it prints and what it left in
the database. (Small numbers: the figures themselves are the command's to
measure, not this test's.)"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from app.tools.bench import QUEUE_ROUNDS
from tests.support.processes import REPO_ROOT


def bench(database_url: str | None, *args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("FENCEPOST_") and k != "DATABASE_URL"}
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    return subprocess.run([sys.executable, "-m", "app.cli", "bench", *args], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.acceptance
@pytest.mark.timeout(240)
async def test_bench_queues_prints_both_rates_and_their_ratio(database_url, pool):
    proc = await asyncio.to_thread(
        bench, database_url, "--queues", "--queue-executions", "200", "--queue-keys", "10",
        "--workers", "2", "--concurrency", "8", timeout=220)
    report = f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-5000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and len(lines) == 1, report
    print(lines[0])
    line = json.loads(lines[0])
    assert (line["benchmark"], line["mode"]) == ("fencepost", "queues")
    assert (line["executions"], line["queue_keys"], line["per_key_concurrency"]) == (200, 10, 2)
    unlimited = line["executions_per_second_unlimited"]
    limited = line["executions_per_second_per_key_limited"]
    assert unlimited > 0 and limited > 0, line
    assert line["per_key_limited_ratio"] == pytest.approx(limited / unlimited, abs=0.02), line
    assert line["executions_per_claim_unlimited"] >= 1, line
    assert line["executions_per_claim_per_key_limited"] >= 1, line

    # Every execution of both queues ran to completion, each keyed one under its key.
    counts = {r["queue"]: (r["n"], r["keys"]) for r in await pool.fetch(
        "SELECT queue, count(*) FILTER (WHERE status = 'completed') AS n, "
        "count(DISTINCT concurrency_key) AS keys FROM executions GROUP BY queue")}
    assert counts == {"bench-free": (200, 0), "bench-keyed": (200, 10)}, counts
    # The per-key limit was set for the limited rounds only, and the queues
    # are left as their code declares them (no run-time setting, not paused).
    changes = [r["change"] for r in await pool.fetch(
        "SELECT change FROM queue_changes WHERE queue = 'bench-keyed' AND actor = 'bench' "
        "ORDER BY change_id")]
    limited_rounds = [c for c in changes if c["set"].get("per_key_concurrency") == 2]
    assert len(limited_rounds) == QUEUE_ROUNDS, changes
    for queue in ("bench-free", "bench-keyed"):
        row = await pool.fetchrow("SELECT override FROM queues WHERE name = $1", queue)
        assert row["override"] == {}, (queue, row)


def test_bench_queues_refuses_non_positive_sizes():
    proc = bench(None, "--queues", "--queue-keys", "0", timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--queue-keys" in proc.stdout
