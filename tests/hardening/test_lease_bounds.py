"""The lease statements themselves bound a holder whose code never returns
(a wedged holder renews, but its step never ends): a claim and every renewal
stop at the deadline, and a renewal after a cancel request extends nothing."""

from __future__ import annotations

from app.store import ExecutionStore

LEASE = 30.0


async def _claim(store: ExecutionStore, eid: str, **admit):
    await store.admit(workflow_id="w", params={}, execution_id=eid, **admit)
    [delivery] = await store.claim_due(1, LEASE, "me")
    return delivery


async def test_a_claim_and_its_renewals_never_reach_past_the_deadline(store):
    d = await _claim(store, "bound-1", timeout_seconds=5)
    record = await store.get("bound-1")
    assert d.lease.expires_at == record["deadline"]  # 30 s lease, 5 s to the deadline

    renewed, lost, interrupts = await store.renew_with_interrupts([d.lease], LEASE)
    assert not lost and renewed[0].expires_at == record["deadline"]
    assert interrupts == {}


async def test_a_renewal_past_the_deadline_lets_the_lease_lapse_and_says_so(store, pool):
    d = await _claim(store, "bound-2", timeout_seconds=60)
    await pool.execute("UPDATE executions SET deadline = now() - interval '1 second' "
                       "WHERE execution_id = 'bound-2'")
    renewed, lost, interrupts = await store.renew_with_interrupts([d.lease], LEASE)
    assert interrupts["bound-2"].kind == "deadline" and interrupts["bound-2"].remaining == 0
    expires = await pool.fetchval(
        "SELECT lease_expires_at <= now() FROM executions WHERE execution_id = 'bound-2'")
    assert expires  # lapsed: the reaper ends it
    reaped = await store.reap_expired()
    assert reaped.execution_ids == ["bound-2"]
    assert (await store.get("bound-2"))["status"] == "timed_out"


async def test_a_renewal_after_a_cancel_request_extends_nothing(store, pool):
    d = await _claim(store, "bound-3")
    await store.request_cancel("bound-3", "test")
    before = await pool.fetchval(
        "SELECT lease_expires_at FROM executions WHERE execution_id = 'bound-3'")
    renewed, lost, interrupts = await store.renew_with_interrupts([d.lease], LEASE)
    assert renewed[0].expires_at == before
    assert interrupts["bound-3"].kind == "cancel"
    assert 0 < interrupts["bound-3"].remaining <= LEASE
    # Once it lapses, the reaper ends it cancelled.
    await pool.execute("UPDATE executions SET lease_expires_at = now() - interval '1 ms' "
                       "WHERE execution_id = 'bound-3'")
    await store.reap_expired()
    assert (await store.get("bound-3"))["status"] == "cancelled"
