"""The client's move_version / move_versions (sync and async) and the CLI's
`fencepost executions move-version` / `move-versions`, against the real app
served by uvicorn (carrying version 2's code) on the test database. The CLI
runs as a subprocess, as an operator runs it."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from app.client import (
    ANY_VERSION,
    AsyncClient,
    Client,
    ExecutionNotFound,
    ExecutionRunning,
    InvalidRequest,
    ReplayCheckUnavailable,
    ReplayDiverges,
)
from tests.support.claims import claim_one
from tests.support.live_server import ServerThread, server_factory
from tests.support.processes import REPO_ROOT
from tests.versions import flows
from tests.versions.conftest import admit


@pytest_asyncio.fixture
async def make_server(vm_settings) -> AsyncIterator:
    async with server_factory(vm_settings, flows.V2, name="versions-test-server") as make:
        yield make


@pytest_asyncio.fixture
async def server(make_server) -> ServerThread:
    return await make_server()


async def fencepost(server: ServerThread, *args: str) -> tuple[int, str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FENCEPOST_")}
    environ["FENCEPOST_URL"] = server.base
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "app.cli", *args, cwd=REPO_ROOT, env=environ,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=90)
    return proc.returncode, out.decode(), err.decode()


async def test_the_sync_client_moves_and_raises_by_code(server, store, suspended) -> None:
    await suspended("k1", "k2")
    await admit(store, "k-held")
    await claim_one(store, "k-held")

    def calls() -> None:
        with Client(server.base) as fp:
            moved = fp.move_version("k1", "2", reason="deploy 2")
            assert moved["check"] == "passed" and moved["from"] == "1" and moved["to"] == "2"
            with pytest.raises(ReplayCheckUnavailable):
                fp.move_version("k2", "9")
            assert fp.move_version("k2", "9", force=True)["check"] == "skipped"
            with pytest.raises(ExecutionRunning):
                fp.move_version("k-held", "2")
            with pytest.raises(ExecutionNotFound):
                fp.move_version("nobody", "2")
            answer = fp.move_versions("2", "vm-order", from_version="9", dry_run=True)
            assert answer == {"moved": ["k2"], "refused": [], "matched": 1, "more": False,
                              "dryRun": True}
            with pytest.raises(InvalidRequest):
                fp.move_versions("2", "vm-order", limit=0)

    await asyncio.to_thread(calls)
    assert (await store.history.get("k1"))["code_version"] == "2"
    assert (await store.history.get("k2"))["code_version"] == "9"


async def test_the_async_client_reports_a_divergence(make_server, store, suspended) -> None:
    await suspended("k3", "k4")
    srv = await make_server(workflows=flows.V3)
    async with AsyncClient(srv.base) as fp:
        with pytest.raises(ReplayDiverges) as diverges:
            await fp.move_version("k3", "3")
        assert diverges.value.details["divergence"]["asked"] == "check"
        answer = await fp.move_versions("3", "vm-order", from_version=ANY_VERSION,
                                        statuses=["suspended"], ids=["k3", "k4"], limit=10)
        assert answer["moved"] == []
        assert [r["code"] for r in answer["refused"]] == ["REPLAY_DIVERGES"] * 2
        answer = await fp.move_versions(None, "vm-order", force=True, reason="rollback")
        assert answer["moved"] == ["k3", "k4"]
    assert (await store.history.get("k4"))["code_version"] is None


async def test_the_cli_moves_one_and_many(server, store, suspended) -> None:
    await suspended("k5", "k6", "k7")
    rc, out, err = await fencepost(server, "executions", "move-version", "k5", "--to", "2",
                                   "--json")
    assert rc == 0, err
    assert json.loads(out)["check"] == "passed"
    rc, out, err = await fencepost(server, "executions", "move-version", "k6", "--to", "5")
    assert rc == 1 and "error: REPLAY_CHECK_UNAVAILABLE: " in err and "fencepost replay" in err
    rc, out, err = await fencepost(server, "executions", "move-version", "k6", "--to", "5",
                                   "--force")
    assert rc == 0, err
    assert "check:" in out and "skipped" in out
    rc, out, err = await fencepost(server, "executions", "move-version", "k6")
    assert rc == 2 and "--to" in err  # one of --to / --unversioned is required

    rc, out, err = await fencepost(server, "executions", "move-versions", "--workflow",
                                   "vm-order", "--to", "2", "--from-version", "1", "--json")
    assert rc == 0, err
    assert json.loads(out)["moved"] == ["k7"]
    rc, out, err = await fencepost(server, "executions", "move-versions", "--workflow",
                                   "vm-order", "--to", "2", "--status", "suspended",
                                   "--dry-run")
    assert rc == 0, err
    # k6 (version 5) is checked against version 2's code too: it fits, so it would move.
    assert "matched:" in out and "dryRun:" in out
    rc, out, err = await fencepost(server, "executions", "move-versions", "--workflow",
                                   "vm-order", "--unversioned", "--ids", "k5,k6")
    assert rc == 0, err
    assert "REFUSED EXECUTION" in out and "REPLAY_CHECK_UNAVAILABLE" in out
    assert (await store.history.get("k7"))["code_version"] == "2"
    assert (await store.history.get("k6"))["code_version"] == "5"
