"""Poison quarantine and resume (issue 4, Build 5), with
max_unacknowledged_deliveries = 3."""

from __future__ import annotations

import asyncio

import asyncpg
import httpx
import pytest

from app.store import ExecutionStore
from tests.operator import flows
from tests.operator.procs import LEASE_SECONDS, Procs
from tests.support.admission import admit
from tests.support.history import event_count, events_of
from tests.support.responses import assert_error, get_record
from tests.support.waiting import wait_status, wait_until

pytestmark = [pytest.mark.timeout(90), pytest.mark.citus]

MAX = 3
POISON = {"reason": "parked", "parkedReason": "poison", "step": None}


def deliveries(eid: str) -> list[str]:
    return [s for e, s in flows.CALLS if e == eid]


async def test_unacknowledged_every_delivery_parks_as_poison_and_resume_keeps_the_counter(
        store: ExecutionStore, workers, api: httpx.AsyncClient) -> None:
    await workers.start(max_unacknowledged_deliveries=MAX)
    # With a (far) deadline; the test below covers poison with none.
    eid = await admit(store, "op-poison", "poison-retry", timeout_seconds=3600)
    await wait_status(store, eid, "parked")

    rec = await get_record(api, eid)
    assert rec["parked"] == {"reason": "poison", "step": None, "divergence": None}, rec
    assert rec["blockedBy"] == POISON, rec
    assert (rec["unacknowledgedDeliveries"], rec["token"], rec["lease"]) == (MAX, MAX, None), rec
    assert deliveries(eid) == ["delivery-1", "delivery-2", "delivery-3"]
    assert len(await events_of(store, eid, "released")) == MAX
    [parked] = await events_of(store, eid, "parked")
    detail = dict(parked["detail"])
    reasons = detail.pop("lastReasons")
    assert detail == {"reason": "poison", "unacknowledgedDeliveries": MAX}, parked
    # The parking names the last reasons: the workflow's Retry, newest first.
    assert [(r["name"], r["message"]) for r in reasons] == [("Retry", "not today")] * MAX, reasons

    await workers.claim_rounds(3)  # the worker looked again and again: nobody claims it
    assert (await store.history.get(eid))["token"] == MAX and len(deliveries(eid)) == MAX

    r = await api.post(f"/v1/executions/{eid}/resume", json={"by": "bob"})
    assert r.status_code == 200 and r.json() == {"status": "admitted"}, r.text
    [resumed] = await events_of(store, eid, "resumed")
    assert resumed["detail"] == {"by": "bob", "unacknowledgedDeliveries": MAX}, resumed

    # Due again with the counter kept: one more unacknowledged delivery parks it again.
    await wait_until(lambda: len(deliveries(eid)) == MAX + 1, timeout=5, what="a 4th delivery")
    rec = await wait_status(store, eid, "parked")
    assert (rec["parked_reason"], rec["unacknowledged_deliveries"], rec["token"]) == (
        "poison", MAX + 1, MAX + 1), rec
    assert len(await events_of(store, eid, "parked")) == 2
    assert len(deliveries(eid)) == MAX + 1


async def test_poison_parking_without_a_deadline_records_the_reason_and_can_be_resumed(
        pool: asyncpg.Pool, api: httpx.AsyncClient) -> None:
    store = ExecutionStore(pool, redelivery_base_seconds=0.001, redelivery_cap_seconds=0.001,
                           max_unacknowledged_deliveries=MAX)
    by_release = await admit(store, "op-quick", "poison-by-release")
    by_expiry = await admit(store, "op-quick", "poison-by-expiry")
    for _ in range(MAX):
        await asyncio.sleep(0.01)  # past the (1 ms) redelivery delay
        for d in await store.leases.claim_due(10, 30, "w", ["op-quick"]):
            if d.lease.execution_id == by_release:
                await store.leases.release(d.lease)
        await pool.execute(
            "UPDATE executions SET lease_expires_at = now() - interval '1 second' "
            "WHERE execution_id = $1 AND status = 'running'", by_expiry)
        await store.leases.reap_expired()
    for eid in (by_release, by_expiry):
        rec = await store.history.get(eid)
        assert (rec["status"], rec["unacknowledged_deliveries"]) == ("parked", MAX), rec
        [parked] = await events_of(store, eid, "parked")
        assert parked["detail"]["reason"] == "poison"  # the event says so...
        assert (await get_record(api, eid))["blockedBy"] == POISON  # ...the record must too
        r = await api.post(f"/v1/executions/{eid}/resume")
        assert r.status_code == 200 and r.json() == {"status": "admitted"}, r.text


