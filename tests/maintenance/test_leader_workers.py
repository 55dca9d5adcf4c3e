"""Maintenance with a leader, with real `fencepost worker` processes: of two
workers exactly one runs the sweeps (reaper, retention, bulk operations) and
the scheduler; SIGKILL the leader and the other takes over within about the
lease ttl; SIGSTOP the leader past the ttl and the other takes over, and
once continued the old leader finds its term over and sweeps no more.

Who sweeps is read from each worker's own /metrics
(fencepost_maintenance_last_success_timestamp_seconds{task}: set at the end
of every pass, absent in a worker that never ran one), who leads from
`maintenance_leases`, and each worker's own view of it from its
fencepost_maintenance_leader{role} gauge (1 on the holder, 0 elsewhere)."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import asyncpg
import httpx
import pytest

from app.maintenance import SWEEPS
from tests.support.api_process import free_port
from tests.support.processes import WorkerProcess, is_registered, spawn_worker
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

FLOWS_MODULE = "tests.maintenance.flows"
TTL = 2.0
SETTINGS = {
    "FENCEPOST_LEASE_SECONDS": "2",
    "FENCEPOST_RENEW_SECONDS": "0.5",
    "FENCEPOST_POLL_SECONDS": "0.2",
    "FENCEPOST_SHUTDOWN_GRACE_SECONDS": "2",
    "FENCEPOST_CONNECT_TIMEOUT_SECONDS": "2",
    "FENCEPOST_MAINTENANCE_LEASE_SECONDS": str(TTL),
    "FENCEPOST_SCHEDULER_INTERVAL_SECONDS": "0.5",
}
# The reaper's pass interval with a 2 s execution lease: min(lease / 2, 5 s).
REAPER_INTERVAL = 1.0


class Worker:
    def __init__(self, proc: WorkerProcess, metrics_port: int):
        self.proc = proc
        self.port = metrics_port

    @property
    def worker_id(self) -> str:
        return self.proc.worker_id

    async def _sample(self, metric: str, label: str, value: str) -> float | None:
        async with httpx.AsyncClient(timeout=5) as client:
            text = (await client.get(f"http://127.0.0.1:{self.port}/metrics")).text
        found = re.search(rf'^{metric}\{{{label}="{re.escape(value)}"\}} (\S+)$', text, re.M)
        return float(found.group(1)) if found else None

    async def last_pass(self, task: str) -> float | None:
        """When this worker last finished a `task` pass (None: never)."""
        return await self._sample(
            "fencepost_maintenance_last_success_timestamp_seconds", "task", task)

    async def leads(self, role: str) -> float | None:
        """This worker's fencepost_maintenance_leader gauge for `role`."""
        return await self._sample("fencepost_maintenance_leader", "role", role)


@pytest.fixture
async def start(database_url: str, pool: asyncpg.Pool,
                tmp_path: Path) -> AsyncIterator[Callable[[str], Awaitable[Worker]]]:
    started: list[Worker] = []

    async def start_worker(name: str) -> Worker:
        port = free_port()
        proc = spawn_worker(name, database_url=database_url, flows_module=FLOWS_MODULE,
                            log_dir=tmp_path, worker_id=f"lead-{name}", concurrency=2,
                            settings=SETTINGS, args=("--metrics-port", str(port)))
        worker = Worker(proc, port)
        started.append(worker)
        await wait_until(lambda: is_registered(pool, proc), timeout=30,
                       what=f"worker {name} registered")
        return worker

    yield start_worker
    for w in started:
        w.proc.kill()
        print(f"===== {w.proc.name} =====\n{w.proc.log()}")  # shown when the test fails


async def holder(pool: asyncpg.Pool, role: str) -> tuple[str, int] | None:
    row = await pool.fetchrow("SELECT holder, token FROM maintenance_leases "
                              "WHERE role = $1 AND expires_at > now()", role)
    return (row["holder"], row["token"]) if row else None


async def advanced(worker: Worker, task: str, since: float | None) -> bool:
    last = await worker.last_pass(task)
    return last is not None and (since is None or last > since)


def taken_lines(worker: Worker) -> list[str]:
    return [line for line in worker.proc.log().splitlines()
            if f"maintenance role '{SWEEPS}' taken" in line]


