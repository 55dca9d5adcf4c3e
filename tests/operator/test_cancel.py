"""Cancellation, request-first (issue 4, Build 3 and "Tests that must exist").

In-process workers (tests/operator/conftest.py) and the store directly."""

from __future__ import annotations

import asyncio
import random

import asyncpg
import httpx
import pytest

from app.store import ExecutionStore, LeaseLost
from tests.operator import flows
from tests.support.admission import admit
from tests.support.history import event_count, events_of, kinds
from tests.support.races import STEP_WRITE, Outcomes, RowLock, StatementGate, until_waiting
from tests.support.responses import assert_error, get_record
from tests.support.waiting import wait_status

pytestmark = pytest.mark.timeout(60)


async def test_cancel_unleased_suspended_execution_is_delivered_once_more_then_cancelled(
        store: ExecutionStore, workers, api: httpx.AsyncClient) -> None:
    await workers.start()
    eid = await admit(store, "op-sleep", "cancel-suspended", {"seconds": 3600})
    await wait_status(store, eid, "suspended")
    before = await get_record(api, eid)
    assert before["blockedBy"]["reason"] == "sleeping" and before["dueAt"] is not None, before

    r = await api.post(f"/v1/executions/{eid}/cancel", json={"by": "alice"})
    # It has run: its cleanup delivery is due at once.
    assert r.status_code == 202 and r.json() == {"status": "suspended"}, r.text

    await wait_status(store, eid, "cancelled")
    rec = await get_record(api, eid)
    assert rec["status"] == "cancelled" and rec["blockedBy"] is None, rec
    assert rec["outcome"]["error"]["name"] == "Cancelled", rec
    assert rec["dueAt"] is None and rec["cancelRequestedAt"] is not None, rec
    events = await store.history.events(eid)
    kinds = [e["kind"] for e in events]
    assert kinds[kinds.index("cancel_requested"):] == [
        "cancel_requested", "claimed", "acknowledged", "cancelled"], kinds
    [requested] = [e for e in events if e["kind"] == "cancel_requested"]
    assert requested["detail"] == {"by": "alice"}
    await workers.claim_rounds(2)  # the worker looked again: nobody delivered it again
    assert (await store.history.get(eid))["token"] == 2  # the first delivery and the cleanup's
    assert ("cancel-suspended", "after") not in flows.CALLS


async def test_cancel_unleased_admitted_and_parked_executions(
        store: ExecutionStore, api: httpx.AsyncClient) -> None:
    # No worker at all: admitted, never claimed.
    eid = await admit(store, "op-quick", "cancel-admitted")
    r = await api.post(f"/v1/executions/{eid}/cancel")
    assert r.status_code == 202 and r.json() == {"status": "cancelled"}, r.text
    assert await kinds(store, eid) == ["admitted", "cancel_requested", "cancelled"]
    assert (await store.leases.claim_due(10, 30, "late-worker")) == []

    # Parked (an effect in doubt): nobody holds it, so it is cancelled at once.
    eid = await admit(store, "op-charge", "cancel-parked", {"recovery": "neither"})
    [d] = await store.leases.claim_due(1, 30, "w")
    await store.effects.begin_effect(d.lease, "charge", idempotency_key=f"{eid}:charge",
                             function_name="remote_charge")
    await store.effects.park_outcome_unknown(d.lease, "charge")
    r = await api.post(f"/v1/executions/{eid}/cancel")
    assert r.status_code == 202 and r.json() == {"status": "cancelled"}, r.text
    rec = await get_record(api, eid)
    assert rec["status"] == "cancelled" and rec["parked"] is None and rec["blockedBy"] is None


async def test_cancel_leased_execution_stops_at_the_holders_next_fenced_write(
        store: ExecutionStore, workers, api: httpx.AsyncClient) -> None:
    worker = await workers.start()
    eid = await admit(store, "op-gated", "cancel-leased")
    await asyncio.wait_for(flows.STARTED[eid].wait(), 10)

    r = await api.post(f"/v1/executions/{eid}/cancel")
    assert r.status_code == 202 and r.json() == {"status": "running"}, r.text
    rec = await get_record(api, eid)
    assert rec["status"] == "running" and rec["cancelRequestedAt"] is not None, rec
    assert rec["blockedBy"]["reason"] == "leased" and rec["blockedBy"]["cancelRequested"], rec
    assert rec["blockedBy"]["owner"] == worker.worker_id
    assert (await events_of(store, eid, "cancel_requested")) and not (
        await events_of(store, eid, "cancelled"))

    flows.GATES[eid].set()  # the slow step ends; its write tells the holder to stop
    rec = await wait_status(store, eid, "cancelled")
    assert rec["outcome"]["error"]["name"] == "Cancelled", rec

    steps = await store.history.steps([eid])
    assert sorted(steps[eid]) == ["cleanup", "finally", "slow"], steps  # never "after"
    assert (eid, "after") not in flows.CALLS
    assert [s for e, s in flows.CALLS if e == eid] == ["slow", "cleanup", "finally"]
    events = await store.history.events(eid)
    order = [e["kind"] for e in events]
    assert order.index("cancel_requested") < order.index("acknowledged"), order
    [ack] = [e for e in events if e["kind"] == "acknowledged"]
    assert ack["detail"]["status"] == "cancelled" and ack["token"] == 1, ack
    assert order[-1] == "cancelled", order


