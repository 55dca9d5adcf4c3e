"""A worker killed or paused in the middle of a step (issue 3, acceptance).

Real `fencepost worker` processes; timings from harness.DEFAULT_SETTINGS
(lease 2 s, renew 0.5 s, redelivery 0.1 s..1 s).
"""

from __future__ import annotations

import asyncio
import signal

import pytest

from tests.support.harness import LEASE_SECONDS, Harness, steps_spec

pytestmark = pytest.mark.acceptance

KEYS = ["one", "two", "three"]


@pytest.mark.timeout(60)
async def test_sigkill_in_a_step_is_finished_by_another_worker(harness: Harness) -> None:
    h = harness
    eid = "acc-kill-1"
    a = await h.start_worker("A", concurrency=2)
    # Step two blocks on its first call (A's), runs at once on a second call;
    # three takes a little while so the counter can be watched during B's delivery.
    await h.admit(eid, steps_spec(*KEYS, two={"block_first": 60}, three={"seconds": 0.5}))
    await h.wait_for(lambda: h.started(eid, "two", pid=a.pid), timeout=10,
                     what="A inside step two")
    before = await h.record(eid)
    assert before["status"] == "running" and before["lease_owner"] == a.worker_id
    assert before["unacknowledged_deliveries"] == 0

    a.signal(signal.SIGKILL)
    assert await a.wait_exit(5) == -signal.SIGKILL

    # No worker is left: the lost delivery shows only through the healed read.
    async def healed() -> dict | None:
        rec = await h.record(eid)
        return rec if rec["unacknowledged_deliveries"] >= 1 else None

    rec = await h.wait_for(healed, timeout=LEASE_SECONDS + 3, what="lease expiry visible")
    assert rec["status"] == "admitted" and rec["lease_owner"] is None, rec
    assert rec["unacknowledged_deliveries"] == 1, rec
    assert rec["token"] == 1

    b = await h.start_worker("B", concurrency=2)
    seen: list[tuple[str, int]] = []

    async def completed() -> bool:
        r = await h.record(eid)
        seen.append((r["status"], r["unacknowledged_deliveries"]))
        return r["status"] == "completed"

    await h.wait_for(completed, timeout=15, what="completion on B", interval=0.02)
    # Until the acknowledgement the counter never dropped; the ack reset it.
    assert all(n >= 1 for status, n in seen[:-1]), seen
    assert any(status == "running" for status, _ in seen), seen  # watched B's delivery
    final = await h.record(eid)
    assert final["unacknowledged_deliveries"] == 0 and final["token"] == 2, final

    events = await h.assert_recorded_once(eid, KEYS)
    expired = [e for e in events if e["kind"] == "lease_expired"]
    assert [e["token"] for e in expired] == [1], events
    assert expired[0]["detail"]["owner"] == a.worker_id
    acks = [e for e in events if e["kind"] == "acknowledged"]
    assert [(e["token"], e["detail"]["status"]) for e in acks] == [(2, "completed")]

    steps = {s["step_key"]: s for s in await h.steps(eid)}
    assert steps["one"]["token"] == 1 and steps["one"]["value"]["pid"] == a.pid
    for key in ("two", "three"):
        assert steps[key]["token"] == 2 and steps[key]["value"]["pid"] == b.pid
    assert final["outcome"]["result"]["two"]["pid"] == b.pid
    # Step functions are at-least-once: two ran in both processes, the others once.
    assert [c["pid"] for c in h.calls(eid, "one")] == [a.pid]
    assert [c["pid"] for c in h.calls(eid, "two")] == [a.pid, b.pid]
    assert [c["pid"] for c in h.calls(eid, "three")] == [b.pid]
    assert b.alive()


