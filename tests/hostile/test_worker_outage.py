"""Postgres goes away under an in-process worker (issue 5, Outages): the
worker keeps running (it backs off and logs, no side task dies), stops
claiming, and once the server is back it resumes by itself: the delivery that
was in flight (its lease expired during the outage) is taken over by the
ordinary rules, and an execution admitted before the outage completes after
it. Real processes across a restart: tests/worker_processes/test_db_restart.py."""

from __future__ import annotations

import asyncio
import logging

import asyncpg
import pytest

from app.db import create_pool
from app.migrate import upgrade
from app.registry import load_workflows
from app.settings import Settings
from app.store import Admitted, ExecutionStore
from app.worker import Worker
from tests.hostile import flows
from tests.support.waiting import DB_ERRORS, wait_until

pytestmark = pytest.mark.timeout(120)

WORKFLOWS = {k: v for k, v in load_workflows(["tests.hostile.flows"]).items()
             if k == "hostile-outage"}


async def statuses(url: str, *eids: str) -> dict[str, str]:
    conn = await asyncpg.connect(url, timeout=2)
    try:
        rows = await conn.fetch(
            "SELECT execution_id, status FROM executions WHERE execution_id = ANY($1)", list(eids))
        return {r["execution_id"]: r["status"] for r in rows}
    finally:
        await conn.close()


async def test_worker_rides_out_a_postgres_outage(embedded_server, caplog) -> None:
    url = embedded_server.url_for("postgres")
    await upgrade(url)
    settings = Settings(
        database_url=url, auth="disabled", workflows="", lease_seconds=1, renew_seconds=0.2,
        poll_seconds=0.2, redelivery_base_seconds=0.05, redelivery_cap_seconds=0.5,
        shutdown_grace_seconds=1, connect_timeout_seconds=1, statement_timeout_seconds=2,
        pool_min_size=1, pool_max_size=4,
    )
    flows.GATES.clear()
    flows.CALLS.clear()
    worker = Worker(settings, WORKFLOWS, concurrency=1)
    task = asyncio.create_task(worker.run(), name="worker under outage")
    pool = await create_pool(settings, min_size=1, max_size=1)
    try:
        store = ExecutionStore.from_settings(pool, settings)
        for eid, params in (("inflight", {"gated": True}), ("before", {})):
            if eid == "before":
                # The only slot is busy with `inflight`: `before` waits out the outage.
                await wait_until(lambda: _true(flows.CALLS[("inflight", "gated")] == 1),
                                 timeout=10, what="the gated step to start",
                                 interval=0.1, tolerate=DB_ERRORS)
            answer = await store.admissions.admit(workflow_id="hostile-outage", params=params,
                                       execution_id=eid)
            assert isinstance(answer, Admitted), answer
        await pool.execute("CHECKPOINT")
    finally:
        await pool.close()

    with caplog.at_level(logging.WARNING, logger="fencepost.worker"):
        await asyncio.to_thread(embedded_server.stop)
        flows.GATES["inflight"].set()  # its step result cannot be recorded now
        await asyncio.sleep(3)  # several backoffs, and the lease (1 s) expires
        assert not task.done(), task.exception() if task.done() else None
        warnings = [r for r in caplog.records if r.name == "fencepost.worker"]
        assert warnings, "the worker says nothing about the outage"

        await asyncio.to_thread(embedded_server.start)
        done = await wait_until(
            lambda: _all_completed(url, "inflight", "before"), timeout=30,
            what="both executions to complete after the outage", interval=0.1, tolerate=DB_ERRORS)
    assert done
    assert not task.done(), "the worker must ride out the outage, not exit"

    pool = await create_pool(settings, min_size=1, max_size=1)
    try:
        steps = await pool.fetch(
            "SELECT execution_id, step_key, count(*) AS n FROM execution_steps "
            "GROUP BY 1, 2 ORDER BY 1, 2")
        assert [(r["execution_id"], r["step_key"], r["n"]) for r in steps] == [
            ("before", "first", 1), ("before", "second", 1),
            ("inflight", "first", 1), ("inflight", "second", 1)]
        inflight = await pool.fetchrow(
            "SELECT token, outcome FROM executions WHERE execution_id = 'inflight'")
        # Taken over under a newer lease after the outage (the first one expired during it).
        assert inflight["token"] >= 2, inflight
        assert inflight["outcome"] == {"result": {"first": "gated", "second": "plain"}}, inflight
    finally:
        await pool.close()
    # A step whose result could not be written during the outage ran again after it.
    assert flows.CALLS[("inflight", "gated")] >= 1 and flows.CALLS[("before", "plain")] == 2

    worker.request_stop()
    await asyncio.wait_for(task, timeout=10)


async def _true(value: bool) -> bool:
    return value


async def _all_completed(url: str, *eids: str) -> bool:
    found = await statuses(url, *eids)
    return set(found.values()) == {"completed"} and len(found) == len(eids)
