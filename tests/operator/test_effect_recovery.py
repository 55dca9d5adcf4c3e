"""Effects whose outcome is in doubt, with real `fencepost worker` processes
(issue 4: "Effect recovery, each path with real worker processes"; "A worker
SIGSTOPped across a lease expiry inside an effect").

Worker A calls the fake remote (tests/operator/flows.py) and hangs; the
remote's call log tells the test the attempt was persisted and the call was
made; then A is SIGKILLed (or SIGSTOPped) and worker B recovers.
"""

from __future__ import annotations

import asyncio
import signal

import asyncpg
import httpx
import pytest

from app.store import ExecutionStore
from tests.operator.procs import LEASE_SECONDS, Procs
from tests.support.admission import admit
from tests.support.history import events_of
from tests.support.races import until_waiting
from tests.support.responses import get_record
from tests.support.waiting import wait_status, wait_until

pytestmark = pytest.mark.timeout(90)


async def remote_calls(pool: asyncpg.Pool, eid: str, kind: str = "charge") -> list[dict]:
    rows = await pool.fetch(
        "SELECT idempotency_key, pid FROM op_remote_calls WHERE execution_id = $1 AND kind = $2 "
        "ORDER BY call_id", eid, kind)
    return [dict(r) for r in rows]


async def remote_charges(pool: asyncpg.Pool, eid: str) -> list[dict]:
    rows = await pool.fetch(
        "SELECT idempotency_key, charge_id, calls FROM op_remote_charges "
        "WHERE idempotency_key LIKE $1 || ':%'", eid)
    return [dict(r) for r in rows]


async def effect_row(pool: asyncpg.Pool, eid: str) -> dict | None:
    row = await pool.fetchrow("SELECT * FROM effects WHERE execution_id = $1", eid)
    return dict(row) if row else None


async def step_row(pool: asyncpg.Pool, eid: str, key: str) -> dict | None:
    row = await pool.fetchrow(
        "SELECT * FROM execution_steps WHERE execution_id = $1 AND step_key = $2", eid, key)
    return dict(row) if row else None


async def all_called(pool: asyncpg.Pool, eids: list[str], pid: int) -> bool:
    for eid in eids:
        if not any(c["pid"] == pid for c in await remote_calls(pool, eid)):
            return False
    return True


async def kill_inside_the_effect(procs: Procs, pool: asyncpg.Pool, eids: list[str]):
    """Worker A calls the remote for every execution and hangs there; the
    attempt was persisted first; then A is SIGKILLed."""
    a = await procs.start("A", concurrency=len(eids) + 2)
    await wait_until(lambda: all_called(pool, eids, a.pid), timeout=15,
                     what="A inside the remote call of every execution")
    for eid in eids:
        attempt = await effect_row(pool, eid)
        assert attempt is not None and attempt["status"] == "started", attempt
        assert attempt["token"] == 1 and attempt["idempotency_key"] == f"{eid}:charge", attempt
        assert await step_row(pool, eid, "charge") is None
    a.send(signal.SIGKILL)
    assert await a.wait_exit(5) == -signal.SIGKILL
    return a


