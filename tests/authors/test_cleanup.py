"""Issue 19 items 1 and 2, under real `fencepost worker` processes (lease 2 s,
renewal 0.5 s): a cancel reaches code that waits (sleep, signal, child) and
its `except Cancelled:` / `finally:` steps run within the workflow's
`cancel_grace`; cancel still wins whatever the code returns; an execution
that never ran is cancelled at once; `terminate` stops with no code run; a
wait that reaches past the deadline waits until the deadline, then
DeadlineExceeded runs the same cleanup and the execution ends timed_out.
Written to fail first; the seconds measured are printed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.support.harness import (
    LEASE_SECONDS,
    Harness,
    opened,
)

pytestmark = pytest.mark.timeout(60)


class CleanupHarness(Harness):
    flows_module = "tests.authors.cleanupflows"
    worker_prefix = "clean-worker"


@pytest_asyncio.fixture
async def harness(database_url, tmp_path, request) -> AsyncIterator[Harness]:
    async with opened(CleanupHarness(database_url, tmp_path / "h"), request) as h:
        yield h


async def _event_at(h: Harness, eid: str, kind: str):
    return await h.pool.fetchval(
        "SELECT min(at) FROM execution_events WHERE execution_id = $1 AND kind = $2", eid, kind)


async def _ran(h: Harness, eid: str, step: str) -> int:
    return len(h.calls(eid, step))


async def _step_keys(h: Harness, eid: str) -> list[str]:
    return sorted(s["step_key"] for s in await h.steps(eid))


async def _suspended(h: Harness, eid: str) -> bool:
    return (await h.statuses([eid])).get(eid) == "suspended"


@pytest.mark.parametrize("workflow_id,params", [
    ("clean-approval", {}),          # waiting for a signal
    ("clean-sleep", {}),             # sleeping
])
async def test_cancelling_a_waiting_execution_runs_its_cleanup(
        harness: Harness, workflow_id: str, params: dict) -> None:
    h = harness
    eid = f"cancel-wait-{workflow_id}"
    await h.start_worker("A", concurrency=2)
    await h.admit(eid, params, workflow_id=workflow_id)
    await h.wait_for(lambda: _suspended(h, eid), timeout=10, what="suspended on its wait")
    # Suspending is not ending: no `except`/`finally:` step ran on the way out.
    assert h.calls(eid, "release") == [] and h.calls(eid, "audit") == []

    answer, status = await h.store.operator.request_cancel(eid, "alice")
    assert answer == "requested", (answer, status)
    await h.wait_for(lambda: h.has_status(eid, "cancelled"), timeout=10, what="cancelled")

    rec = await h.record(eid)
    assert rec["outcome"]["error"]["name"] == "Cancelled", rec
    assert h.calls(eid, "release") and len(h.calls(eid, "release")) == 1
    assert h.calls(eid, "ship") == []
    keys = await _step_keys(h, eid)
    assert "release" in keys and "ship" not in keys, keys
    kinds = [e["kind"] for e in await h.events(eid)]
    # The request, then a delivery that ran the cleanup, then the end.
    after = kinds[kinds.index("cancel_requested"):]
    assert after[0] == "cancel_requested" and "claimed" in after and after[-1] == "cancelled", kinds


async def test_cancelling_a_parent_waiting_for_its_child_runs_the_parents_cleanup(
        harness: Harness) -> None:
    h = harness
    eid = "cancel-parent"
    await h.start_worker("A", concurrency=4)
    await h.admit(eid, {}, workflow_id="clean-parent")
    child = f"{eid}~kid"
    await h.wait_for(lambda: _suspended(h, child), timeout=10, what="child sleeping")
    await h.wait_for(lambda: _suspended(h, eid), timeout=10, what="parent waiting")

    assert (await h.store.operator.request_cancel(eid, "alice"))[0] == "requested"
    await h.wait_for(lambda: h.all_terminal([eid, child]), timeout=10, what="both ended")
    assert await h.statuses([eid, child]) == {eid: "cancelled", child: "cancelled"}
    assert len(h.calls(eid, "release")) == 1


async def test_cancel_wins_over_code_that_swallows_it_and_returns(harness: Harness) -> None:
    h = harness
    eid = "cancel-swallow"
    await h.start_worker("A", concurrency=2)
    await h.admit(eid, {}, workflow_id="clean-swallow")
    await h.wait_for(lambda: _suspended(h, eid), timeout=10, what="waiting")
    await h.store.operator.request_cancel(eid, "alice")
    await h.wait_for(lambda: h.has_status(eid, "cancelled"), timeout=10, what="cancelled")
    assert len(h.calls(eid, "release")) == 1
    assert (await h.record(eid))["outcome"]["error"]["name"] == "Cancelled"


async def test_a_wait_inside_cleanup_raises_the_cancel_again(harness: Harness) -> None:
    h = harness
    eid = "cancel-wait-in-cleanup"
    await h.start_worker("A", concurrency=2)
    await h.admit(eid, {}, workflow_id="clean-wait-in-cleanup")
    await h.wait_for(lambda: _suspended(h, eid), timeout=10, what="waiting")
    await h.store.operator.request_cancel(eid, "alice")
    await h.wait_for(lambda: h.has_status(eid, "cancelled"), timeout=10, what="cancelled")
    assert len(h.calls(eid, "release")) == 1
    assert "cool-down" not in await _step_keys(h, eid)


async def test_cleanup_that_never_returns_is_bounded_by_the_grace(harness: Harness) -> None:
    h = harness
    eid = "cancel-hung-cleanup"
    await h.start_worker("A", concurrency=2)
    await h.admit(eid, {}, workflow_id="clean-hung-cleanup")
    await h.wait_for(lambda: _suspended(h, eid), timeout=10, what="waiting")
    await h.store.operator.request_cancel(eid, "alice")
    requested = await h.pool.fetchval(
        "SELECT cancel_requested_at FROM executions WHERE execution_id = $1", eid)
    await h.wait_for(lambda: h.started(eid, "hang"), timeout=10, what="cleanup hangs")
    ended = await h.wait_for(lambda: _event_at(h, eid, "cancelled"), timeout=2 + LEASE_SECONDS + 8,
                             what="cancelled written")
    late_by = (ended - requested).total_seconds()
    print(f"cleanup that never returns: cancelled {late_by:.2f} s after the request (grace 2 s)")
    assert late_by <= 2 + 1, late_by
    assert await h.status(eid) == "cancelled"


async def test_no_grace_means_no_cleanup_delivery(harness: Harness) -> None:
    h = harness
    eid = "cancel-no-grace"
    await h.start_worker("A", concurrency=2)
    await h.admit(eid, {}, workflow_id="clean-no-grace")
    await h.wait_for(lambda: _suspended(h, eid), timeout=10, what="waiting")
    answer, status = await h.store.operator.request_cancel(eid, "alice")
    assert (answer, status) == ("cancelled", "cancelled")
    await asyncio.sleep(1.0)  # room for a (wrong) cleanup delivery
    assert h.calls(eid, "release") == []


async def test_an_execution_that_never_ran_is_cancelled_at_once(harness: Harness) -> None:
    h = harness
    eid = "cancel-never-ran"
    await h.admit(eid, {}, workflow_id="clean-approval")
    answer, status = await h.store.operator.request_cancel(eid, "alice")
    assert (answer, status) == ("cancelled", "cancelled")
    await h.start_worker("A", concurrency=2)
    await asyncio.sleep(1.0)  # a few polls: nothing to deliver
    assert h.calls(eid) == [] and (await h.record(eid))["token"] == 0


async def test_terminate_stops_a_waiting_execution_with_no_code_run(harness: Harness) -> None:
    h = harness
    eid = "terminate-waiting"
    await h.start_worker("A", concurrency=2)
    await h.admit(eid, {}, workflow_id="clean-approval")
    await h.wait_for(lambda: _suspended(h, eid), timeout=10, what="waiting")
    answer, status = await h.store.operator.terminate(eid, "ops")
    assert (answer, status) == ("cancelled", "cancelled")
    await asyncio.sleep(1.0)  # room for a (wrong) cleanup delivery
    assert h.calls(eid, "release") == [] and h.calls(eid, "audit") == []
    rec = await h.record(eid)
    assert rec["outcome"]["error"]["name"] == "Cancelled", rec
    assert "terminated" in rec["outcome"]["error"]["message"], rec
    [requested] = [e for e in await h.events(eid) if e["kind"] == "cancel_requested"]
    assert requested["detail"] == {"by": "ops", "terminate": True}, requested


async def test_terminate_stops_a_held_execution_and_its_cleanup_at_once(harness: Harness) -> None:
    h = harness
    eid = "terminate-held"
    a = await h.start_worker("A", concurrency=2)
    await h.admit(eid, {}, workflow_id="clean-hung-cleanup")
    await h.wait_for(lambda: _suspended(h, eid), timeout=10, what="waiting")
    await h.store.operator.request_cancel(eid, "alice")
    await h.wait_for(lambda: h.started(eid, "hang"), timeout=10, what="cleanup hangs")
    answer, status = await h.store.operator.terminate(eid, "ops")
    assert (answer, status) == ("cancelled", "cancelled")
    await h.wait_for(lambda: "stopped" in a.log() or "lost at renewal" in a.log(),
                     timeout=10, what="the holder stops")
    assert a.alive()
    assert "hang" not in await _step_keys(h, eid)


async def test_a_signal_wait_past_the_deadline_waits_until_the_deadline(harness: Harness) -> None:
    h = harness
    eid = "deadline-wait"
    await h.start_worker("A", concurrency=2)
    await h.store.admissions.admit(workflow_id="clean-approval", params={"timeout": 60},
                        execution_id=eid, timeout_seconds=3)
    await h.wait_for(lambda: _suspended(h, eid), timeout=10, what="waiting")
    ended = await h.wait_for(lambda: _event_at(h, eid, "timed_out"), timeout=3 + 10,
                             what="timed_out written")
    rec = await h.record(eid)
    early_by = (rec["deadline"] - ended).total_seconds()
    print(f"signal wait past the deadline: timed_out {-early_by:.2f} s after the deadline")
    assert ended >= rec["deadline"], (ended, rec["deadline"])
    assert (ended - rec["deadline"]).total_seconds() <= 2, (ended, rec["deadline"])
    assert rec["status"] == "timed_out" and rec["outcome"]["error"]["name"] == "DeadlineExceeded"
    assert [c["step"] for c in h.calls(eid) if c["step"] in ("release", "audit")] \
        == ["release", "audit"]


async def test_a_sleep_past_the_deadline_runs_finally_at_the_deadline(harness: Harness) -> None:
    h = harness
    eid = "deadline-sleep"
    await h.start_worker("A", concurrency=2)
    await h.store.admissions.admit(workflow_id="clean-sleep", params={"seconds": 60},
                        execution_id=eid, timeout_seconds=3)
    await h.wait_for(lambda: _suspended(h, eid), timeout=10, what="sleeping")
    await h.wait_for(lambda: h.has_status(eid, "timed_out"), timeout=3 + 10, what="timed out")
    ended = await _event_at(h, eid, "timed_out")
    assert ended is not None and ended >= (await h.record(eid))["deadline"]
    assert len(h.calls(eid, "release")) == 1 and h.calls(eid, "ship") == []
