"""Dispatch with workflow code and running workers (the store side of each
rule: tests/store/test_execution_record.py and test_leases_and_fencing.py).
Each test is named after the behaviour it checks; real Worker coroutines run
in-process on the test's database with a 1 s lease renewed every 0.2 s.

Behaviours covered here:

  A terminal execution is delivered again -> its outcome, no workflow code
  A wake is requested during a delivery -> still due at that time after the ack
  Renewal keeps the lease past its original expiry -> one claim
  A delivery replies retry several times -> non-zero, non-decreasing delays
  Acknowledged after several retry replies -> counter back to 0, next wake not delayed
  N due and concurrency N -> all delivered without waiting for each other
  More due than concurrency -> never more than concurrency at once
  Several dispatchers share one database -> never two live leases
  A lease lost at renewal / a holder pauses past expiry -> no further
    fenced writes from the old holder; its late result kept as evidence
"""

from __future__ import annotations

import asyncio
import collections
import os
import threading
from datetime import timedelta

import pytest

from app.store import ExecutionStore
from tests.sdk import flows
from tests.support.admission import admit
from tests.support.clocks import parse_ts, steal_lease
from tests.support.history import END_KINDS, events_of, step_rows
from tests.support.waiting import wait_event, wait_status, wait_until


async def test_terminal_execution_delivered_again_returns_outcome_without_running_code(
    store, workers
):
    await workers.start()
    eid = await admit(store, "sdk-counted", "terminal-1")
    record = await wait_status(store, eid, "completed")
    events_before = await store.history.events(eid)

    # Asking for another delivery of a terminal execution is ignored...
    assert await store.operator.request_wake(eid) == "ignored"
    assert await store.operator.request_wake(eid, await store.clock.db_now() - timedelta(hours=1)) == "ignored"
    # ...and the worker, which has since claimed and finished a later
    # execution, never delivered the terminal one again.
    sentinel = await admit(store, "sdk-counted", "terminal-sentinel")
    await wait_status(store, sentinel, "completed")

    after = await store.history.get(eid)
    assert after["status"] == "completed" and after["outcome"] == record["outcome"]
    assert after["token"] == 1 and after["due_at"] is None
    assert await store.history.events(eid) == events_before
    assert flows.calls(eid, "body") == 1 and flows.calls(eid, "only") == 1


async def test_wake_requested_during_a_delivery_is_kept_after_it_acknowledges(store, workers):
    await workers.start()
    eid = await admit(store, "sdk-wake-during", "wake-during", {"seconds": 1.0})

    # Delivery 1 claimed the (past-due) admission wake, requested a wake 1 s
    # ahead for itself, then acknowledged `suspended` with no timer of its own.
    acked = await wait_event(store, eid, "acknowledged")
    assert acked[0]["detail"]["status"] == "suspended"
    wake_at = parse_ts((await step_rows(store.pool, eid))["ask-wake"]["value"])
    record = await store.history.get(eid)
    assert record["read_at"] < wake_at  # (1 s of margin to read it before it is due)
    assert (record["status"], record["due_at"]) == ("suspended", wake_at)

    # It is delivered again at that time (not before), and suspends again.
    claims = await wait_event(store, eid, "claimed", count=2)
    assert claims[1]["at"] >= wake_at
    await wait_event(store, eid, "acknowledged", count=2)
    record = await wait_status(store, eid, "suspended")
    assert record["due_at"] is None  # that wake was used up
    assert flows.calls(eid, "body") == 2

    await store.signals.send_signal(eid, "done", "finished")
    record = await wait_status(store, eid, "completed")
    assert record["outcome"] == {"result": "finished"}


