"""Divergence detection where a correct workflow meets a cancel, and where
workflow code ends in ways other than returning: run time and the replay
check (`app.replay`) must agree, and neither may call a correct history a
divergence (found in review; each failed before its fix)."""

from __future__ import annotations

import pytest
import pytest_asyncio

from app.registry import load_workflows
from app.replay import replay
from tests.sdk import edgeflows as ef
from tests.support.admission import admit
from tests.support.clocks import fast_forward_timer
from tests.support.waiting import wait_until
from tests.support.workers import InProcessWorkers

WORKFLOWS = load_workflows(["tests.sdk.edgeflows"])
pytestmark = pytest.mark.timeout(90)


@pytest_asyncio.fixture
async def worker(sdk_settings, store):
    ef.reset()
    ef.STORE["store"] = store
    running = InProcessWorkers(sdk_settings, WORKFLOWS)
    await running.start()
    try:
        yield running
    finally:
        await running.stop_all()


async def _status(store, eid: str, *statuses: str) -> dict:
    async def there() -> bool:
        return (await store.history.get(eid))["status"] in statuses
    await wait_until(there, what=f"{eid} in {statuses}", timeout=30)
    return await store.history.get(eid)


async def _recorded(pool, eid: str) -> set[str]:
    rows = await pool.fetch("SELECT step_key FROM execution_steps WHERE execution_id = $1", eid)
    return {r["step_key"] for r in rows}


async def _suspended_at(store, pool, eid: str, key: str) -> None:
    async def there() -> bool:
        return (await store.history.get(eid))["status"] == "suspended" \
            and key in await _recorded(pool, eid)
    await wait_until(there, what=f"{eid} suspended with {key} recorded", timeout=30)


async def test_cancelling_a_signal_wait_with_a_timeout_runs_its_cleanup(store, pool, worker):
    # The wait's timeout timer was recorded right after the wait; the cleanup
    # delivery takes it there before the cancel is raised, so the cleanup's
    # step is asked at the position after it (it was asked at the timer's
    # position, read as a divergence: parked, and the cancel ended it with
    # no cleanup run).
    eid = await admit(store, "edge-approval", "edge-s1")

    await _suspended_at(store, pool, eid, "signal:decision:timeout")
    assert (await store.operator.request_cancel(eid, "alice"))[0] == "requested"

    record = await _status(store, eid, "cancelled", "parked", "failed")
    assert record["status"] == "cancelled", (record["status"], record["parked_detail"])
    assert ef.CALLS["release"] == 1
    report = await replay(WORKFLOWS["edge-approval"], await store.exports.export(eid), WORKFLOWS)
    assert report.ok, report.divergence


async def test_code_raising_before_a_recorded_step_parks_as_the_replay_check_reports(
        store, pool, worker):
    eid = await admit(store, "edge-raise", "edge-r1")

    await _suspended_at(store, pool, eid, "nap")
    await fast_forward_timer(pool, eid, "nap")
    await _suspended_at(store, pool, eid, "nap2")                      # history: a, nap, x, nap2
    ef.CODE["now"] = "v2"                 # deployed: raises before x
    report = await replay(WORKFLOWS["edge-raise"], await store.exports.export(eid), WORKFLOWS)
    assert not report.ok and report.divergence["recorded"] == "x", report
    await fast_forward_timer(pool, eid, "nap2")

    record = await _status(store, eid, "parked", "failed", "completed")
    assert (record["status"], record["parked_reason"]) == ("parked", "nondeterminism"), \
        record.get("outcome")
    assert record["parked_detail"]["recorded"] == "x"
    assert "raised Invalid" in record["parked_detail"]["message"]
    assert ef.CALLS["x"] == 1  # ran once, under v1


async def test_code_that_wraps_the_divergence_in_its_own_error_still_parks(store, pool, worker):
    eid = await admit(store, "edge-wrap", "edge-w1")

    await _suspended_at(store, pool, eid, "nap")
    await fast_forward_timer(pool, eid, "nap")
    await _suspended_at(store, pool, eid, "nap2")
    ef.CODE["now"] = "v2"                 # a step inserted before recorded x
    await fast_forward_timer(pool, eid, "nap2")

    record = await _status(store, eid, "parked", "failed", "completed")
    assert (record["status"], record["parked_reason"]) == ("parked", "nondeterminism"), \
        record.get("outcome")
    assert (record["parked_detail"]["recorded"], record["parked_detail"]["asked"]) == (
        "x", "inserted")
    assert ef.CALLS["x"] == 1


async def test_replay_check_of_an_execution_cancelled_while_sleeping_fits_its_own_code(
        store, worker):
    eid = await admit(store, "edge-nap", "edge-n1")
    await _status(store, eid, "suspended")
    await store.operator.request_cancel(eid, "alice")
    await _status(store, eid, "cancelled")
    assert ef.CALLS["d"] == 1

    report = await replay(WORKFLOWS["edge-nap"], await store.exports.export(eid), WORKFLOWS)
    assert report.ok, report.divergence


async def test_replay_check_of_a_cancel_noticed_at_a_steps_write_fits_its_own_code(
        store, worker):
    ef.CALLS["f"] = 5  # the cleanup finishes in its first delivery
    eid = await admit(store, "edge-cancel", "edge-c2")
    await _status(store, eid, "cancelled")
    assert (ef.CALLS["d"], ef.CALLS["e"]) == (1, 0)

    report = await replay(WORKFLOWS["edge-cancel"], await store.exports.export(eid), WORKFLOWS)
    assert report.ok, report.divergence