@pytest.mark.timeout(60)
async def test_sigstop_in_a_step_every_late_write_is_fenced(harness: Harness) -> None:
    h = harness
    eid = "acc-pause-1"
    a = await h.start_worker("A", concurrency=2)
    # A blocks in step two until it has been stopped and continued; a second
    # call (B's) returns at once. Each step returns its caller's pid.
    await h.admit(eid, steps_spec(*KEYS, two={"block_first": 30, "block_mode": "until_resumed"}))
    await h.wait_for(lambda: h.started(eid, "two", pid=a.pid), timeout=10,
                     what="A inside step two")
    b = await h.start_worker("B", concurrency=2)  # running before A is paused

    a.signal(signal.SIGSTOP)
    await h.wait_for(lambda: h.has_status(eid, "completed"), timeout=LEASE_SECONDS + 10,
                     what="B takes over and completes")
    # Paused throughout: A never got past its step while B took over.
    assert not any(c["pid"] == a.pid for c in h.calls(eid, "two", event="end"))
    done = await h.record(eid)
    steps_before = await h.steps(eid)

    a.signal(signal.SIGCONT)

    # On continuing, A learns that its lease is gone in one of two ways, and
    # the race between them is real: its step returns and the write of "two"
    # is rejected by the fence, or its overdue renewal comes back lost first
    # and stops the delivery mid-step or mid-write. Either way what the step
    # produced is kept as evidence only, and nothing A sends after it is applied.
    async def stopped() -> bool:
        return "stopped" in a.log() or "lost at renewal" in a.log()

    await h.wait_for(stopped, timeout=10, what="A stops its stale delivery")
    await asyncio.sleep(1.0)  # room for any further (wrong) write by A
    assert a.alive(), "the paused worker must survive losing its lease"
    late = [o for o in await h.late_observations(eid) if o["token"] == 1]
    assert len(late) <= 1, late
    if late:
        assert late[0]["step_key"] == "two" and late[0]["owner"] == a.worker_id
        assert late[0]["value"]["pid"] == a.pid
        # B recorded "two" with its own pid: the evidence differs from the record.
        assert late[0]["conflict"] is True

    # Nothing A wrote after it was continued was applied.
    assert await h.steps(eid) == steps_before
    after = await h.record(eid)
    assert (after["status"], after["outcome"], after["token"]) == (
        done["status"], done["outcome"], done["token"])
    steps = {s["step_key"]: s for s in steps_before}
    assert steps["one"]["token"] == 1 and steps["one"]["value"]["pid"] == a.pid
    for key in ("two", "three"):
        assert steps[key]["token"] == 2 and steps[key]["value"]["pid"] == b.pid
    assert after["outcome"]["result"]["two"]["pid"] == b.pid

    events = await h.assert_recorded_once(eid, KEYS)
    a_events = [e for e in events if e["token"] == 1]
    rejected = [e["detail"]["stepKey"] for e in a_events if e["kind"] == "fenced_write_rejected"]
    assert rejected in ([], ["two"]), a_events
    if not rejected:  # the renewal told A first
        assert [e for e in a_events if e["kind"] == "renewal_lost"], a_events
    assert not [e for e in a_events if e["kind"] == "acknowledged"], a_events
    assert not [e for e in events if e["kind"] == "step_recorded" and e["token"] == 1
                and e["detail"]["stepKey"] != "one"], events

    # A carries on as a healthy worker and stops cleanly.
    a.signal(signal.SIGTERM)
    assert await a.wait_exit(5) == 0


@pytest.mark.timeout(60)
async def test_sigstop_step_still_running_on_resume_is_stopped_by_renewal(
        harness: Harness) -> None:
    """The paused worker's step still has work to do when it is continued: its
    next batched renewal comes back lost, the delivery is cancelled at once and
    nothing it could write lands (the step never finishes, so there is no late
    result to keep: only the 'renewal_lost' event names the stale token)."""
    h = harness
    eid = "acc-pause-2"
    a = await h.start_worker("A", concurrency=2)
    await h.admit(eid, steps_spec(*KEYS, two={"block_first": 30, "block_mode": "until_resumed",
                                              "after_resume": 2}))
    await h.wait_for(lambda: h.started(eid, "two", pid=a.pid), timeout=10,
                     what="A inside step two")
    b = await h.start_worker("B", concurrency=2)
    a.signal(signal.SIGSTOP)
    await h.wait_for(lambda: h.has_status(eid, "completed"), timeout=LEASE_SECONDS + 10,
                     what="B takes over and completes")
    done = await h.record(eid)
    steps_before = await h.steps(eid)

    a.signal(signal.SIGCONT)
    await h.wait_for(lambda: h.calls(eid, "two", event="resumed"), timeout=5,
                     what="A's step notices it was continued")

    async def renewal_lost() -> list[dict]:
        return [e for e in await h.events(eid) if e["kind"] == "renewal_lost" and e["token"] == 1]

    await h.wait_for(renewal_lost, timeout=5, what="A's renewal rejected")
    await asyncio.sleep(2.2)  # past the moment A's step would have returned
    assert a.alive()
    # Cancelled: A's step function never returned, so A attempted no step write.
    assert [c["pid"] for c in h.calls(eid, "two", event="end")] == [b.pid]
    assert await h.late_observations(eid) == []
    assert await h.steps(eid) == steps_before
    after = await h.record(eid)
    assert (after["status"], after["outcome"], after["token"]) == (
        done["status"], done["outcome"], done["token"])
    events = await h.assert_recorded_once(eid, KEYS)
    assert [e["kind"] for e in events if e["token"] == 1] == [
        "claimed", "step_recorded", "lease_expired", "renewal_lost"], events
    assert "lease on acc-pause-2 (token 1) lost at renewal" in a.log()
    a.signal(signal.SIGTERM)
    assert await a.wait_exit(5) == 0


