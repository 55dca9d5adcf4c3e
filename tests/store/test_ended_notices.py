"""Every statement that ends an execution a long-poll waits for
(watched_executions) names it on ENDED_CHANNEL (payload: the execution ID) at
commit — acknowledgements, cancel and terminate, the settling of a released
or reaped lease, the sweep, an effect parked after a cancel — so the waiter
learns of the end without polling. An end nobody waits for, and a statement
that ends nothing, send no notice (a NOTIFY serializes commits)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from app.store import ExecutionStore
from app.store.types import ENDED_CHANNEL


@pytest.fixture
async def heard(database_url):
    conn = await asyncpg.connect(database_url)
    got: asyncio.Queue[str] = asyncio.Queue()
    await conn.add_listener(ENDED_CHANNEL, lambda *args: got.put_nowait(args[3]))
    try:
        yield got
    finally:
        await conn.close()


async def _next(got: asyncio.Queue) -> str:
    return await asyncio.wait_for(got.get(), timeout=5)


async def _claimed(store: ExecutionStore, eid: str, **admit):
    await store.admissions.admit(workflow_id="w", params={}, execution_id=eid, **admit)
    await store.history.watch_execution(eid)
    [d] = [d for d in await store.leases.claim_due(10, 30, "me", ["w"], [30.0])
           if d.lease.execution_id == eid]
    return d.lease


async def test_acknowledgements_name_what_they_end(store, heard) -> None:
    for status in ("completed", "failed", "cancelled", "timed_out"):
        lease = await _claimed(store, f"ack-{status}")
        await store.leases.acknowledge(lease, status, result=1,
                                error={"name": "E", "message": "m"})
        assert await _next(heard) == f"ack-{status}"
    lease = await _claimed(store, "ack-suspended")
    await store.leases.acknowledge(lease, "suspended")
    await store.admissions.admit(workflow_id="w", params={}, execution_id="unwatched")
    await store.operator.terminate("unwatched", "t")
    await store.admissions.admit(workflow_id="w", params={}, execution_id="marker")
    await store.history.watch_execution("marker")
    await store.operator.terminate("marker", "t")
    # Nothing for the suspension, nor for the end nobody waited for.
    assert await _next(heard) == "marker"


async def test_cancel_terminate_settle_sweep_and_park_name_what_they_end(store, pool,
                                                                        heard) -> None:
    await store.admissions.admit(workflow_id="w", params={}, execution_id="never-ran")
    await store.history.watch_execution("never-ran")
    await store.operator.request_cancel("never-ran", "t")
    assert await _next(heard) == "never-ran"

    await _claimed(store, "held")
    await store.operator.terminate("held", "t")
    assert await _next(heard) == "held"

    released = await _claimed(store, "released")
    await store.operator.request_cancel("released", "t")
    await store.leases.release(released)
    assert await _next(heard) == "released"

    await _claimed(store, "reaped")
    await store.operator.request_cancel("reaped", "t")
    await pool.execute("UPDATE executions SET lease_expires_at = now() - interval '1 ms' "
                       "WHERE execution_id = 'reaped'")
    await store.leases.reap_expired()
    assert await _next(heard) == "reaped"

    swept = await _claimed(store, "swept", timeout_seconds=3600)
    await store.leases.acknowledge(swept, "suspended")
    await pool.execute("UPDATE executions SET deadline = now() - interval '1 hour' "
                       "WHERE execution_id = 'swept'")
    assert await store.leases.sweep_interrupted() == ["swept"]
    assert await _next(heard) == "swept"

    parked = await _claimed(store, "parked")
    await store.effects.begin_effect(parked, "charge", idempotency_key="k", function_name="f")
    await store.operator.request_cancel("parked", "t")
    assert await store.effects.park_outcome_unknown(parked, "charge") == "cancelled"
    assert await _next(heard) == "parked"
    assert heard.empty()
