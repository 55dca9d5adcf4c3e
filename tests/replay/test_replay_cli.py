"""`fencepost replay` as CI runs it: a subprocess (`python -m app.cli replay`)
loading a deploy's workflow module (tests/replay/deploy_*.py, whose step
functions exit the process with STEP_RAN_EXIT if called), reading histories
from a real API server (uvicorn on the per-test database) that real
in-process workers recorded. Exit 0 when every history fits, 1 on any
divergence, 2 for usage and connection errors."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from tests.replay.conftest import WORKFLOWS
from tests.replay.steps import STEP_RAN_EXIT
from tests.support.admission import admit
from tests.support.live_server import ServerThread, server_factory
from tests.support.processes import REPO_ROOT
from tests.support.waiting import wait_until

DEPLOY = "tests.replay.deploy_"


@dataclass
class Run:
    rc: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)


@pytest_asyncio.fixture
async def server(replay_settings) -> AsyncIterator[ServerThread]:
    async with server_factory(replay_settings, WORKFLOWS, name="replay-cli-server") as make:
        yield await make()


@pytest.fixture
def fencepost(server):
    async def run(*args: str, url: str | None = None) -> Run:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("FENCEPOST_")}
        environ["FENCEPOST_URL"] = url or server.base
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "app.cli", "replay", *args, cwd=REPO_ROOT, env=environ,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), timeout=90)
        run = Run(proc.returncode, out.decode(), err.decode())
        assert run.rc != STEP_RAN_EXIT, f"a step function ran during the replay: {run}"
        return run

    return run


async def test_each_change_is_judged_by_exit_code_and_line(recorded, fencepost) -> None:
    await recorded("o-1")
    for change in ("appended", "patched"):
        run = await fencepost("--workflows", DEPLOY + change, "--execution", "o-1")
        assert (run.rc, run.out) == (0, "ok  o-1  (replayed 6 steps, frontier)\n"), run
    for change, position, message in (
        ("inserted", 1, "the history recorded step 'charge', but the code now asks for 'fraud'"),
        ("removed", 2, "the history recorded step 'book', but the code now asks for 'kid'"),
        ("reordered", 1, "the history recorded step 'charge', but the code now asks for 'book'"),
        ("returns_early", 3, "the code returned without asking for 'kid'"),
    ):
        run = await fencepost("--workflows", DEPLOY + change, "--execution", "o-1")
        assert run.rc == 1, run
        assert run.out.startswith(f"DIVERGES  o-1  at position {position}: "), run
        assert message in run.out, run


async def test_sample_takes_executions_in_flight_and_json_reports_each(
        recorded, fencepost, store, workers) -> None:
    worker = await workers.start()
    await admit(store, "rp-short", "s-1")  # ends: not sampled

    async def completed() -> bool:
        return (await store.history.get("s-1"))["status"] == "completed"

    await wait_until(completed, timeout=20, what="s-1 completed")
    await workers.stop(worker)
    await recorded("o-1")
    await recorded("o-2", n=2)
    run = await fencepost("--workflows", DEPLOY + "appended", "--sample", "10")
    assert run.rc == 0 and sorted(run.out.splitlines()) == [
        "ok  o-1  (replayed 6 steps, frontier)", "ok  o-2  (replayed 6 steps, frontier)"], run
    run = await fencepost("--workflows", DEPLOY + "inserted", "--sample", "1",
                          "--workflow", "rp-order", "--json")
    assert run.rc == 1, run
    answer = run.json()
    assert answer["ok"] is False and len(answer["reports"]) == 1
    [report] = answer["reports"]
    assert report["executionId"] == "o-2"  # the newest
    assert (report["ok"], report["replayed"], report["end"]) == (False, 1, "raised")
    assert {k: report["divergence"][k] for k in ("position", "recorded", "asked")} == \
        {"position": 1, "recorded": "charge", "asked": "fraud"}


async def test_file_histories(recorded, fencepost, server, tmp_path: Path) -> None:
    await recorded("o-1")
    async with server.client() as http:
        document = (await http.get("/v1/executions/o-1/history")).json()
    one, both = tmp_path / "one.json", tmp_path / "list.json"
    one.write_text(json.dumps(document))
    both.write_text(json.dumps([document, {**document, "executionId": "o-copy"}]))
    run = await fencepost("--workflows", DEPLOY + "appended", "--file", str(one),
                          url="http://127.0.0.1:9")  # no server is needed
    assert (run.rc, run.out) == (0, "ok  o-1  (replayed 6 steps, frontier)\n"), run
    run = await fencepost("--workflows", DEPLOY + "removed", "--file", str(both))
    assert run.rc == 1 and len(run.out.splitlines()) == 2, run
    assert all(line.startswith("DIVERGES  o-") for line in run.out.splitlines()), run
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**document, "format": "fencepost-history/0"}))
    run = await fencepost("--workflows", DEPLOY + "appended", "--file", str(bad))
    assert run.rc == 2 and "is not 'fencepost-history/1'" in run.err, run
    bad.write_text("{not json")
    run = await fencepost("--workflows", DEPLOY + "appended", "--file", str(bad))
    assert run.rc == 2 and "is not JSON" in run.err, run


async def test_usage_and_connection_errors_exit_2(recorded, fencepost) -> None:
    await recorded("o-1")
    run = await fencepost("--workflows", DEPLOY + "appended", "--execution", "nobody")
    assert run.rc == 2 and "EXECUTION_NOT_FOUND" in run.err, run
    run = await fencepost("--workflows", DEPLOY + "appended", "--execution", "o-1",
                          url="http://127.0.0.1:9")
    assert run.rc == 2 and "cannot reach fencepost at http://127.0.0.1:9" in run.err, run
    run = await fencepost("--workflows", "tests.replay.no_such_module", "--execution", "o-1")
    assert run.rc == 2 and "cannot import --workflows" in run.err, run
    run = await fencepost("--workflows", DEPLOY + "appended", "--sample", "1",
                          "--workflow", "rp-nothing")
    assert run.rc == 2 and "--workflow 'rp-nothing' is not defined" in run.err, run
    run = await fencepost("--workflows", "tests.replay.deploy_appended", "--execution", "o-1",
                          "--file", "x.json")
    assert run.rc == 2 and "not allowed with argument" in run.err, run