@pytest.mark.timeout(60)
async def test_own_expired_lease_reclaimed_stale_delivery_cannot_acknowledge(
        harness: Harness) -> None:
    """One worker, whose lease runs out while its delivery is in workflow code
    between fenced writes (a pause, a slow event loop; here: the lease is
    backdated in SQL right after a renewal: tests move database time, not wall time).
    The worker's own claimer takes the execution over (token 2) and replays it.
    The token-1 delivery is stale: the worker stops it at the re-claim, so it
    never acknowledges, and the outcome is the token-2 delivery's.

    Reproduces without SQL too: a single worker SIGSTOPped for 3 s (> lease)
    inside the same workflow and continued recorded attempt 1 under token 2 in
    6 of 6 runs."""
    h = harness
    eid = "acc-reclaim-1"
    # Renewals 1.2 s apart, polls 0.2 s apart: after a backdate the claimer
    # re-claims long before the renewer would extend the lease again.
    a = await h.start_worker("A", concurrency=2, settings={"FENCEPOST_RENEW_SECONDS": 1.2})
    # Delivery 1 spends 3 s, delivery 2 3 s, in workflow code after step one.
    await h.admit(eid, {"tail_seconds": {"1": 3.0, "2": 3.0}}, workflow_id="acc-tail")
    await h.wait_for(lambda: h.started(eid, "tail-1"), timeout=10, what="delivery 1 in its tail")

    async def expiry() -> object:
        return await h.pool.fetchval(
            "SELECT lease_expires_at FROM executions WHERE execution_id = $1", eid)

    first = await expiry()

    async def renewed() -> bool:
        return await expiry() != first

    await h.wait_for(renewed, timeout=5, what="a renewal of token 1", interval=0.01)
    assert await h.pool.fetchval(
        """WITH u AS (UPDATE executions SET lease_expires_at = now() - interval '10 seconds'
                      WHERE execution_id = $1 AND token = 1 AND status = 'running' RETURNING 1)
           SELECT count(*) FROM u""", eid) == 1
    await h.wait_for(lambda: h.started(eid, "tail-2", pid=a.pid), timeout=5,
                     what="A re-claims its own execution (token 2)")
    assert not h.calls(eid, "tail-1", event="end"), "delivery 1 still running at the re-claim"

    await h.wait_for(lambda: h.has_status(eid, "completed"), timeout=15, what="completion")
    # Settle: delivery 2 ends 3 s after its claim.
    await h.wait_for(lambda: h.calls(eid, "tail-2", event="end") or
                     "(token 2) lost at renewal" in a.log(), timeout=6,
                     what="delivery 2 finished or stopped")
    await asyncio.sleep(0.3)  # room for a (wrong) late write by either delivery
    rec = await h.record(eid)
    events = await h.events(eid)
    assert rec["token"] == 2
    # The outcome is the current holder's (attempt 2), not the stale delivery's.
    assert rec["outcome"]["result"]["attempt"] == 2, (rec["outcome"], events)
    # The stale delivery is stopped the moment its worker re-claims: it never
    # reaches its acknowledgement, and the current one is never disturbed.
    assert f"delivery of {eid} (token 1) superseded by token 2" in a.log()
    assert not h.calls(eid, "tail-1", event="end")
    assert not [e for e in events if e["kind"] == "acknowledged" and e["token"] == 1]
    assert "(token 2) lost at renewal" not in a.log()
    assert [c["pid"] for c in h.calls(eid, "tail-2", event="end")] == [a.pid]