async def test_renewal_keeps_a_delivery_longer_than_one_lease_on_one_claim(store, workers):
    await workers.start()  # lease 1 s, renewed every 0.2 s
    eid = await admit(store, "sdk-slow-step", "renewed", {"seconds": 2.5})

    record = await wait_status(store, eid, "completed", timeout=15)

    assert record["outcome"] == {"result": "slept"}
    assert record["token"] == 1
    events = await store.history.events(eid)
    # (Events after the acknowledgement are left out: a renewal racing the end
    # of a delivery may append a spurious 'renewal_lost', see
    # test_a_delivery_ended_by_its_holder_is_not_recorded_as_a_lost_renewal.)
    ack = next(i for i, e in enumerate(events) if e["kind"] == "acknowledged")
    assert [e["kind"] for e in events[: ack + 1]] == [
        "admitted", "claimed", "step_recorded", "acknowledged"
    ]
    assert not [e for e in events if e["kind"] in ("lease_expired", "released", "claimed")
                and e["token"] != 1]
    assert events[ack]["at"] - events[1]["at"] >= timedelta(seconds=2.5)
    assert flows.calls(eid, "slow:start") == 1 and flows.calls(eid, "slow:end") == 1


@pytest.mark.parametrize("end", [
    "return",
    pytest.param("retry"),
])
async def test_a_delivery_ended_by_its_holder_is_not_recorded_as_a_lost_renewal(
    store, workers, end
):
    worker = await workers.start()
    eid = f"end-then-renew-{end}"
    # The batched renewal the renewer calls (renew_with_interrupts, or renew),
    # on the renewer's own store where the worker has one.
    renewer = (getattr(worker, "control", None) or worker.store).leases
    method = "renew_with_interrupts" if hasattr(renewer, "renew_with_interrupts") else "renew"
    original = getattr(renewer, method)
    snapshotted, proceed, renewed = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def renew(leases, duration):
        # Holds the first renewal that includes `eid` until delivery 1 has
        # ended: the interleaving a busy worker hits by chance.
        mine = any(lease.execution_id == eid for lease in leases) and not snapshotted.is_set()
        if mine:
            snapshotted.set()
            await proceed.wait()
        try:
            return await original(leases, duration)
        finally:
            if mine:
                renewed.set()

    setattr(renewer, method, renew)
    await admit(store, "sdk-gate-then-end", eid, {"end": end})
    await asyncio.wait_for(snapshotted.wait(), timeout=5)
    flows.gate(eid).set()
    await wait_event(store, eid, "acknowledged" if end == "return" else "released")
    proceed.set()
    await asyncio.wait_for(renewed.wait(), timeout=5)

    record = await wait_status(store, eid, "completed")
    assert record["outcome"] == {"result": "done"}
    assert await events_of(store, eid, "renewal_lost") == []


async def test_retry_replies_are_redelivered_after_growing_delays(store, workers):
    await workers.start()  # redelivery base 0.05 s, cap 0.5 s
    eid = await admit(store, "sdk-retry-reply", "retry-delays", {"succeedOn": 6})

    record = await wait_status(store, eid, "completed", timeout=15)
    assert record["outcome"] == {"result": {"attempt": 6}}
    assert flows.SEEN[eid] == [1, 2, 3, 4, 5, 6]

    events = await store.history.events(eid)
    released = [e for e in events if e["kind"] == "released"]
    claims = [e for e in events if e["kind"] == "claimed"]
    assert [e["detail"]["unacknowledgedDeliveries"] for e in released] == [1, 2, 3, 4, 5]
    delays = [
        (parse_ts(e["detail"]["redeliverAfter"]) - e["at"]).total_seconds() for e in released
    ]
    assert delays == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.5], abs=1e-3)
    assert all(d > 0 for d in delays)
    assert all(b >= a for a, b in zip(delays, delays[1:], strict=False))
    # Each redelivery waited for its delay.
    for release, next_claim in zip(released, claims[1:], strict=True):
        assert next_claim["at"] >= parse_ts(release["detail"]["redeliverAfter"])
    assert record["unacknowledged_deliveries"] == 0


