"""Issue 20, item 6: a worker ID held by a live worker is refused, clearly (one
line, exit 2, naming the holder); a dead holder's ID (this host, its process
gone) or a stopped one's is taken; GET /v1/workers shows each worker's leases
held, deliveries in flight, capacity and its true (latest) start time."""

from __future__ import annotations

import signal
from datetime import datetime

import asyncpg
import httpx
import pytest

from app.store import ExecutionStore
from tests.operator.procs import Procs
from tests.support.admission import admit

pytestmark = pytest.mark.timeout(90)


async def test_an_id_held_by_a_live_worker_is_refused(procs: Procs, pool: asyncpg.Pool) -> None:
    holder = await procs.start("A")
    twin = procs.spawn("A")  # the same --worker-id op-worker-A
    assert await twin.wait_exit(30) == 2, twin.log()
    lines = twin.log().strip().splitlines()
    refusal = [line for line in lines if "op-worker-A" in line and "error:" in line]
    assert len(refusal) == 1, twin.log()
    assert "already held by a live worker" in refusal[0] and f"pid {holder.pid}" in refusal[0]
    assert "Traceback" not in twin.log()
    assert holder.alive()
    row = await pool.fetchrow("SELECT pid, stopped_at FROM workers WHERE worker_id = 'op-worker-A'")
    assert (row["pid"], row["stopped_at"]) == (holder.pid, None)  # the holder's row untouched

    # Killed: its process is gone on this host, so its ID is free at once.
    holder.send(signal.SIGKILL)
    await holder.wait_exit(10)
    successor = await procs.start("A")
    assert successor.alive() and successor.pid != holder.pid


async def test_the_workers_list_shows_leases_in_flight_capacity_and_start(
        store: ExecutionStore, pool: asyncpg.Pool, api: httpx.AsyncClient) -> None:
    await store.workers.register_worker("w-1", host="h", pid=1, workflows=["op-quick"], concurrency=4)
    for eid in ("wi-1", "wi-2", "wi-3"):
        await admit(store, "op-quick", eid)
    await store.leases.claim_due(2, 30, "w-1")
    # One of its two leases expired (the holder stopped renewing it).
    await pool.execute("UPDATE executions SET lease_expires_at = now() - interval '1 second' "
                       "WHERE execution_id = (SELECT min(execution_id) FROM executions "
                       "WHERE lease_owner = 'w-1')")
    [w] = (await api.get("/v1/workers")).json()["workers"]
    assert (w["leasesHeld"], w["inFlight"], w["capacity"]) == (1, 2, 4), w

    first_start = datetime.fromisoformat(w["startedAt"])
    await store.workers.worker_stopped("w-1")
    await pool.execute("UPDATE workers SET started_at = started_at - interval '1 hour'")
    await store.workers.register_worker("w-1", host="h", pid=2, workflows=["op-quick"], concurrency=8)
    [w] = (await api.get("/v1/workers")).json()["workers"]
    assert datetime.fromisoformat(w["startedAt"]) >= first_start, w  # this start, not the first
    assert (w["pid"], w["capacity"], w["alive"]) == (2, 8, True)