def _ack_event(events: list[dict]) -> dict | None:
    acks = [e for e in events if e["kind"] == "acknowledged"]
    assert len(acks) <= 1, acks
    return acks[0] if acks else None


async def _check_race(store: ExecutionStore, eid: str, cancel: httpx.Response) -> str:
    """Whatever the order, the events and the answers agree, and `completed`
    is never recorded once the cancel request came first. Returns who won."""
    rec = await store.history.get(eid)
    events = await store.history.events(eid)
    order = [e["kind"] for e in events]
    ack = _ack_event(events)
    assert ack is not None, events
    if "cancel_requested" in order:
        assert order.index("cancel_requested") < order.index("acknowledged"), order
        assert cancel.status_code == 202, cancel.text
        assert rec["status"] == "cancelled", (rec, order)
        assert ack["detail"]["status"] == "cancelled", ack
        assert rec["outcome"]["error"]["name"] == "Cancelled", rec
        return "cancel"
    assert_error(cancel, 409, "EXECUTION_TERMINAL")
    assert cancel.json()["error"]["status"] == "completed", cancel.text
    assert rec["status"] == "completed" and ack["detail"]["status"] == "completed", rec
    assert "cancelled" not in order, order
    return "ack"


async def test_cancel_racing_the_holders_completed_acknowledgement(
        store: ExecutionStore, api: httpx.AsyncClient) -> None:
    """Rounds of 30 races at once (more rounds, up to 10, while one side has
    never won): each side must win some race."""
    n = 30
    rng = random.Random(4)
    outcomes = Outcomes("cancel", "ack")
    for r in outcomes.rounds(1, 10):
        eids = [await admit(store, "op-quick", f"race-{r}-{i}") for i in range(n)]
        deliveries = {d.lease.execution_id: d for d in await store.leases.claim_due(n, 30, "racer")}
        assert sorted(deliveries) == sorted(eids)

        async def ack(eid: str, deliveries=deliveries, delay: float = 0.0):
            await asyncio.sleep(delay)
            return await store.leases.acknowledge(deliveries[eid].lease, "completed",
                                           result={"ok": True})

        async def cancel(eid: str):
            return await api.post(f"/v1/executions/{eid}/cancel")

        async def race(i: int, eid: str):
            # The cancel goes through the HTTP stack: the acknowledgement
            # starts first, with it, or up to 3 ms later.
            delay = (0.0, 0.0, rng.uniform(0, 0.003))[i % 3]
            if i % 2:
                acked, answer = await asyncio.gather(ack(eid, delay=delay), cancel(eid))
            else:
                answer, acked = await asyncio.gather(cancel(eid), ack(eid, delay=delay))
            return acked, answer

        results = await asyncio.gather(*(race(i, eid) for i, eid in enumerate(eids)))
        for eid, (acked, answer) in zip(eids, results, strict=True):
            winner = await _check_race(store, eid, answer)
            # The holder is told what was recorded.
            assert acked.status == ("cancelled" if winner == "cancel" else "completed"), acked
            outcomes.add(winner, eid)
    outcomes.assert_each("cancel vs the holder's completed acknowledgement", unit="races")


@pytest.mark.parametrize("first", ["ack", "cancel"])
async def test_cancel_and_the_holders_acknowledgement_queued_on_the_row_in_each_order(
        store: ExecutionStore, pool: asyncpg.Pool, api: httpx.AsyncClient, first: str) -> None:
    """The race above with both statements in flight at once, forced: a
    third connection holds the row; the first racer is seen waiting for it,
    then the second; Postgres hands the row over in that order."""
    eid = await admit(store, "op-quick", f"queued-{first}")
    [d] = await store.leases.claim_due(1, 30, "racer")

    def ack():
        return asyncio.create_task(store.leases.acknowledge(d.lease, "completed", result={"ok": True}))

    def cancel():
        return asyncio.create_task(api.post(f"/v1/executions/{eid}/cancel"))

    async with RowLock(pool, eid) as lock:
        one = ack() if first == "ack" else cancel()
        await until_waiting(pool, 1, "row", what=f"the {first} waits for the row", also=one.done)
        two = cancel() if first == "ack" else ack()
        await until_waiting(pool, 2, "row", what="the other waits too", also=two.done)
        assert not one.done() and not two.done()
        await lock.release()
    acked, answer = (await one, await two) if first == "ack" else (await two, await one)

    assert await _check_race(store, eid, answer) == first
    assert acked.status == ("cancelled" if first == "cancel" else "completed"), acked


