"""Issue 10 item 13, the worker's counters move (in-process workers on the
test database, tests/sdk fixtures):

* a claim that takes over an expired lease counts as a lease takeover by
  the claim (the reaper is held off, so the claim is the only one that can end it);
* a stale holder's late result counts as a late observation, and as an
  integrity conflict when it differs from the recorded step.
"""

from __future__ import annotations

import asyncio
import re

import asyncpg
import pytest

import app.worker
from app.metrics import METRICS
from app.store import ExecutionStore
from tests.sdk import flows
from tests.support.admission import admit
from tests.support.clocks import steal_lease
from tests.support.history import events_of
from tests.support.waiting import wait_status, wait_until

pytestmark = pytest.mark.timeout(60)


def counter(name: str) -> float:
    text = METRICS.render().decode()
    found = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    assert found, f"{name} missing"
    return float(found.group(1))


class _NoReaper:
    """Stands in for LeaseReaper in the worker: ends no lease."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    async def run(self, stop: asyncio.Event, *_: object) -> None:  # whatever else run takes
        await stop.wait()


async def test_a_claim_taking_over_an_expired_lease_counts_as_a_lease_takeover(
        store: ExecutionStore, pool: asyncpg.Pool, workers, monkeypatch) -> None:
    monkeypatch.setattr(app.worker, "LeaseReaper", _NoReaper)
    eid = await admit(store, "sdk-return", "takeover")
    [dead] = await store.leases.claim_due(1, 30, "dead-holder")  # a holder that died at once
    await pool.execute("UPDATE executions SET lease_expires_at = now() - interval '1 hour' "
                       "WHERE execution_id = $1", eid)
    name = 'fencepost_lease_takeovers_total{by="claim"}'
    before = counter(name)

    await workers.start(concurrency=1)
    await wait_status(store, eid, "completed")
    [expired] = await events_of(store, eid, "lease_expired")
    assert (expired["token"], expired["detail"]["owner"]) == (dead.lease.token, "dead-holder")
    assert counter(name) == before + 1


@pytest.mark.parametrize("current_value", ["slow-done", "the current holder's value"])
async def test_a_late_observation_counts_and_a_differing_one_is_an_integrity_conflict(
        store: ExecutionStore, pool: asyncpg.Pool, sdk_settings, workers,
        current_value: str) -> None:
    conflict = current_value != "slow-done"
    # Renewals stall (as in a pause): only its next fenced write tells the
    # old holder that the lease moved on.
    await workers.start(concurrency=1, lease_seconds=60, renew_seconds=30)
    eid = await admit(store, "sdk-gated", f"late-{int(conflict)}")
    await wait_until(lambda: flows.calls(eid, "slow:start") == 1, what="slow step")
    late0 = counter("fencepost_late_observations_total")
    conflicts0 = counter("fencepost_integrity_conflicts_total")

    intruder = await steal_lease(pool, sdk_settings, eid)
    await store.steps.write_step(intruder.lease, "slow", value=current_value, function_name="wait_gate")
    flows.gate(eid).set()  # the old holder's step returns "slow-done", too late

    [observation] = await wait_until(lambda: store.history.late_observations(eid),
                                     what="a late observation")
    assert (observation["value"], observation["conflict"]) == ("slow-done", conflict)
    await wait_until(lambda: counter("fencepost_late_observations_total") == late0 + 1,
                     timeout=5, what="the late-observation counter")
    assert counter("fencepost_integrity_conflicts_total") == conflicts0 + int(conflict)
    assert (await store.history.get(eid))["integrity_conflicts"] == int(conflict)