async def test_resume_of_an_execution_not_parked_as_poison_is_409(
        store: ExecutionStore, api: httpx.AsyncClient) -> None:
    admitted = await admit(store, "op-quick", "resume-admitted")
    done = await admit(store, "op-quick", "resume-completed")
    unknown = await admit(store, "op-charge", "resume-outcome-unknown", {"recovery": "neither"})
    claimed = {d.lease.execution_id: d for d in await store.leases.claim_due(10, 30, "w")}
    await store.leases.acknowledge(claimed[done].lease, "completed", result={})
    lease = claimed[unknown].lease
    await store.effects.begin_effect(lease, "charge", idempotency_key="k", function_name="remote_charge")
    await store.effects.park_outcome_unknown(lease, "charge")
    await store.leases.release(claimed[admitted].lease)

    before = await event_count(store)
    for eid, status in ((admitted, "admitted"), (done, "completed"), (unknown, "parked")):
        err = assert_error(await api.post(f"/v1/executions/{eid}/resume"), 409,
                           "EXECUTION_NOT_PARKED")
        assert err["status"] == status, err
        assert (await store.history.get(eid))["status"] == status
    assert_error(await api.post("/v1/executions/nope/resume"), 404, "EXECUTION_NOT_FOUND")
    assert await event_count(store) == before


async def test_worker_process_crashing_every_delivery_ends_parked_as_poison(
        procs: Procs, store: ExecutionStore, pool: asyncpg.Pool, api: httpx.AsyncClient) -> None:
    settings = {"FENCEPOST_MAX_UNACKNOWLEDGED_DELIVERIES": MAX}
    eid = await admit(store, "op-crash", "poison-crash", timeout_seconds=3600)  # see above
    dead = []
    for i in range(1, MAX + 1):
        # It may die before the test sees it register: wait for the death only.
        w = procs.spawn(f"W{i}", settings=settings)
        assert await w.wait_exit(LEASE_SECONDS + 15) == 1  # os._exit(1) inside the step
        dead.append(w)

    # The next worker does not take it: its reaper parks it as poison.
    survivor = await procs.start("W-survivor", settings=settings)
    rec = await wait_status(store, eid, "parked", timeout=LEASE_SECONDS + 5)
    assert (rec["parked_reason"], rec["unacknowledged_deliveries"], rec["token"]) == (
        "poison", MAX, MAX), rec
    await asyncio.sleep(LEASE_SECONDS)  # a lease of a live worker polling: still nobody claims it
    assert survivor.alive() and (await store.history.get(eid))["token"] == MAX
    claimed = await events_of(store, eid, "claimed")
    assert [e["detail"]["owner"] for e in claimed] == [w.worker_id for w in dead], claimed
    assert [e["token"] for e in await events_of(store, eid, "lease_expired")] == [1, 2, 3]
    assert (await get_record(api, eid))["blockedBy"] == POISON

    # Resumed: the survivor takes it, dies, and the counter (kept) parks it at once.
    r = await api.post(f"/v1/executions/{eid}/resume")
    assert r.status_code == 200, r.text
    assert await survivor.wait_exit(10) == 1
    await procs.start("W-last", settings=settings)
    rec = await wait_status(store, eid, "parked", timeout=LEASE_SECONDS + 5)
    assert (rec["unacknowledged_deliveries"], rec["token"]) == (MAX + 1, MAX + 1), rec
