"""Misbehaving workflow code under real `fencepost worker` processes (lease
2 s, renewal 0.5 s, cleanup window 2 s): a stale holder's `finally:`, steps
that never return under a deadline or a cancel, and SIGTERM while an effect
is in flight.
Written to fail first (issue 10); the seconds measured are printed."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from tests.support.harness import CANCEL_GRACE_SECONDS, LEASE_SECONDS, Harness


async def _ended_at(h: Harness, eid: str, kind: str):
    """Database time of the event that ended `eid` with `kind`."""
    return await h.pool.fetchval(
        "SELECT min(at) FROM execution_events WHERE execution_id = $1 "
        "AND (kind = $2 OR (kind = 'acknowledged' AND detail->>'status' = $2))", eid, kind)


@pytest.mark.timeout(60)
async def test_a_stale_holder_runs_no_step_in_its_finally_block(harness: Harness) -> None:
    h = harness
    eid = "hard-finally-1"
    a = await h.start_worker("A", concurrency=2)
    # A blocks in "charge" until it has been paused and continued, then
    # returns; its `finally:` then asks for the "cleanup" step.
    await h.admit(eid, {"block_first": 30, "after_resume": 0.2}, workflow_id="hard-finally")
    await h.wait_for(lambda: h.started(eid, "charge", pid=a.pid), timeout=10,
                     what="A inside charge")
    b = await h.start_worker("B", concurrency=2)
    a.signal(signal.SIGSTOP)
    await h.wait_for(lambda: h.has_status(eid, "completed"), timeout=LEASE_SECONDS + 10,
                     what="B takes over and completes")
    assert [c["pid"] for c in h.calls(eid, "cleanup")] == [b.pid]

    a.signal(signal.SIGCONT)
    # A learns it lost the lease (its write of "charge" is rejected, or its
    # renewal comes back lost) and stops: the cleanup function never runs in A.
    await h.wait_for(lambda: "stopped" in a.log() or "lost at renewal" in a.log(),
                     timeout=10, what="A stops its stale delivery")
    await asyncio.sleep(1.0)  # room for any further (wrong) call by A
    assert [c["pid"] for c in h.calls(eid, "cleanup")] == [b.pid], h.calls(eid, "cleanup")
    assert a.alive()
    stale_writes = [e for e in await h.events(eid)
                    if e["token"] == 1 and e["kind"] == "step_recorded"]
    assert stale_writes == [], stale_writes


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_step_that_never_returns_is_timed_out_within_its_cleanup_window(
        harness: Harness, mode: str) -> None:
    h = harness
    eid = f"hard-hang-deadline-{mode}"
    await h.start_worker("A", concurrency=2)
    await h.store.admissions.admit(workflow_id="hard-hang", params={"mode": mode, "seconds": 3600},
                        execution_id=eid, timeout_seconds=3)
    await h.wait_for(lambda: h.started(eid, "hang"), timeout=10, what="inside the hung step")

    # The event, not the (healed) status: a read already reports the lapsed
    # lease as timed out before anything has written it.
    ended = await h.wait_for(lambda: _ended_at(h, eid, "timed_out"),
                             timeout=3 + CANCEL_GRACE_SECONDS + 8, what="timed_out written")
    assert await h.status(eid) == "timed_out"
    deadline = (await h.record(eid))["deadline"]
    late_by = (ended - deadline).total_seconds()
    print(f"{mode} step that never returns: timed_out {late_by:.2f} s after the deadline")
    assert late_by <= CANCEL_GRACE_SECONDS + 1, late_by


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_step_that_never_returns_is_cancelled_within_its_cleanup_window(
        harness: Harness, mode: str) -> None:
    h = harness
    eid = f"hard-hang-cancel-{mode}"
    await h.start_worker("A", concurrency=2)
    await h.admit(eid, {"mode": mode, "seconds": 3600}, workflow_id="hard-hang")
    await h.wait_for(lambda: h.started(eid, "hang"), timeout=10, what="inside the hung step")
    first_expiry = await h.pool.fetchval(
        "SELECT lease_expires_at FROM executions WHERE execution_id = $1", eid)

    async def outlived_its_first_lease() -> bool:  # the lease has been renewed meanwhile
        return await h.pool.fetchval(
            "SELECT now() > $2 AND lease_expires_at > now() AND token = 1 "
            "FROM executions WHERE execution_id = $1", eid, first_expiry)

    await h.wait_for(outlived_its_first_lease, timeout=LEASE_SECONDS + 10,
                     what="the hung step outlives its first lease")

    answer, _ = await h.store.operator.request_cancel(eid, "test")
    requested = await h.pool.fetchval(
        "SELECT cancel_requested_at FROM executions WHERE execution_id = $1", eid)
    ended = await h.wait_for(lambda: _ended_at(h, eid, "cancelled"),
                             timeout=CANCEL_GRACE_SECONDS + 8, what="cancelled written")
    assert await h.status(eid) == "cancelled"
    late_by = (ended - requested).total_seconds()
    print(f"{mode} step that never returns: cancelled {late_by:.2f} s after the request "
          f"({answer})")
    assert late_by <= CANCEL_GRACE_SECONDS + 1, late_by


@pytest.mark.timeout(60)
async def test_sigterm_during_an_effect_records_the_answer_that_arrives_under_the_lease(
        harness: Harness) -> None:
    h = harness
    eid = "hard-effect-sigterm"
    a = await h.start_worker("A", concurrency=2,
                             settings={"FENCEPOST_SHUTDOWN_GRACE_SECONDS": "0.3"})
    await h.admit(eid, {"seconds": 1.5}, workflow_id="hard-slow-effect")
    await h.wait_for(lambda: h.started(eid, "remote", pid=a.pid), timeout=10,
                     what="A inside the effect")
    started = time.monotonic()
    a.signal(signal.SIGTERM)
    assert await a.wait_exit(15) == 0
    print(f"A exited {time.monotonic() - started:.2f} s after SIGTERM")

    # The remote side answered while A still held the lease: A recorded it.
    steps = {s["step_key"]: s for s in await h.steps(eid)}
    assert steps["remote"]["status"] == "completed", steps
    assert steps["remote"]["value"]["pid"] == a.pid

    b = await h.start_worker("B", concurrency=2)
    await h.wait_for(lambda: h.has_status(eid, "completed", "parked"), timeout=10,
                     what="B finishes")
    record = await h.record(eid)
    assert record["status"] == "completed", record
    assert record["outcome"]["result"]["pid"] == a.pid
    assert [c["pid"] for c in h.calls(eid, "remote")] == [a.pid]  # called once, never by B
    assert b.alive()