async def test_unacknowledged_deliveries_back_to_zero_after_an_acknowledgement(store, workers):
    # Delays large enough to tell "not delayed" apart: 0.5 s, 1 s, (2 s).
    await workers.start(redelivery_base_seconds=0.5, redelivery_cap_seconds=4)
    eid = await admit(store, "sdk-retry-reply", "counter-reset",
                      {"succeedOn": 3, "thenWait": True})

    # Two retry replies, then delivery 3 acknowledges `suspended` (signal wait).
    record = await wait_status(store, eid, "suspended", timeout=15)
    released = await events_of(store, eid, "released")
    assert [e["detail"]["unacknowledgedDeliveries"] for e in released] == [1, 2]
    assert record["unacknowledged_deliveries"] == 0
    assert record["redeliver_after"] is None and record["last_unacknowledged_at"] is None

    # The next wake is not delayed: a third unacknowledged delivery would
    # wait 2 s; the signal's delivery starts well before that.
    await store.signals.send_signal(eid, "continue", None)
    record = await wait_status(store, eid, "completed")
    received = (await events_of(store, eid, "signal_received"))[0]
    claims = await events_of(store, eid, "claimed")
    assert len(claims) == 4
    assert claims[3]["at"] - received["at"] < timedelta(seconds=1)
    assert record["outcome"] == {"result": {"attempt": 4}}
    assert record["unacknowledged_deliveries"] == 0


async def test_n_due_with_concurrency_n_are_all_delivered_at_once(store, workers):
    n = 6
    ids = [await admit(store, "sdk-barrier", f"barrier-{i}", {"n": n}) for i in range(n)]
    await workers.start(concurrency=n)

    # Each delivery waits inside its step until all n are inside at once.
    records = [await wait_status(store, eid, "completed", timeout=15) for eid in ids]

    assert [r["outcome"] for r in records] == [{"result": True}] * n
    assert flows.STATE["barrier_inside"] == n


async def test_n_due_with_concurrency_n_run_their_sync_steps_at_once(store, workers):
    n = min(32, (os.cpu_count() or 1) + 4) + 2  # more than the default executor's threads
    flows.STATE["thread_barrier"] = threading.Barrier(n)
    ids = [await admit(store, "sdk-thread-barrier", f"threads-{i}", {"n": n}) for i in range(n)]
    await workers.start(concurrency=n)

    records = [await wait_status(store, eid, "completed", timeout=15) for eid in ids]

    assert [r["outcome"] for r in records] == [{"result": True}] * n


async def test_never_more_than_concurrency_deliveries_at_once(store, workers):
    concurrency, total = 3, 12
    ids = [await admit(store, "sdk-inflight", f"inflight-{i}") for i in range(total)]
    await workers.start(concurrency=concurrency)

    for eid in ids:
        await wait_status(store, eid, "completed", timeout=20)

    assert flows.STATE["max_inflight"] == concurrency  # reached, never exceeded
    # The event history agrees: live leases (claimed, not yet ended) across
    # all executions never exceeded the concurrency.
    rows = await store.pool.fetch(
        "SELECT kind FROM execution_events WHERE kind = ANY($1::text[]) ORDER BY event_id",
        ["claimed", *END_KINDS],
    )
    live = peak = 0
    for row in rows:
        live += 1 if row["kind"] == "claimed" else -1
        peak = max(peak, live)
    assert peak == concurrency and live == 0