async def test_sigkilled_idempotent_and_reconciled_effects_recover(
        procs: Procs, store: ExecutionStore, pool: asyncpg.Pool) -> None:
    idem, found, missing = "eff-idempotent", "eff-reconcile-found", "eff-reconcile-missing"
    # The remote charged but the answer never came back / the request arrived
    # and nothing was charged yet.
    await admit(store, "op-charge", idem, {"recovery": "idempotent", "hang": "after_charge"})
    await admit(store, "op-charge", found, {"recovery": "reconcile", "hang": "after_charge"})
    await admit(store, "op-charge", missing, {"recovery": "reconcile", "hang": "before_charge"})
    eids = [idem, found, missing]
    a = await kill_inside_the_effect(procs, pool, eids)

    b = await procs.start("B")
    for eid in eids:
        await wait_status(store, eid, "completed", timeout=15)

    # (a) idempotent: called again with the same key; the remote deduplicated it.
    calls = await remote_calls(pool, idem)
    assert [c["pid"] for c in calls] == [a.pid, b.pid], calls
    assert {c["idempotency_key"] for c in calls} == {f"{idem}:charge"}
    charges = await remote_charges(pool, idem)
    assert len(charges) == 1 and charges[0]["calls"] == 2, charges
    receipt = (await store.history.get(idem))["outcome"]["result"]["receipt"]
    assert receipt["chargeId"] == charges[0]["charge_id"] and receipt["deduplicated"], receipt
    assert receipt["pid"] == b.pid
    step = await step_row(pool, idem, "charge")
    assert step["token"] == 2 and step["attempts"] == 2, step
    assert [e["token"] for e in await events_of(store, idem, "effect_started")] == [1]
    assert [e["token"] for e in await events_of(store, idem, "effect_attempted")] == [2]

    # (b) reconcile, the remote has the charge: recorded without calling again.
    assert [c["pid"] for c in await remote_calls(pool, found)] == [a.pid]
    assert [c["pid"] for c in await remote_calls(pool, found, "reconcile")] == [b.pid]
    charges = await remote_charges(pool, found)
    assert len(charges) == 1 and charges[0]["calls"] == 1, charges
    receipt = (await store.history.get(found))["outcome"]["result"]["receipt"]
    assert receipt == {"chargeId": charges[0]["charge_id"], "amount": 100, "reconciled": True}
    assert (await step_row(pool, found, "charge"))["token"] == 2
    assert await events_of(store, found, "effect_attempted") == []

    # (b') reconcile, the remote never saw a charge: called again, same key.
    calls = await remote_calls(pool, missing)
    assert [c["pid"] for c in calls] == [a.pid, b.pid], calls
    assert {c["idempotency_key"] for c in calls} == {f"{missing}:charge"}
    assert [c["pid"] for c in await remote_calls(pool, missing, "reconcile")] == [b.pid]
    charges = await remote_charges(pool, missing)
    assert len(charges) == 1 and charges[0]["calls"] == 1, charges  # charged once, by B
    receipt = (await store.history.get(missing))["outcome"]["result"]["receipt"]
    assert receipt["pid"] == b.pid and not receipt["deduplicated"], receipt

    for eid in eids:
        assert [e["token"] for e in await events_of(store, eid, "lease_expired")] == [1]
        assert await events_of(store, eid, "parked") == []


