"""`blockedBy` for each of its values (issue 4, Build 7), from records set up
with the store directly and time moved by UPDATE; and GET /v1/workers."""

from __future__ import annotations

from datetime import datetime, timedelta

import asyncpg
import httpx
import pytest

from app.store import ExecutionStore
from tests.support.admission import admit
from tests.support.responses import get_record

pytestmark = pytest.mark.timeout(60)


def at(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value.replace("Z", "+00:00"))


async def blocked(api: httpx.AsyncClient, eid: str) -> dict | None:
    return (await get_record(api, eid))["blockedBy"]


async def register(store: ExecutionStore, worker_id: str, workflows: list[str]) -> None:
    await store.workers.register_worker(worker_id, host="test", pid=1, workflows=workflows, concurrency=1)


async def test_no_worker_then_due(store: ExecutionStore, pool: asyncpg.Pool,
                                  api: httpx.AsyncClient) -> None:
    eid = await admit(store, "op-quick", "bb-due")
    rec = await get_record(api, eid)
    # No worker at all.
    assert rec["blockedBy"] == {"reason": "no-worker", "workflowId": "op-quick",
                                "since": rec["dueAt"]}, rec
    # A live worker that runs other workflows only.
    await register(store, "w-other", ["op-sleep", "op-gated"])
    assert (await blocked(api, eid))["reason"] == "no-worker"
    # A worker that runs it, but silent for long / stopped: not alive.
    await register(store, "w-silent", ["op-quick"])
    await pool.execute("UPDATE workers SET heartbeat_at = now() - interval '2 hours' "
                       "WHERE worker_id = 'w-silent'")
    await register(store, "w-stopped", ["op-quick"])
    await store.workers.worker_stopped("w-stopped")
    assert (await blocked(api, eid))["reason"] == "no-worker"

    await register(store, "w-live", ["op-quick"])
    rec = await get_record(api, eid)
    assert rec["blockedBy"] == {"reason": "due", "since": rec["dueAt"]}, rec

    workers = {w["workerId"]: w for w in (await api.get("/v1/workers")).json()["workers"]}
    assert {k: w["alive"] for k, w in workers.items()} == {
        "w-other": True, "w-live": True, "w-stopped": False}, workers  # w-silent: long gone
    assert workers["w-live"]["workflows"] == ["op-quick"]
    assert workers["w-stopped"]["stoppedAt"] is not None


async def test_leased_and_lease_expired(store: ExecutionStore, pool: asyncpg.Pool,
                                        api: httpx.AsyncClient) -> None:
    eid = await admit(store, "op-quick", "bb-leased")
    [d] = await store.leases.claim_due(1, 30, "holder-1")
    rec = await get_record(api, eid)
    assert rec["blockedBy"] == {"reason": "leased", "owner": "holder-1",
                                "until": rec["lease"]["expiresAt"]}, rec
    assert at(rec["blockedBy"]["until"]) == d.lease.expires_at

    await pool.execute("UPDATE executions SET lease_expires_at = now() - interval '1 second' "
                       "WHERE execution_id = $1", eid)
    rec = await get_record(api, eid)
    bb = rec["blockedBy"]
    assert bb["reason"] == "lease-expired", rec
    assert at(bb["since"]) < at(bb["until"]), bb  # takeover after the redelivery delay
    assert rec["lease"] is None and rec["unacknowledgedDeliveries"] == 1, rec


async def test_redelivery_delay(pool: asyncpg.Pool, api: httpx.AsyncClient) -> None:
    slow = ExecutionStore(pool, redelivery_base_seconds=60, redelivery_cap_seconds=60)
    eid = await admit(slow, "op-quick", "bb-redelivery")
    await register(slow, "w", ["op-quick"])
    [d] = await slow.leases.claim_due(1, 30, "w")
    await slow.leases.release(d.lease)
    rec = await get_record(api, eid)
    assert rec["blockedBy"] == {"reason": "redelivery-delay", "until": rec["redeliverAfter"]}, rec
    assert at(rec["redeliverAfter"]) - at(rec["lastUnacknowledgedAt"]) == timedelta(seconds=60)

    await pool.execute("UPDATE executions SET redeliver_after = now() - interval '1 second' "
                       "WHERE execution_id = $1", eid)
    assert (await blocked(api, eid))["reason"] == "due"