async def test_several_dispatchers_never_hold_two_live_leases(store, pool, workers):
    started = [await workers.start(concurrency=4) for _ in range(3)]
    ids = [f"multi-{i:02d}" for i in range(60)]
    await asyncio.gather(*(
        admit(store, "sdk-multi", eid, {"retryFirst": i % 3 == 0}) for i, eid in enumerate(ids)
    ))

    for eid in ids:
        await wait_status(store, eid, "completed", timeout=60)

    owners = collections.Counter()
    for i, eid in enumerate(ids):
        record = await store.history.get(eid)
        assert record["outcome"] == {"result": ["one", "two", "three"]}, eid
        events = await store.history.events(eid)
        claims = [e for e in events if e["kind"] == "claimed"]
        owners.update(e["detail"]["owner"] for e in claims)
        # Tokens: one per claim, strictly increasing.
        assert [e["token"] for e in claims] == list(range(1, len(claims) + 1)), eid
        assert len(claims) >= (3 if i % 3 == 0 else 2), eid
        # Every delivery but the last ended (exactly once) before the next
        # claim: never two claims without an end in between.
        for this, following in zip(claims, claims[1:], strict=False):
            ends = [e for e in events if e["kind"] in END_KINDS and e["token"] == this["token"]]
            assert len(ends) == 1, (eid, this["token"], ends)
            end = ends[0]
            # (A takeover's lease_expired and claimed are one statement's:
            # their places are in that order.)
            assert end["seq"] < following["seq"], (eid, end)
        last_ends = [e for e in events if e["kind"] in END_KINDS and e["token"] == claims[-1]["token"]]
        assert [(e["kind"], e["detail"].get("status")) for e in last_ends] == [
            ("acknowledged", "completed")
        ], eid
        # Each step recorded exactly once, by one holder.
        recorded = collections.Counter(
            e["detail"]["stepKey"] for e in events if e["kind"] == "step_recorded"
        )
        assert recorded == {"one": 1, "nap": 1, "two": 1, "three": 1}, (eid, recorded)
        assert not [e for e in events if e["kind"] == "fenced_write_rejected"], eid
        assert not await store.history.late_observations(eid), eid
    # The work was shared: deliveries moved between dispatchers.
    assert set(owners) <= {w.worker_id for w in started}
    assert len(owners) >= 2, owners


async def test_lease_lost_at_renewal_cancels_the_delivery(store, pool, sdk_settings, workers):
    worker = await workers.start(concurrency=1)  # renews every 0.2 s
    eid = await admit(store, "sdk-gated", "renewal-lost")
    await wait_until(lambda: flows.calls(eid, "slow:start") == 1, what="slow step")

    intruder = await steal_lease(pool, sdk_settings, eid)
    assert intruder.lease.token == 2

    # The next renewal comes back lost and the delivery is cancelled mid-step.
    await wait_until(lambda: flows.calls(eid, "slow:cancelled") == 1, timeout=5,
                     what="the slow step to be cancelled")
    await wait_until(lambda: not worker._running, what="the delivery to end")
    lost = await events_of(store, eid, "renewal_lost")
    assert lost and {e["token"] for e in lost} == {1}

    # The old holder made no further fenced write: no step, no ack, no release.
    events = await store.history.events(eid)
    assert not [e for e in events if e["token"] == 1 and e["kind"] in (
        "acknowledged", "released", "step_recorded")]
    assert await step_rows(pool, eid) == {}
    assert flows.calls(eid, "slow:end") == 0 and flows.calls(eid, "after") == 0
    record = await store.history.get(eid)
    assert (record["status"], record["token"], record["lease_owner"]) == (
        "running", 2, "intruder"
    )