async def test_sigkilled_effect_without_recovery_parks_until_an_operator_resolves(
        procs: Procs, store: ExecutionStore, pool: asyncpg.Pool, api: httpx.AsyncClient) -> None:
    ok, fail, retry = "eff-resolve-succeed", "eff-resolve-fail", "eff-resolve-retry"
    await admit(store, "op-charge", ok, {"recovery": "neither", "hang": "after_charge"})
    await admit(store, "op-charge", fail, {"recovery": "neither", "hang": "after_charge"})
    await admit(store, "op-charge", retry, {"recovery": "neither", "hang": "before_charge"})
    eids = [ok, fail, retry]
    a = await kill_inside_the_effect(procs, pool, eids)

    b = await procs.start("B")
    for eid in eids:
        await wait_status(store, eid, "parked", timeout=15)
        rec = await get_record(api, eid)
        assert rec["blockedBy"] == {"reason": "parked", "parkedReason": "outcome_unknown",
                                    "step": "charge"}, rec
        assert rec["parked"] == {"reason": "outcome_unknown", "step": "charge", "divergence": None}, rec
        assert rec["lease"] is None and rec["token"] == 2, rec
        steps = (await api.get(f"/v1/executions/{eid}/steps")).json()["steps"]
        assert [(s["stepKey"], s["status"], s["idempotencyKey"]) for s in steps] == [
            ("charge", "outcome_unknown", f"{eid}:charge")], steps
        parked = await events_of(store, eid, "parked")
        assert [(e["token"], e["detail"]) for e in parked] == [
            (2, {"reason": "outcome_unknown", "stepKey": "charge"})], parked
        # B never guessed: no second call.
        assert [c["pid"] for c in await remote_calls(pool, eid)] == [a.pid]

    # Nobody claims a parked execution, however long a live worker waits.
    await asyncio.sleep(LEASE_SECONDS + 0.5)  # B polls through a whole lease: no claim
    assert b.alive()
    for eid in eids:
        rec = await store.history.get(eid)
        assert (rec["status"], rec["token"]) == ("parked", 2), rec
        assert [e["token"] for e in await events_of(store, eid, "claimed")] == [1, 2]

    # succeed: recorded as the operator says, the function is not called again.
    r = await api.post(f"/v1/executions/{ok}/steps/charge/resolve",
                       json={"action": "succeed", "result": {"chargeId": "manual-1"},
                             "by": "ops@example"})
    assert r.status_code == 200 and r.json() == {"status": "admitted"}, r.text
    # fail: the workflow sees StepFailed.
    r = await api.post(f"/v1/executions/{fail}/steps/charge/resolve",
                       json={"action": "fail",
                             "error": {"name": "CardDeclined", "message": "declined by bank"}})
    assert r.status_code == 200, r.text
    # retry: called once more, with the same key.
    r = await api.post(f"/v1/executions/{retry}/steps/charge/resolve", json={"action": "retry"})
    assert r.status_code == 200, r.text

    for eid in eids:
        await wait_status(store, eid, "completed", timeout=10)

    assert (await store.history.get(ok))["outcome"]["result"] == {
        "receipt": {"chargeId": "manual-1"}, "after": "ok"}
    assert [c["pid"] for c in await remote_calls(pool, ok)] == [a.pid]
    resolved = await events_of(store, ok, "resolved")
    assert [e["detail"] for e in resolved] == [
        {"stepKey": "charge", "action": "succeed", "by": "ops@example",
         "result": {"chargeId": "manual-1"}}], resolved

    assert (await store.history.get(fail))["outcome"]["result"]["receipt"] == {
        "stepFailed": "charge", "name": "CardDeclined", "message": "declined by bank"}
    assert [c["pid"] for c in await remote_calls(pool, fail)] == [a.pid]
    assert [e["detail"]["action"] for e in await events_of(store, fail, "resolved")] == ["fail"]

    calls = await remote_calls(pool, retry)
    assert [c["pid"] for c in calls] == [a.pid, b.pid], calls
    assert {c["idempotency_key"] for c in calls} == {f"{retry}:charge"}
    receipt = (await store.history.get(retry))["outcome"]["result"]["receipt"]
    assert receipt["pid"] == b.pid, receipt
    assert [e["detail"]["action"] for e in await events_of(store, retry, "resolved")] == ["retry"]
    # succeed/fail settled the attempt (the step is the receipt); retry made a second one.
    assert await effect_row(pool, ok) is None and await effect_row(pool, fail) is None
    attempt = await effect_row(pool, retry)
    assert (attempt["status"], attempt["attempts"], attempt["token"]) == ("started", 2, 3), attempt
    for eid in eids:
        steps = (await api.get(f"/v1/executions/{eid}/steps")).json()["steps"]
        assert [s["stepKey"] for s in steps] == ["charge", "after"], steps


