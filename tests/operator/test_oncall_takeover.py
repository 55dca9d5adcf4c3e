"""Issue 20: a kill -9 takeover as on-call sees it, with real worker
processes. Worker A holds an execution and is killed; worker B (with
--metrics-port) ends the expired lease, by its claim or its reaper, and
counts the takeover exactly once; its log says who held the lease and who
took it over, with the token."""

from __future__ import annotations

import json
import re
import signal

import asyncpg
import httpx
import pytest

from app.store import ExecutionStore
from tests.operator.procs import Procs
from tests.support.admission import admit
from tests.support.api_process import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(90)


def takeovers(text: str) -> float:
    return sum(float(v) for v in re.findall(
        r'^fencepost_lease_takeovers_total\{by="(?:claim|reaper)"\} ([0-9.e+-]+)$', text, re.M))


async def test_a_kill_9_takeover_is_counted_once_and_logged(
        procs: Procs, store: ExecutionStore, pool: asyncpg.Pool) -> None:
    a = await procs.start("A", concurrency=1)
    eid = await admit(store, "op-quick", "k9")  # blocks at its gate in A for good
    await wait_until(lambda: pool.fetchval(
        "SELECT lease_owner = 'op-worker-A' FROM executions WHERE execution_id = $1", eid),
        timeout=20, what="A holds k9")
    a.send(signal.SIGKILL)
    await a.wait_exit(10)

    port = free_port()
    b = await procs.start("B", concurrency=1, args=("--metrics-port", str(port)))
    await wait_until(lambda: pool.fetchval(
        "SELECT lease_owner = 'op-worker-B' FROM executions WHERE execution_id = $1", eid),
        timeout=20, what="B holds k9")
    expired = await pool.fetch("SELECT token, detail FROM execution_events "
                               "WHERE execution_id = $1 AND kind = 'lease_expired'", eid)
    assert len(expired) == 1 and expired[0]["detail"]["owner"] == "op-worker-A", expired
    async with httpx.AsyncClient(timeout=5) as client:
        text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
    assert takeovers(text) == 1, text
    print("\n".join(line for line in text.splitlines()  # shown with pytest -s
                    if line.startswith(("fencepost_lease_takeovers_total", "fencepost_claims"))))
    assert "_created" not in text

    lines = [json.loads(line) for line in b.log().splitlines() if line.startswith("{")]
    [taken] = [r for r in lines if r.get("kind") == "lease_takeover"]
    print(json.dumps(taken))
    assert (taken["execution_id"], taken["old_owner"], taken["token"]) == (
        eid, "op-worker-A", expired[0]["token"]), taken
    assert taken["new_owner"] in ("op-worker-B", None), taken
