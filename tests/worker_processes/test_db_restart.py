"""Postgres restarted under a running worker (issue 3, acceptance): the worker
reconnects by itself, stays up, and every execution finishes with each step
recorded once."""

from __future__ import annotations

import asyncio
import signal

import pytest

from app.migrate import upgrade
from tests.support.harness import steps_spec

pytestmark = pytest.mark.acceptance

KEYS = ["one", "two", "three"]


@pytest.mark.timeout(90)
async def test_worker_survives_a_postgres_restart(embedded_server, make_harness) -> None:
    url = embedded_server.url
    await upgrade(url)
    h = await make_harness(url)
    eids = [f"acc-restart-{i:02d}" for i in range(12)]
    a = await h.start_worker("A", concurrency=4)
    for eid in eids:
        await h.admit(eid, steps_spec(*KEYS, seconds=0.3))

    async def under_way() -> bool:
        statuses = await h.statuses(eids)
        values = list(statuses.values())
        return values.count("completed") >= 1 and values.count("running") >= 2

    await h.wait_for(under_way, timeout=20, what="some executions done, some running")
    failures = a.log().count(" failed (")
    await asyncio.to_thread(embedded_server.stop)  # 'fast': every connection is cut
    # A meets the outage (a claim, renewal or service call fails) and keeps running.
    await h.wait_for(lambda: a.log().count(" failed (") > failures, timeout=20,
                     what="A meets the outage")
    assert a.alive(), a.log()
    await asyncio.to_thread(embedded_server.start)

    await h.wait_for(lambda: h.all_terminal(eids), timeout=40, tolerate_db_errors=True,
                     what="every execution finished after the restart")
    assert a.alive(), "the worker must reconnect, not exit"
    assert set((await h.statuses(eids)).values()) == {"completed"}
    for eid in eids:
        events = await h.assert_recorded_once(eid, KEYS)
        assert len([e for e in events if e["kind"] == "acknowledged"]) == 1, events
        assert (await h.record(eid))["unacknowledged_deliveries"] == 0
    # It noticed the outage (and then carried on).
    assert '"level": "warning"' in a.log()
    # Still a working worker: it takes new work and stops cleanly.
    await h.admit("acc-restart-after", steps_spec(*KEYS))
    await h.wait_for(lambda: h.has_status("acc-restart-after", "completed"), timeout=10,
                     what="an execution admitted after the restart")
    a.signal(signal.SIGTERM)
    assert await a.wait_exit(5) == 0, a.log()
