"""Issue 20, item 3: the alert rules ship tested, and Prometheus accepts what
fencepost exposes. `promtool` (Debian's `prometheus` package; `make test`
installs it when missing) checks deploy/prometheus/alerts.yml, runs its unit
tests (alerts_test.yml: every alert fires when it should, and not before),
and lints the live /metrics output of a real API process and a real worker's
--metrics-port."""

from __future__ import annotations

import re
import shutil
import subprocess

import asyncpg
import httpx
import pytest

from tests.support.api_process import ApiProcess, free_port
from tests.support.processes import REPO_ROOT, is_registered, spawn_worker
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

RULES = REPO_ROOT / "deploy" / "prometheus"


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    exe = shutil.which("promtool")
    assert exe, "promtool is missing: `make promtool` (apt-get install prometheus)"
    return subprocess.run([exe, *args], input=stdin, capture_output=True, text=True,
                          timeout=60, cwd=RULES)


def test_the_alert_rules_are_valid_and_pass_their_unit_tests() -> None:
    checked = promtool("check", "rules", "alerts.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", "alerts_test.yml")
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


def test_every_alert_has_a_unit_test() -> None:
    rules = (RULES / "alerts.yml").read_text()
    tests = (RULES / "alerts_test.yml").read_text()
    alerts = set(re.findall(r"^\s*- alert: (\w+)$", rules, re.M))
    tested = set(re.findall(r"^\s*alertname: (\w+)$", tests, re.M))
    assert len(alerts) >= 7 and alerts == tested, alerts ^ tested
    # Each is also seen firing (an exp_alerts entry with labels), not only silent.
    for alert in alerts:
        assert re.search(rf"alertname: {alert}\n\s*exp_alerts:\n\s*- exp_labels", tests), alert


async def test_promtool_accepts_the_live_metrics_of_the_api_and_a_worker(
        database_url: str, pool: asyncpg.Pool, tmp_path) -> None:
    api = ApiProcess(database_url, tmp_path, env={"FENCEPOST_AUTH": "disabled",
                                                  "FENCEPOST_WORKFLOWS":
                                                  "tests.maintenance.flows"})
    port = free_port()
    worker = spawn_worker("prom", database_url=database_url, flows_module="tests.maintenance.flows",
                          log_dir=tmp_path, worker_id="prom-worker", concurrency=2,
                          settings={},
                          args=("--metrics-port", str(port)))
    try:
        await api.wait_ready()
        async with httpx.AsyncClient(timeout=10) as client:
            r = await client.post(f"{api.base}/v1/executions",
                                  json={"workflowId": "mnt-ok", "params": {}},
                                  headers={"host": "localhost"})
            assert r.status_code == 201, r.text
            await wait_until(lambda: is_registered(pool, worker), timeout=30,
                             what="the worker registered")
            for url, host in ((f"{api.base}/metrics", "localhost"),
                              (f"http://127.0.0.1:{port}/metrics", "127.0.0.1")):
                text = (await client.get(url, headers={"host": host})).text
                assert "fencepost_" in text and "_created" not in text, text[:500]
                linted = promtool("check", "metrics", stdin=text)
                assert linted.returncode == 0 and not linted.stdout.strip(), (
                    url, linted.stdout, linted.stderr)
    finally:
        worker.kill()
        api.stop()