async def test_sleeping_and_waiting_for_a_signal(store: ExecutionStore, pool: asyncpg.Pool,
                                                 api: httpx.AsyncClient) -> None:
    sleeper = await admit(store, "op-sleep", "bb-sleeping")
    waiter = await admit(store, "op-quick", "bb-signal")
    timed = await admit(store, "op-quick", "bb-signal-timeout")
    claimed = {d.lease.execution_id: d.lease for d in await store.leases.claim_due(10, 30, "w")}
    now = await store.clock.db_now()
    wake = now + timedelta(hours=1)

    await store.operator.request_wake(sleeper, wake)
    await store.leases.acknowledge(claimed[sleeper], "suspended", waiting_on={"sleep": "nap"})
    bb = await blocked(api, sleeper)
    assert (bb["reason"], bb["step"], at(bb["until"])) == ("sleeping", "nap", wake), bb

    await store.leases.acknowledge(claimed[waiter], "suspended", waiting_on={"signal": "approve"})
    assert await blocked(api, waiter) == {"reason": "waiting-for-signal", "signal": "approve",
                                          "until": None}

    await store.operator.request_wake(timed, wake)
    await store.leases.acknowledge(claimed[timed], "suspended",
                            waiting_on={"signal": "approve", "until": wake.isoformat()})
    bb = await blocked(api, timed)
    assert (bb["reason"], bb["signal"], at(bb["until"])) == ("waiting-for-signal", "approve", wake)

    # Time moved past the wake: due (no worker registered: no-worker says so).
    await pool.execute("UPDATE executions SET due_at = now() - interval '1 second' "
                       "WHERE execution_id = $1", sleeper)
    assert (await blocked(api, sleeper))["reason"] == "no-worker"


async def test_parked_for_each_reason_and_none_when_terminal(
        pool: asyncpg.Pool, api: httpx.AsyncClient) -> None:
    store = ExecutionStore(pool, redelivery_base_seconds=0.05, redelivery_cap_seconds=0.05,
                           max_unacknowledged_deliveries=1)
    unknown = await admit(store, "op-charge", "bb-parked-unknown", {"recovery": "neither"})
    # A deadline, far away: a deadline must not change the poison answer.
    poison = await admit(store, "op-quick", "bb-parked-poison", timeout_seconds=3600)
    done = await admit(store, "op-quick", "bb-completed")
    failed = await admit(store, "op-quick", "bb-failed")
    cancelled = await admit(store, "op-quick", "bb-cancelled")
    timed_out = await admit(store, "op-quick", "bb-timed-out", timeout_seconds=3600)
    leases = {d.lease.execution_id: d.lease for d in await store.leases.claim_due(10, 30, "w")}

    await store.effects.begin_effect(leases[unknown], "charge", idempotency_key="k",
                             function_name="remote_charge")
    await store.effects.park_outcome_unknown(leases[unknown], "charge")
    assert await blocked(api, unknown) == {"reason": "parked", "parkedReason": "outcome_unknown",
                                           "step": "charge"}
    await store.leases.release(leases[poison])
    assert await blocked(api, poison) == {"reason": "parked", "parkedReason": "poison",
                                          "step": None}

    await store.leases.acknowledge(leases[done], "completed", result={})
    await store.leases.acknowledge(leases[failed], "failed", error={"name": "E", "message": "m"})
    await store.leases.acknowledge(leases[cancelled], "suspended", waiting_on={"signal": "s"})
    await store.operator.request_cancel(cancelled, "test")
    await store.leases.acknowledge(leases[timed_out], "suspended", waiting_on={"signal": "s"})
    # Both cleanup windows closed with no delivery: the sweep ends them.
    await pool.execute("UPDATE executions SET cancel_requested_at = now() - interval '1 hour' "
                       "WHERE execution_id = $1", cancelled)
    await pool.execute("UPDATE executions SET deadline = now() - interval '1 hour' "
                       "WHERE execution_id = $1", timed_out)
    await store.leases.sweep_interrupted()
    for eid, status in ((done, "completed"), (failed, "failed"), (cancelled, "cancelled"),
                        (timed_out, "timed_out")):
        rec = await get_record(api, eid)
        assert (rec["status"], rec["blockedBy"]) == (status, None), rec

    # The listing carries the same answer.
    page = (await api.get("/v1/executions", params={"status": "parked"})).json()
    assert {e["executionId"]: e["blockedBy"]["parkedReason"] for e in page["executions"]} == {
        unknown: "outcome_unknown", poison: "poison"}
