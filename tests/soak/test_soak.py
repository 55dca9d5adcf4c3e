"""The one-minute soak: the real `fencepost soak` command as a subprocess, on
this test's fresh database (the session's test Postgres), with its API and
worker processes. Workers are SIGKILLed every 3 s (and, every 10 s, one is
SIGSTOPped for longer than a lease so its writes go stale); the command
verifies the invariants from the events itself, and this test checks its
exit code and the JSON line it prints."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.acceptance
@pytest.mark.timeout(240)
async def test_one_minute_soak_keeps_every_invariant(database_url, tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("FENCEPOST_") and k != "DATABASE_URL"}
    env["DATABASE_URL"] = database_url
    argv = [sys.executable, "-m", "app.cli", "soak", "--duration", "60", "--pause-every", "10",
            "--logs", str(tmp_path / "logs")]
    proc = await asyncio.to_thread(
        subprocess.run, argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
        timeout=220,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    report = f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-12000:]}"
    assert len(lines) == 1, report
    print(lines[0])  # the soak's JSON line, for the record (pytest -s shows it)
    line = json.loads(lines[0])
    assert proc.returncode == 0, report
    assert line["soak"] == "fencepost"
    assert line["admissions"] > 0, report
    assert line["completions"] == line["admissions"], report
    assert line["non_terminal"] == 0, report
    assert line["kills"] >= 10, report
    assert line["leases_taken_over"] >= 1, report
    assert line["stale_writes_accepted"] == 0, report
    assert line["steps_recorded_more_than_once"] == 0, report
    assert line["admission_errors"] == 0, report
    assert line["unexpected_worker_exits"] == 0, report
    assert line["pauses"] >= 1, report
    assert line["admission_p99_ms"] is not None and line["admission_p99_ms"] > 0, report
    assert line["ok"] is True and line["failed"] == [], report