async def test_cancel_racing_completion_with_a_worker(
        store: ExecutionStore, workers, api: httpx.AsyncClient) -> None:
    """The step returns (the holder writes it, then acknowledges) while the
    cancel arrives: whoever wins, the answers and the history agree. Which
    one wins is left to chance here; each order is forced in the next test."""
    await workers.start(concurrency=12)
    eids = [await admit(store, "op-quick", f"wrace-{i}") for i in range(10)]
    for eid in eids:
        await asyncio.wait_for(flows.STARTED[eid].wait(), 10)

    rng = random.Random(10)

    async def race(i: int, eid: str) -> httpx.Response:
        flows.GATES[eid].set()  # the step returns; the holder is about to acknowledge
        await asyncio.sleep(rng.uniform(0, 0.02) if i % 2 else 0.0)
        return await api.post(f"/v1/executions/{eid}/cancel")

    answers = await asyncio.gather(*(race(i, eid) for i, eid in enumerate(eids)))
    winners = Outcomes("cancel", "ack")
    for eid, answer in zip(eids, answers, strict=True):
        await wait_status(store, eid, "completed", "cancelled")
        winners.add(await _check_race(store, eid, answer), eid)
    print(f"\ncancel vs a worker's completion, by chance: {winners.summary()}")


@pytest.mark.parametrize("first", ["ack", "cancel"])
async def test_cancel_racing_completion_with_a_worker_in_each_order(
        store: ExecutionStore, pool: asyncpg.Pool, workers, api: httpx.AsyncClient,
        first: str) -> None:
    """Each order forced with a StatementGate. The worker's acknowledgement
    first: held mid-statement with the row locked while the cancel arrives
    and waits for it (then answers 409, completed). The cancel first: held
    mid-statement while the step returns and the holder's fenced step write
    waits for the row (then the holder learns of the cancel and ends it)."""
    await workers.start()
    eid = await admit(store, "op-quick", f"wrace-forced-{first}")
    await asyncio.wait_for(flows.STARTED[eid].wait(), 10)
    kind = "acknowledged" if first == "ack" else "cancel_requested"
    async with StatementGate(pool, "execution_events",
                             f"NEW.kind = '{kind}' AND NEW.execution_id = '{eid}'") as gate:
        if first == "ack":
            flows.GATES[eid].set()
            await gate.until_held()  # the holder's acknowledgement, row locked
            cancel = asyncio.create_task(api.post(f"/v1/executions/{eid}/cancel"))
            await until_waiting(pool, 1, "row", what="the cancel behind the acknowledgement",
                                also=cancel.done)
        else:
            cancel = asyncio.create_task(api.post(f"/v1/executions/{eid}/cancel"))
            await gate.until_held(also=cancel.done)  # the cancel request, row locked
            flows.GATES[eid].set()
            await until_waiting(pool, 1, "row", query=STEP_WRITE,
                                what="the holder's step write behind the cancel",
                                also=cancel.done)
        assert not cancel.done()
        await gate.open()
        answer = await cancel
    await wait_status(store, eid, "completed", "cancelled")
    assert await _check_race(store, eid, answer) == first


async def test_stale_holder_cannot_acknowledge_after_a_cancel(
        store: ExecutionStore, pool: asyncpg.Pool, api: httpx.AsyncClient) -> None:
    # Holder A's lease expires; B takes over; a cancel is requested while B holds it.
    eid = await admit(store, "op-quick", "stale-ack")
    [a] = await store.leases.claim_due(1, 30, "A")
    await pool.execute("UPDATE executions SET lease_expires_at = now() - interval '1 second' "
                       "WHERE execution_id = $1", eid)
    [b] = await store.leases.claim_due(1, 30, "B")
    assert (a.lease.token, b.lease.token) == (1, 2)
    r = await api.post(f"/v1/executions/{eid}/cancel")
    assert r.status_code == 202 and r.json() == {"status": "running"}, r.text

    with pytest.raises(LeaseLost):
        await store.leases.acknowledge(a.lease, "completed", result={"by": "A"})
    assert (await store.history.get(eid))["status"] == "running"
    answer = await store.leases.acknowledge(b.lease, "completed", result={"by": "B"})
    assert answer.status == "cancelled", answer  # cancel wins over the holder's report
    with pytest.raises(LeaseLost):
        await store.leases.acknowledge(a.lease, "completed", result={"by": "A"})
    rec = await store.history.get(eid)
    assert rec["status"] == "cancelled" and "result" not in rec["outcome"], rec
    acks = await events_of(store, eid, "acknowledged")
    assert [(e["token"], e["detail"]["status"], e["detail"]["reported"]) for e in acks] == [
        (2, "cancelled", "completed")], acks


