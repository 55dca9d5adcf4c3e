"""Stopping a worker with SIGTERM (issue 3, acceptance): under load it stops
claiming, lets running deliveries finish within the grace period, releases the
rest and exits 0; a second SIGTERM during the drain exits at once.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.support.harness import LEASE_SECONDS, Harness, steps_spec

pytestmark = pytest.mark.acceptance

KEYS = ["one", "two", "three"]
# Exit code of a worker stopped by a second SIGTERM/SIGINT during the drain
# (app/worker.py: os._exit(1)); the held leases are left to expire.
SECOND_SIGNAL_EXIT_CODE = 1


@pytest.mark.timeout(90)
async def test_sigterm_under_load_exits_0_within_grace_and_loses_nothing(
        harness: Harness) -> None:
    h = harness
    grace = 3.0  # longer than a lease (2 s): the drain must keep renewing
    slow = [f"acc-term-slow-{i}" for i in range(4)]
    fast = [f"acc-term-{i:02d}" for i in range(36)]
    # The slow ones are admitted first, so the first claim takes them: step two
    # blocks for 30 s on its first call, so they are still running when the
    # grace period ends and must be released, not left to expire.
    for eid in slow:
        await h.admit(eid, steps_spec(*KEYS, seconds=0.2, two={"block_first": 30}))
    for i, eid in enumerate(fast):
        await h.admit(eid, steps_spec(*KEYS, seconds=0.2 + 0.1 * (i % 4)))
    eids = slow + fast

    a = await h.start_worker("A", concurrency=8,
                             settings={"FENCEPOST_SHUTDOWN_GRACE_SECONDS": grace})

    async def some_done() -> bool:
        statuses = await h.statuses(eids)
        return list(statuses.values()).count("completed") >= 4

    await h.wait_for(some_done, timeout=20, what="A completes a few executions")
    assert all(h.started(eid, "two", pid=a.pid) for eid in slow)
    a.signal(signal.SIGTERM)
    started = time.monotonic()
    # Read after signalling: a claim already in flight when the signal landed
    # began before it (its `at` is its transaction's start), so it counts as
    # claimed before the stop; one that began after this read would not.
    sigterm_db_time = await h.pool.fetchval("SELECT now()")
    rc = await a.wait_exit(grace + 3)
    elapsed = time.monotonic() - started
    assert rc == 0, a.log()
    assert elapsed <= grace + 1.5, elapsed
    assert elapsed >= grace - 0.5, elapsed  # it did wait for the slow deliveries

    # Nothing was claimed after the signal; nothing A held is left running.
    statuses = await h.statuses(eids)
    assert "running" not in statuses.values(), statuses
    claimed_by_a: dict[str, list] = {}
    for eid in eids:
        for e in await h.events(eid):
            if e["kind"] == "claimed" and e["detail"]["owner"] == a.worker_id:
                claimed_by_a.setdefault(eid, []).append(e)
                assert e["at"] < sigterm_db_time, (eid, e, sigterm_db_time)
    # The slow deliveries were released at the end of the grace period.
    for eid in slow:
        rec = await h.record(eid)
        assert rec["status"] == "admitted" and rec["unacknowledged_deliveries"] == 1, rec
        kinds = [e["kind"] for e in await h.events(eid)]
        assert "released" in kinds and "lease_expired" not in kinds, (eid, kinds)
    # Every other delivery A had started finished and was acknowledged.
    for eid in set(claimed_by_a) - set(slow):
        assert statuses[eid] == "completed", (eid, statuses[eid])
    worker_row = await h.pool.fetchrow("SELECT stopped_at FROM workers WHERE worker_id = $1",
                                       a.worker_id)
    assert worker_row["stopped_at"] is not None
    assert "released acc-term-slow-" in a.log()

    b = await h.start_worker("B", concurrency=8)
    await h.wait_for(lambda: h.all_terminal(eids), timeout=30, what="B finishes the rest")
    assert set((await h.statuses(eids)).values()) == {"completed"}
    for eid in eids:
        events = await h.assert_recorded_once(eid, KEYS)
        acks = [e for e in events if e["kind"] == "acknowledged"]
        assert len(acks) == 1 and acks[0]["detail"]["status"] == "completed", (eid, acks)
        assert not [e for e in events if e["kind"] == "fenced_write_rejected"], (eid, events)
    for eid in slow:  # finished by B; A's blocked call was cancelled, never recorded
        rec = await h.record(eid)
        assert rec["outcome"]["result"]["two"]["pid"] == b.pid
        assert [c["pid"] for c in h.calls(eid, "two")] == [a.pid, b.pid]
        assert [c["pid"] for c in h.calls(eid, "two", event="end")] == [b.pid]
    b.signal(signal.SIGTERM)
    assert await b.wait_exit(5) == 0


@pytest.mark.timeout(60)
async def test_second_sigterm_during_drain_exits_at_once(harness: Harness) -> None:
    h = harness
    eids = [f"acc-twice-{i}" for i in range(3)]
    for eid in eids:
        await h.admit(eid, steps_spec(*KEYS, two={"block_first": 30}))
    a = await h.start_worker("A", concurrency=4,
                             settings={"FENCEPOST_SHUTDOWN_GRACE_SECONDS": 30})
    await h.wait_for(lambda: all(h.started(eid, "two", pid=a.pid) for eid in eids), timeout=10,
                     what="A inside step two of every execution")

    a.signal(signal.SIGTERM)
    await h.wait_for(lambda: "waiting up to 30.0s for 3 deliveries" in a.log(), timeout=5,
                     what="A draining")
    assert a.alive()
    a.signal(signal.SIGTERM)
    started = time.monotonic()
    rc = await a.wait_exit(2)
    assert time.monotonic() - started < 1.0
    assert rc == SECOND_SIGNAL_EXIT_CODE, rc
    assert "second signal: exiting at once" in a.log()

    # Nothing was released: the leases run out, and another worker finishes.
    b = await h.start_worker("B", concurrency=4)
    await h.wait_for(lambda: h.all_terminal(eids), timeout=LEASE_SECONDS + 15,
                     what="B finishes after A's leases expire")
    for eid in eids:
        rec = await h.record(eid)
        assert rec["status"] == "completed" and rec["unacknowledged_deliveries"] == 0
        events = await h.assert_recorded_once(eid, KEYS)
        kinds = [(e["kind"], e["token"]) for e in events]
        assert ("lease_expired", 1) in kinds and ("released", 1) not in kinds, kinds
        assert rec["outcome"]["result"]["two"]["pid"] == b.pid
    b.signal(signal.SIGTERM)
    assert await b.wait_exit(5) == 0
