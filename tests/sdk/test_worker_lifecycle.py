"""Worker lifecycle, in-process: stopping drains running deliveries within the
grace period and releases what is left; workers register themselves and mark
when they stopped."""

from __future__ import annotations

import asyncio
import os
import socket

from tests.sdk import flows
from tests.sdk.conftest import WORKFLOWS
from tests.support.admission import admit
from tests.support.history import events_of, kinds_ignoring_late_renewals
from tests.support.waiting import wait_status, wait_until


async def test_stop_waits_up_to_the_grace_period_then_releases_the_lease(store, workers):
    worker = await workers.start(concurrency=2, shutdown_grace_seconds=0.5)
    eid = await admit(store, "sdk-drain", "drain-release", {"seconds": 30})
    await wait_until(lambda: flows.calls(eid, "slow:start") == 1, what="the long step")

    loop = asyncio.get_running_loop()
    started = loop.time()
    await workers.stop(worker)
    elapsed = loop.time() - started

    assert 0.5 <= elapsed < 3, elapsed  # waited for the grace period, not for the step
    assert flows.calls(eid, "slow:cancelled") == 1
    released = await events_of(store, eid, "released")
    assert [e["token"] for e in released] == [1]
    assert await kinds_ignoring_late_renewals(store, eid) == ["admitted", "claimed", "released"]
    record = await store.history.get(eid)
    assert (record["status"], record["unacknowledged_deliveries"], record["lease_owner"]) == (
        "admitted", 1, None
    )

    # Nothing was lost: another worker takes the released execution and finishes it.
    await workers.start()
    record = await wait_status(store, eid, "completed")
    assert record["outcome"] == {"result": {"attempt": 2}}


async def test_stop_lets_a_delivery_finish_within_the_grace_period(store, workers):
    worker = await workers.start(shutdown_grace_seconds=5)
    eid = await admit(store, "sdk-drain", "drain-finish", {"seconds": 0.5})
    await wait_until(lambda: flows.calls(eid, "slow:start") == 1, what="the step")

    loop = asyncio.get_running_loop()
    started = loop.time()
    await workers.stop(worker)

    assert loop.time() - started < 4
    record = await store.history.get(eid)
    assert record["status"] == "completed" and record["outcome"] == {"result": {"attempt": 1}}
    assert not await events_of(store, eid, "released")
    assert flows.calls(eid, "slow:cancelled") == 0


async def test_worker_registers_itself_and_marks_stopped_at_on_exit(store, pool, workers):
    worker = await workers.start(concurrency=3)

    row = await wait_until(
        lambda: pool.fetchrow("SELECT * FROM workers WHERE worker_id = $1", worker.worker_id),
        what="the worker's registration",
    )
    assert (row["host"], row["pid"], row["concurrency"]) == (socket.gethostname(), os.getpid(), 3)
    assert row["workflows"] == sorted(WORKFLOWS)
    assert row["stopped_at"] is None
    # The renewer heartbeats.
    await wait_until(
        lambda: pool.fetchval(
            "SELECT heartbeat_at > started_at FROM workers WHERE worker_id = $1", worker.worker_id
        ),
        what="a heartbeat",
    )
    live = {w["worker_id"]: w for w in await store.workers.list_workers(stale_after_seconds=5)}
    assert live[worker.worker_id]["alive"] is True

    await workers.stop(worker)

    row = await pool.fetchrow("SELECT * FROM workers WHERE worker_id = $1", worker.worker_id)
    assert row["stopped_at"] is not None and row["stopped_at"] >= row["started_at"]
    listed = {w["worker_id"]: w for w in await store.workers.list_workers(stale_after_seconds=5)}
    assert listed[worker.worker_id]["alive"] is False