async def test_holder_whose_lease_expired_after_a_cancel_cannot_complete(
        store: ExecutionStore, pool: asyncpg.Pool, api: httpx.AsyncClient) -> None:
    eid = await admit(store, "op-quick", "expired-after-cancel")
    [a] = await store.leases.claim_due(1, 30, "A")
    r = await api.post(f"/v1/executions/{eid}/cancel")
    assert r.status_code == 202 and r.json() == {"status": "running"}
    await pool.execute("UPDATE executions SET lease_expires_at = now() - interval '1 second' "
                       "WHERE execution_id = $1", eid)
    assert (await store.leases.reap_expired()).execution_ids == [eid]
    assert (await store.history.get(eid))["status"] == "cancelled"
    before = await event_count(store)

    # Same token, terminal record: the recorded outcome is answered, nothing changes.
    try:
        answer = await store.leases.acknowledge(a.lease, "completed", result={"by": "A"})
    except LeaseLost:
        answer = None
    assert answer is None or answer.status == "cancelled", answer
    rec = await store.history.get(eid)
    assert rec["status"] == "cancelled" and rec["outcome"]["error"]["name"] == "Cancelled", rec
    assert await event_count(store) == before


async def test_cancel_requested_while_the_holder_parks_an_effect_ends_cancelled(
        store: ExecutionStore, api: httpx.AsyncClient) -> None:
    eid = await admit(store, "op-charge", "cancel-then-park", {"recovery": "neither"})
    [d] = await store.leases.claim_due(1, 30, "w")
    await store.effects.begin_effect(d.lease, "charge", idempotency_key=f"{eid}:charge",
                             function_name="remote_charge")
    r = await api.post(f"/v1/executions/{eid}/cancel")
    assert r.status_code == 202 and r.json() == {"status": "running"}
    try:
        await store.effects.park_outcome_unknown(d.lease, "charge")  # what the SDK does on Park
    except LeaseLost:
        pass
    rec = await store.history.get(eid)
    if rec["status"] == "parked":
        # Even an operator's decision does not finish it: show where it ends up.
        await api.post(f"/v1/executions/{eid}/steps/charge/resolve",
                       json={"action": "succeed", "result": {}})
        assert await store.leases.claim_due(10, 30, "w2") == []
        rec = await store.history.get(eid)
    assert rec["status"] == "cancelled", rec


async def test_cancel_terminal_is_409_and_unknown_is_404(
        store: ExecutionStore, api: httpx.AsyncClient) -> None:
    eid = await admit(store, "op-quick", "cancel-done")
    [d] = await store.leases.claim_due(1, 30, "w")
    await store.leases.acknowledge(d.lease, "completed", result={"done": True})
    before = await event_count(store)
    err = assert_error(await api.post(f"/v1/executions/{eid}/cancel"), 409, "EXECUTION_TERMINAL")
    assert err["status"] == "completed", err
    assert (await store.history.get(eid))["status"] == "completed"

    eid2 = await admit(store, "op-quick", "cancel-twice")
    assert (await api.post(f"/v1/executions/{eid2}/cancel")).json() == {"status": "cancelled"}
    mid = await event_count(store)
    err = assert_error(await api.post(f"/v1/executions/{eid2}/cancel"), 409, "EXECUTION_TERMINAL")
    assert err["status"] == "cancelled", err

    assert_error(await api.post("/v1/executions/no-such-execution/cancel"), 404,
                 "EXECUTION_NOT_FOUND")
    assert await event_count(store) == mid and mid == before + 3


async def test_effect_begun_after_a_cancel_does_not_call_out(
        store: ExecutionStore, workers, api: httpx.AsyncClient) -> None:
    # Renewals too rare to bring the news first: the effect's own fenced write does.
    await workers.start(lease_seconds=10, renew_seconds=5)
    eid = await admit(store, "op-effect-after-gate", "cancel-before-effect")
    await asyncio.wait_for(flows.STARTED[eid].wait(), 10)
    r = await api.post(f"/v1/executions/{eid}/cancel")
    assert r.status_code == 202 and r.json() == {"status": "running"}
    flows.GATES[eid].set()
    await wait_status(store, eid, "cancelled")
    assert (eid, "effect") not in flows.CALLS
