"""A rolling deploy with real processes (issue 16, acceptance): executions
admitted under code version 1 wait (for a signal, as for days) while version
2 ships; new admissions record version 2 and run on v2 workers only; the old
ones keep running on v1 workers only; with every v1 worker stopped the old
ones wait, claimed by nobody, while v2 workers keep claiming, and their
`blockedBy` reads `no-worker-for-version` (workflowId, version); a v1 worker
started again finishes them. An unversioned workflow's executions run on
whichever worker carries it.

Processes: `fencepost worker` and `fencepost api`, with the code version read
at import of tests/worker_processes/rollingflows.py from ROLL_CODE_VERSION.
Who ran what is read from the claim events (`claimed {owner}`) and from the
recorded step values (each names the version and pid that ran it)."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from app.shared_settings import SHARED
from tests.support.api_process import ApiProcess
from tests.support.harness import (
    DEFAULT_SETTINGS,
    Harness,
    WorkerProcess,
    opened,
    pytest_runtest_makereport,  # noqa: F401 - the report hook `opened` reads
    spawn_worker,
)

pytestmark = pytest.mark.acceptance

FLOWS = "tests.worker_processes.rollingflows"


class RollingHarness(Harness):
    flows_module = FLOWS
    worker_prefix = "roll"

    def spawn_version(self, name: str, version: str, **env: str) -> WorkerProcess:
        """A worker process whose code carries `version` of roll-deploy."""
        w = spawn_worker(
            name, database_url=self.database_url, flows_module=FLOWS, log_dir=self.log_dir,
            worker_id=f"roll-v{version}-{name}", concurrency=4, settings=DEFAULT_SETTINGS,
            extra_env={"ROLL_CODE_VERSION": version, **env})
        self.workers.append(w)
        return w

    async def start_version(self, name: str, version: str, **env: str) -> WorkerProcess:
        w = self.spawn_version(name, version, **env)
        await self.wait_registered(w)
        return w

    def api(self, version: str) -> ApiProcess:
        """An API process whose code carries `version` (it records it at admission)."""
        return ApiProcess(self.database_url, self.log_dir, args=("--workflows", FLOWS), env={
            "FENCEPOST_AUTH": "disabled", "ROLL_CODE_VERSION": version,
            # Settings every process shares must agree with the workers'.
            **{k: v for k, v in DEFAULT_SETTINGS.items() if k in SHARED.values()}})


@pytest_asyncio.fixture
async def roll(database_url, request, tmp_path) -> AsyncIterator[RollingHarness]:
    async with opened(RollingHarness(database_url, tmp_path), request) as h:
        yield h


async def admit_all(c: httpx.AsyncClient, workflow_id: str, ids: list[str]) -> None:
    for eid in ids:
        r = await c.post("/v1/executions", json={"workflowId": workflow_id,
                                                 "executionId": eid, "params": {}})
        assert r.status_code == 201, r.text


async def claimers(h: Harness, eid: str) -> list[str]:
    return [e["detail"]["owner"] for e in await h.events(eid) if e["kind"] == "claimed"]


async def waiting_for_go(h: Harness, eids: list[str]) -> bool:
    for eid in eids:
        rec = await h.record(eid)
        if rec["status"] != "suspended" or (rec["waiting_on"] or {}).get("signal") != "go":
            return False
    return True


async def send_go(h: Harness, eids: list[str]) -> None:
    for eid in eids:
        answer, _ = await h.store.signals.send_signal(eid, "go", {})
        assert answer == "received", (eid, answer)


async def all_completed(h: Harness, eids: list[str]) -> bool:
    return set((await h.statuses(eids)).values()) == {"completed"}


def ran_on(result: dict[str, Any]) -> set[tuple[str, int]]:
    """(version, pid) of every step a roll-deploy result recorded."""
    return {(v["version"], v["pid"]) for v in result.values()}


@pytest.mark.timeout(180)
async def test_rolling_deploy_routes_executions_by_the_code_version_they_started_under(
        roll: RollingHarness) -> None:
    h = roll
    old = [f"old-{i}" for i in range(6)]
    old_early, old_late = old[:3], old[3:]
    new = [f"new-{i}" for i in range(6)]

    # Version 1 is deployed: its API, two v1 workers.
    v1 = [await h.start_version("A", "1"), await h.start_version("B", "1")]
    v1_ids = {w.worker_id for w in v1}
    row = await h.pool.fetchrow("SELECT versions FROM workers WHERE worker_id = $1",
                                v1[0].worker_id)
    assert row["versions"] == {"roll-deploy": "1", "roll-any": None}
    api1 = await h.api("1").wait_ready()
    try:
        async with httpx.AsyncClient(base_url=api1.base, timeout=30) as c:
            await admit_all(c, "roll-deploy", old)
            await admit_all(c, "roll-any", ["any-v1"])
            assert {(await c.get(f"/v1/executions/{eid}")).json()["codeVersion"]
                    for eid in old} == {"1"}
    finally:
        api1.stop()
    await h.wait_for(lambda: waiting_for_go(h, old), timeout=30,
                     what="the old executions waiting for their signal")
    await h.wait_for(lambda: all_completed(h, ["any-v1"]), timeout=20, what="any-v1 done")
    assert (await h.record("any-v1"))["code_version"] is None
    assert set(await claimers(h, "any-v1")) <= v1_ids

    # Version 2 ships beside it: two v2 workers, the v2 API.
    v2 = [await h.start_version("C", "2"), await h.start_version("D", "2")]
    v2_ids = {w.worker_id for w in v2}
    api2 = await h.api("2").wait_ready()
    try:
        async with httpx.AsyncClient(base_url=api2.base, timeout=30) as c:
            await admit_all(c, "roll-deploy", new)
            assert {(await c.get(f"/v1/executions/{eid}")).json()["codeVersion"]
                    for eid in new} == {"2"}
            await h.wait_for(lambda: waiting_for_go(h, new), timeout=30,
                             what="the new executions waiting for their signal")
            # Both kinds become due while both versions' workers run.
            await send_go(h, new + old_early)
            await h.wait_for(lambda: all_completed(h, new + old_early), timeout=30,
                             what="new and old_early completed")
            for eid in new:
                assert set(await claimers(h, eid)) <= v2_ids, eid
                result = (await h.record(eid))["outcome"]["result"]
                assert {v for v, _ in ran_on(result)} == {"2"}, (eid, result)
            for eid in old_early:
                assert set(await claimers(h, eid)) <= v1_ids, eid
                result = (await h.record(eid))["outcome"]["result"]
                assert {v for v, _ in ran_on(result)} == {"1"}, (eid, result)

            # Every v1 worker stops; the remaining old executions fall due.
            for w in v1:
                w.signal(signal.SIGTERM)
            for w in v1:
                assert await w.wait_exit(10) == 0, w.log()
            await send_go(h, old_late)
            # v2 workers keep claiming (a later admission runs; an unversioned
            # one too) while the old executions, due before them, stay unclaimed.
            await admit_all(c, "roll-deploy", ["new-late"])
            await admit_all(c, "roll-any", ["any-v2"])
            await h.wait_for(lambda: waiting_for_go(h, ["new-late"]), timeout=20,
                             what="new-late claimed and waiting")
            await h.wait_for(lambda: all_completed(h, ["any-v2"]), timeout=20,
                             what="any-v2 done")
            assert set(await claimers(h, "any-v2")) <= v2_ids
            assert set(await claimers(h, "new-late")) <= v2_ids
            for eid in old_late:
                rec = await h.record(eid)
                assert rec["status"] == "suspended" and rec["lease_owner"] is None, rec
                assert set(await claimers(h, eid)) <= v1_ids, eid
                assert len(await claimers(h, eid)) == 1, eid  # only the first delivery
                body = (await c.get(f"/v1/executions/{eid}")).json()
                assert body["codeVersion"] == "1"
                # v2 workers run its workflow, but none carries version 1.
                blocked = body["blockedBy"]
                assert {k: blocked.get(k) for k in ("reason", "workflowId", "version")} == {
                    "reason": "no-worker-for-version", "workflowId": "roll-deploy",
                    "version": "1"}, blocked
    finally:
        api2.stop()

    # A v1 worker comes back: it finishes them.
    again = await h.start_version("E", "1")
    await h.wait_for(lambda: all_completed(h, old_late), timeout=30,
                     what="old_late completed by the v1 worker started again")
    for eid in old_late:
        assert (await claimers(h, eid))[1:] == [again.worker_id], eid
        result = (await h.record(eid))["outcome"]["result"]
        assert result["second"]["version"] == "1" and result["second"]["pid"] == again.pid
    assert await h.status("new-late") == "suspended"  # v2's, never taken by the v1 worker
    assert set(await claimers(h, "new-late")) <= v2_ids

    for w in (*v2, again):
        w.signal(signal.SIGTERM)
    for w in (*v2, again):
        assert await w.wait_exit(10) == 0, w.log()


@pytest.mark.timeout(120)
async def test_an_expired_v1_lease_is_taken_over_by_a_v1_worker_only(
        roll: RollingHarness) -> None:
    """A v1 worker killed inside a step leaves its lease to expire; a v2
    worker polling all along never takes the execution over (its blockedBy
    reads no-worker-for-version), a v1 worker started later does."""
    h = roll
    doomed = await h.start_version("A", "1", ROLL_BLOCK_SECONDS="60")
    v2 = await h.start_version("B", "2")
    await h.store.admissions.admit(workflow_id="roll-deploy", params={},
                                   execution_id="held", code_version="1")
    await h.wait_for(lambda: h.has_status("held", "running"), timeout=20,
                     what="A inside the first step")
    assert await claimers(h, "held") == [doomed.worker_id]

    doomed.signal(signal.SIGKILL)
    assert await doomed.wait_exit(5) == -signal.SIGKILL
    # The lease (2 s) runs out; then a later v2 admission is claimed, so v2
    # polled after the expiry, and the expired one is still A's alone.
    async def expired() -> bool:
        return bool(await h.pool.fetchval(
            "SELECT lease_expires_at < now() - interval '0.5 second' FROM executions "
            "WHERE execution_id = 'held'"))

    await h.wait_for(expired, timeout=10, what="A's lease expired")
    await h.store.admissions.admit(workflow_id="roll-deploy", params={},
                                   execution_id="later", code_version="2")
    await h.wait_for(lambda: waiting_for_go(h, ["later"]), timeout=20, what="later claimed")
    assert await claimers(h, "held") == [doomed.worker_id]
    rec = await h.record("held")
    # Healed (as the reaper will leave it): due again, and nobody took it.
    assert rec["status"] == "admitted" and rec["unacknowledged_deliveries"] == 1, rec
    api = await h.api("2").wait_ready()
    try:
        async with httpx.AsyncClient(base_url=api.base, timeout=30) as c:
            blocked = (await c.get("/v1/executions/held")).json()["blockedBy"]
    finally:
        api.stop()
    assert (blocked["reason"], blocked["version"]) == ("no-worker-for-version", "1"), blocked

    again = await h.start_version("C", "1")
    await h.wait_for(lambda: waiting_for_go(h, ["held"]), timeout=20,
                     what="C took it over")
    assert await claimers(h, "held") == [doomed.worker_id, again.worker_id]
    first = (await h.steps("held"))[0]
    assert first["step_key"] == "first" and first["value"]["pid"] == again.pid
    for w in (v2, again):
        w.signal(signal.SIGTERM)
    for w in (v2, again):
        assert await w.wait_exit(10) == 0, w.log()
