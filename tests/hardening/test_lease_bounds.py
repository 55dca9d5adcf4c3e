"""The lease statements themselves bound a holder whose code never returns
(a wedged holder renews, but its step never ends): a claim and every renewal
stop at the end of the cleanup window (the deadline or the cancel request plus
the workflow's cancel grace, written by the claim), and once that has passed a
renewal leaves a lapsed lease for the reaper."""

from __future__ import annotations

from app.store import ExecutionStore

LEASE = 30.0
GRACE = 2.0  # the claiming code's cancel_grace


async def _claim(store: ExecutionStore, eid: str, **admit):
    await store.admissions.admit(workflow_id="w", params={}, execution_id=eid, **admit)
    [delivery] = await store.leases.claim_due(1, LEASE, "me", ["w"], [GRACE])
    return delivery


async def _seconds(pool, sql: str, eid: str) -> float:
    return await pool.fetchval(f"SELECT extract(epoch FROM {sql})::float8 FROM executions "
                               "WHERE execution_id = $1", eid)


async def test_a_claim_and_its_renewals_never_reach_past_the_cleanup_window(store, pool):
    d = await _claim(store, "bound-1", timeout_seconds=5)
    assert await _seconds(pool, "lease_expires_at - deadline", "bound-1") == GRACE
    assert d.interrupt is None

    renewed, lost, interrupts = await store.leases.renew_with_interrupts([d.lease], LEASE)
    assert not lost and renewed[0].expires_at == d.lease.expires_at  # 30 s lease, capped
    assert interrupts == {}


async def test_a_renewal_past_the_deadline_says_so_and_then_lets_the_lease_lapse(store, pool):
    d = await _claim(store, "bound-2", timeout_seconds=60)
    await pool.execute("UPDATE executions SET deadline = now() - interval '0.5 second' "
                       "WHERE execution_id = 'bound-2'")
    renewed, lost, interrupts = await store.leases.renew_with_interrupts([d.lease], LEASE)
    assert interrupts["bound-2"].kind == "deadline"
    assert 0 < interrupts["bound-2"].remaining <= GRACE - 0.5
    assert await _seconds(pool, "lease_expires_at - deadline", "bound-2") == GRACE

    # The window has closed: the renewal leaves the lease lapsed; the reaper ends it.
    await pool.execute("UPDATE executions SET deadline = now() - interval '3 seconds' "
                       "WHERE execution_id = 'bound-2'")
    renewed, lost, interrupts = await store.leases.renew_with_interrupts([d.lease], LEASE)
    assert interrupts["bound-2"].remaining == 0
    assert await pool.fetchval(
        "SELECT lease_expires_at <= now() FROM executions WHERE execution_id = 'bound-2'")
    reaped = await store.leases.reap_expired()
    assert reaped.execution_ids == ["bound-2"]
    assert (await store.history.get("bound-2"))["status"] == "timed_out"


async def test_a_renewal_after_a_cancel_request_reaches_no_further_than_the_window(store, pool):
    d = await _claim(store, "bound-3")
    await store.operator.request_cancel("bound-3", "test")
    renewed, lost, interrupts = await store.leases.renew_with_interrupts([d.lease], LEASE)
    assert await _seconds(pool, "lease_expires_at - cancel_requested_at", "bound-3") == GRACE
    assert interrupts["bound-3"].kind == "cancel"
    assert 0 < interrupts["bound-3"].remaining <= GRACE
    # Once it lapses, the reaper ends it cancelled.
    await pool.execute("UPDATE executions SET lease_expires_at = now() - interval '1 ms' "
                       "WHERE execution_id = 'bound-3'")
    await store.leases.reap_expired()
    assert (await store.history.get("bound-3"))["status"] == "cancelled"