async def test_of_two_workers_exactly_one_runs_the_sweeps_and_the_scheduler(
        start, pool: asyncpg.Pool):
    a = await start("A")
    b = await start("B")
    by_id = {a.worker_id: a, b.worker_id: b}
    leader_id, _ = await wait_until(lambda: holder(pool, SWEEPS), timeout=10, what="a leader")
    leader = by_id[leader_id]
    follower = b if leader is a else a
    roles = await pool.fetch("SELECT role, holder FROM maintenance_leases")
    assert len(roles) == 2, roles  # sweeps, and the schedules of tests.maintenance.flows
    schedules_leader = by_id[next(r["holder"] for r in roles if r["role"] != SWEEPS)]

    # The leader sweeps twice more while the follower never runs a pass.
    first = await wait_until(lambda: leader.last_pass("reaper"), timeout=10, what="a reaper pass")
    await wait_until(lambda: advanced(leader, "reaper", first), timeout=10,
                   what="a second reaper pass")
    await wait_until(lambda: advanced(schedules_leader, "scheduler", None), timeout=10,
                   what="a scheduler pass")
    assert await follower.last_pass("reaper") is None
    assert await follower.last_pass("retention") is None
    if schedules_leader is leader:
        assert await follower.last_pass("scheduler") is None
    assert taken_lines(leader) and not taken_lines(follower)
    assert await holder(pool, SWEEPS) == (leader_id, 1)
    # Each worker's gauge says whether it holds each role.
    schedules_role = next(r["role"] for r in roles if r["role"] != SWEEPS)
    assert (await leader.leads(SWEEPS), await follower.leads(SWEEPS)) == (1, 0)
    for w in (a, b):
        assert await w.leads(schedules_role) == (1 if w is schedules_leader else 0)


async def test_sigkill_the_leader_and_the_other_takes_over_within_the_ttl(
        start, pool: asyncpg.Pool):
    a = await start("A")
    await wait_until(lambda: advanced(a, "reaper", None), timeout=10, what="A sweeping")
    b = await start("B")
    assert (await holder(pool, SWEEPS))[0] == a.worker_id
    assert await b.last_pass("reaper") is None

    a.proc.signal(signal.SIGKILL)
    await a.proc.wait_exit(10)
    killed = time.monotonic()
    await wait_until(lambda: advanced(b, "reaper", None), timeout=3 * TTL, what="B sweeping")
    took = time.monotonic() - killed
    assert await holder(pool, SWEEPS) == (b.worker_id, 2)
    # Within the ttl, one renewal interval of B and one reaper interval (plus slack).
    assert took < TTL + TTL / 3 + REAPER_INTERVAL + 1.5, took
    print(f"B swept {took:.2f}s after A was killed (ttl {TTL}s)")


async def test_a_paused_leader_loses_the_role_and_stops_sweeping_once_continued(
        start, pool: asyncpg.Pool):
    a = await start("A")
    await wait_until(lambda: advanced(a, "reaper", None), timeout=10, what="A sweeping")
    b = await start("B")

    a.proc.signal(signal.SIGSTOP)
    await wait_until(lambda: advanced(b, "reaper", None), timeout=4 * TTL,
                   what="B sweeping while A is stopped")
    assert await holder(pool, SWEEPS) == (b.worker_id, 2)

    a.proc.signal(signal.SIGCONT)
    await wait_until(lambda: "role 'sweeps' lost" in a.proc.log(),
                   timeout=10, what="A noticing its term is over")
    a_last = await a.last_pass("reaper")
    # B sweeps twice more; A, continued and checking before each pass, not once.
    b_last = await b.last_pass("reaper")
    for _ in range(2):
        await wait_until(lambda since=b_last: advanced(b, "reaper", since), timeout=10,
                       what="B sweeping on")
        b_last = await b.last_pass("reaper")
    assert await a.last_pass("reaper") == a_last
    assert await holder(pool, SWEEPS) == (b.worker_id, 2)
    assert (await a.leads(SWEEPS), await b.leads(SWEEPS)) == (0, 1)
    assert a.proc.alive()