async def test_stale_holder_step_write_is_rejected_and_kept_as_late_observation(
    store, pool, sdk_settings, workers
):
    # The old holder's renewals stall (as in a pause): nothing but its next
    # fenced write can tell it that the lease moved on.
    worker = await workers.start(concurrency=1, lease_seconds=60, renew_seconds=30)
    eid = await admit(store, "sdk-gated", "stale-write")
    await wait_until(lambda: flows.calls(eid, "slow:start") == 1, what="slow step")

    intruder = await steal_lease(pool, sdk_settings, eid)
    flows.gate(eid).set()  # the old holder's slow step now finishes

    observations = await wait_until(lambda: store.history.late_observations(eid),
                                    what="a late observation")
    await wait_until(lambda: not worker._running, what="the stale delivery to stop")

    assert [(o["step_key"], o["token"], o["owner"], o["value"]) for o in observations] == [
        ("slow", 1, worker.worker_id, "slow-done")
    ]
    rejected = await events_of(store, eid, "fenced_write_rejected")
    assert [(e["token"], e["detail"]["stepKey"]) for e in rejected] == [(1, "slow")]
    assert await step_rows(pool, eid) == {}
    assert flows.calls(eid, "after") == 0  # it stopped at once
    assert not await events_of(store, eid, "acknowledged")
    record = await store.history.get(eid)
    assert (record["status"], record["token"]) == ("running", 2)

    # The current holder's writes are the ones that count.
    holder = ExecutionStore.from_settings(pool, sdk_settings)
    step = await holder.steps.write_step(intruder.lease, "slow", value="holder-value",
                                   function_name="wait_gate")
    assert (step.value, step.token) == ("holder-value", 2)
    await holder.leases.acknowledge(intruder.lease, "completed", result="by holder")
    record = await store.history.get(eid)
    assert record["outcome"] == {"result": "by holder"}


@pytest.mark.parametrize("newer_by", ["same worker", "another worker"])
async def test_stale_delivery_in_the_same_worker_cannot_acknowledge_for_the_newer_one(
    store, pool, workers, newer_by
):
    """Renewals stall; the lease expires; the execution is claimed again
    while its first delivery is still running (outside any step). Each way
    it can go is forced, and has one right answer:

    * same worker: the worker that claims it again still runs delivery 1,
      which it stops at once (cancelled before its gate opens; it never
      returns, nothing is observed late);
    * another worker (the first one, concurrency 1, has no free slot to
      claim it): delivery 1 returns when its gate opens and its
      acknowledgement is rejected and kept as a late observation.

    Either way it never acknowledges for token 2."""
    first = await workers.start(concurrency=2 if newer_by == "same worker" else 1,
                                lease_seconds=60, renew_seconds=30)
    eid = await admit(store, "sdk-stale-ack", "stale-ack")
    await wait_until(lambda: flows.calls(eid, "start:1") == 1, what="delivery 1")
    await pool.execute(
        "UPDATE executions SET lease_expires_at = now() - interval '1 hour' "
        "WHERE execution_id = $1", eid,
    )
    if newer_by == "another worker":
        second = await workers.start(concurrency=1, lease_seconds=60, renew_seconds=30)
    await wait_until(lambda: flows.calls(eid, "start:2") == 1, what="delivery 2")
    [claim_2] = [e for e in await events_of(store, eid, "claimed") if e["token"] == 2]
    expected_owner = first if newer_by == "same worker" else second
    assert claim_2["detail"]["owner"] == expected_owner.worker_id

    if newer_by == "same worker":
        await wait_until(lambda: flows.calls(eid, "cancelled:1"), what="delivery 1 stopped")
    flows.gate(f"{eid}:1").set()  # the stale delivery, if still running, returns
    if newer_by == "another worker":
        await wait_until(lambda: store.history.late_observations(eid), what="the rejected ack kept")
        assert flows.calls(eid, "returned:1") == 1 and not flows.calls(eid, "cancelled:1")
        assert [o["token"] for o in await store.history.late_observations(eid)] == [1]
    else:
        assert not flows.calls(eid, "returned:1") and not await store.history.late_observations(eid)
    record = await store.history.get(eid)
    assert (record["status"], record["token"]) == ("running", 2), record["outcome"]
    assert await events_of(store, eid, "acknowledged") == []

    flows.gate(f"{eid}:2").set()
    record = await wait_status(store, eid, "completed")
    assert record["outcome"] == {"result": {"by": 2}}
    assert [e["token"] for e in await events_of(store, eid, "acknowledged")] == [2]