async def sigstop_inside_the_effect(procs: Procs, store: ExecutionStore, pool: asyncpg.Pool,
                                    api: httpx.AsyncClient, *, hang: str,
                                    a_settings: dict | None = None,
                                    hold_renewals: bool = False) -> None:
    """A is SIGSTOPped inside the remote call (after the remote charged), its
    lease expires, B calls again (idempotent: deduplicated) and completes; then
    A is continued, its call returns, and its fenced write is rejected: the
    result must be a late observation, never the step's value."""
    eid = "eff-pause"
    await admit(store, "op-charge", eid, {"recovery": "idempotent", "hang": hang})
    a = await procs.start("A", settings=a_settings)
    # Not just called: hanging with its SIGCONT handler in place.
    await wait_until(lambda: remote_calls(pool, eid, "hanging"), timeout=15,
                     what="A inside the effect")

    a.send(signal.SIGSTOP)
    try:
        held = await store.history.get(eid)
        assert held["status"] == "running" and held["lease_owner"] == a.worker_id, held
        # The lease is a shared setting: B starts with A's (a process with
        # another value refuses to start).
        b = await procs.start("B", settings=a_settings)
        done = await wait_status(store, eid, "completed", timeout=15)
        steps_before = await pool.fetch(
            "SELECT * FROM execution_steps WHERE execution_id = $1 ORDER BY step_key", eid)
        if hold_renewals:
            # A's renewals skip a row another transaction holds (neither
            # renewed nor lost), A's fenced step write waits for it: let go
            # once the write waits, the write is what tells A.
            holder = await pool.acquire()
            held_lock = holder.transaction()
            await held_lock.start()
            await holder.execute("SELECT 1 FROM executions WHERE execution_id = $1 FOR SHARE", eid)
    finally:
        a.send(signal.SIGCONT)
    if hold_renewals:
        async def a_rejected() -> bool:
            return any(e["token"] == 1
                       for e in await events_of(store, eid, "fenced_write_rejected"))

        try:
            # (The write, or the record of its refusal: the row is no
            # longer running, so the write itself holds nothing.)
            await until_waiting(pool, 1, "row", what="A's step write")
        finally:
            await held_lock.commit()
            await pool.release(holder)
        await wait_until(a_rejected, timeout=20, what="A's fenced write rejected")

    async def late() -> list[dict]:
        return (await api.get(f"/v1/executions/{eid}/late-observations")).json()[
            "lateObservations"]

    await wait_until(late, timeout=5, what="A's result as a late observation")
    await asyncio.sleep(0.5)  # room for any further (wrong) write by A
    assert a.alive(), "a paused worker survives losing its lease"

    observations = await late()
    assert len(observations) == 1, observations
    seen = observations[0]
    assert (seen["stepKey"], seen["token"], seen["owner"]) == ("charge", 1, a.worker_id), seen
    assert seen["value"]["pid"] == a.pid and not seen["value"]["deduplicated"], seen

    # The step's value is the new holder's; nothing A observed was applied.
    step = await step_row(pool, eid, "charge")
    assert step["token"] == 2 and step["value"]["pid"] == b.pid, step
    assert step["value"]["chargeId"] == seen["value"]["chargeId"]  # one charge, deduplicated
    assert await pool.fetch(
        "SELECT * FROM execution_steps WHERE execution_id = $1 ORDER BY step_key", eid
    ) == steps_before
    after = await store.history.get(eid)
    assert (after["status"], after["outcome"], after["token"]) == (
        "completed", done["outcome"], done["token"])
    assert after["outcome"]["result"]["receipt"]["pid"] == b.pid
    rejected = [e for e in await events_of(store, eid, "fenced_write_rejected") if e["token"] == 1]
    if hang == "until_resumed":
        # A's own fenced write found the newer token.
        assert [e["detail"]["stepKey"] for e in rejected] == ["charge"], rejected
    else:
        # A's renewal found the lease lost first and stopped the delivery; the
        # call in flight was waited for and its answer kept, with no write.
        assert rejected == [], rejected
        lost = [e for e in await events_of(store, eid, "renewal_lost") if e["token"] == 1]
        assert lost, "the renewal is what noticed the loss"


async def test_sigstopped_inside_an_effect_its_result_is_a_late_observation(
        procs: Procs, store: ExecutionStore, pool: asyncpg.Pool, api: httpx.AsyncClient) -> None:
    # A's lease (3 s) runs out while it is stopped; after SIGCONT its renewals
    # are held off the row, so the effect's own fenced write is what tells it
    # (the test below: when a renewal comes first).
    await sigstop_inside_the_effect(
        procs, store, pool, api, hang="until_resumed",
        a_settings={"FENCEPOST_LEASE_SECONDS": 3, "FENCEPOST_RENEW_SECONDS": 1},
        hold_renewals=True)


async def test_sigstopped_effect_answering_after_the_first_renewal_leaves_a_late_observation(
        procs: Procs, store: ExecutionStore, pool: asyncpg.Pool, api: httpx.AsyncClient) -> None:
    # Default short timings (renewal every 0.2 s); the remote's answer reaches
    # A 0.5 s after SIGCONT, so A's first renewal after the pause comes first.
    await sigstop_inside_the_effect(procs, store, pool, api, hang="until_resumed_slow")
