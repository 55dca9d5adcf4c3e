"""`fencepost dev` as a person uses it: a real `fencepost dev` process on a
throw-away embedded data dir and a free port. Killing one worker child restarts
that worker (logged with its worker ID) while the API and the other worker keep
running; the banner prints the embedded DATABASE_URL and suggests a workflow that
is actually loaded."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.support.processes import REPO_ROOT
from tests.support.waiting import wait_until_sync

START_TIMEOUT = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _poll(condition, timeout: float, what: str, log=lambda: ""):
    return wait_until_sync(condition, timeout=timeout, what=what, interval=0.05,
                           detail=lambda: f"--- dev output ---\n{log()}")


class DevProcess:
    def __init__(self, tmp: Path, port: int, env_extra: dict[str, str]):
        self.port = port
        self.out_path = tmp / "dev.log"
        self._out = open(self.out_path, "w")  # noqa: SIM115 - closed in stop()
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "FENCEPOST_WORKFLOWS")}
        env.update(env_extra)
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "dev", "--data-dir", str(tmp / "pgdata"),
             "--port", str(port), "--workers", "2", "--concurrency", "2"],
            cwd=REPO_ROOT, env=env, stdout=self._out, stderr=subprocess.STDOUT,
        )
        self.psproc = psutil.Process(self.proc.pid)

    def output(self) -> str:
        self._out.flush()
        return self.out_path.read_text(errors="replace")

    def workers(self) -> dict[str, psutil.Process]:
        """worker ID -> live child process running `fencepost worker`."""
        found = {}
        for child in self.psproc.children():
            with contextlib.suppress(psutil.Error):
                cmd = child.cmdline()
                if "worker" in cmd and "--worker-id" in cmd and child.status() != psutil.STATUS_ZOMBIE:
                    found[cmd[cmd.index("--worker-id") + 1]] = child
        return found

    def api(self) -> psutil.Process | None:
        for child in self.psproc.children():
            with contextlib.suppress(psutil.Error):
                if "api" in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                    return child
        return None

    def api_answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as r:
                return r.status == 200
        except Exception:
            return False

    def stop(self) -> None:
        children = []
        with contextlib.suppress(psutil.Error):
            children = self.psproc.children(recursive=True)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for child in children:  # only what this dev process started
            with contextlib.suppress(psutil.Error):
                if child.is_running():
                    child.kill()
        self._out.close()


@pytest.fixture
def dev_process():
    started: list[DevProcess] = []
    tmp = Path(tempfile.mkdtemp(prefix="fpdev", dir="/tmp"))

    def start(**env_extra: str) -> DevProcess:
        dev = DevProcess(tmp, _free_port(), env_extra)
        started.append(dev)
        return dev

    yield start
    for dev in started:
        dev.stop()
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)


def _wait_ready(dev: DevProcess) -> None:
    _poll(lambda: len(dev.workers()) == 2 and dev.api_answers(), START_TIMEOUT,
          "two workers and the API", dev.output)


def _post(dev: DevProcess, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{dev.port}{path}", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def _get(dev: DevProcess, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{dev.port}{path}", timeout=5) as r:
        return json.loads(r.read())


def test_killed_worker_is_restarted_and_the_rest_keeps_running(dev_process):
    # The author's own module beside the examples, as the README shows.
    dev = dev_process(FENCEPOST_WORKFLOWS="app.examples,tests.dev.flows")
    _wait_ready(dev)
    workers = dev.workers()
    api = dev.api()
    (victim_id, victim), (other_id, other) = sorted(workers.items())
    victim.send_signal(signal.SIGKILL)

    # The same worker ID comes back in a new process; the log names it.
    def restarted():
        now = dev.workers()
        return victim_id in now and now[victim_id].pid != victim.pid and now[victim_id]

    _poll(restarted, 60, f"worker {victim_id} restarted", dev.output)
    out = dev.output()
    assert re.search(rf"worker {re.escape(victim_id)} .*restart", out), out
    # Nothing else was stopped: dev, the API and the other worker are the same processes.
    assert dev.proc.poll() is None, dev.output()
    assert dev.api().pid == api.pid
    assert dev.workers()[other_id].pid == other.pid
    assert dev.api_answers()
    # And it works: the author's workflow runs to completion on the workers.
    _post(dev, "/v1/executions", {"workflowId": "dev-hello", "executionId": "hello-1",
                                  "params": {"name": "dev"}})
    done = _poll(lambda: (r := _get(dev, "/v1/executions/hello-1"))["status"] == "completed" and r,
                 30, "hello-1 completed", dev.output)
    assert done["outcome"]["result"] == {"hello": "dev"} or done.get("result") == {"hello": "dev"}, done


def test_banner_prints_embedded_database_url_and_a_loaded_workflow(dev_process):
    dev = dev_process(FENCEPOST_WORKFLOWS="tests.dev.flows")
    _wait_ready(dev)
    out = dev.output()
    match = re.search(r"DATABASE_URL=(\S+)", out)
    assert match, out
    url = match.group(1).strip("'\"")
    import asyncio

    import asyncpg

    async def probe() -> int:
        conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            return await conn.fetchval("SELECT 1")
        finally:
            await conn.close()

    assert asyncio.run(probe()) == 1
    banner = out.split("Ctrl-C")[0]
    assert "charge-order" not in banner, banner
    assert "dev-hello" in banner, banner
