"""Every write a stale holder makes is refused by the fence, changes nothing,
and leaves exactly one rejection in the history: a `fenced_write_rejected`
event with the stale token (a renewal, which writes nothing, leaves one
`renewal_lost`). One test per kind of write, so a new write path that forgets
the event fails here."""

from __future__ import annotations

import pytest

from app.store import Admitted, Delivery, ExecutionStore, LeaseLost

LEASE = 30.0
EID = "stale-1"


async def stale_holder(store: ExecutionStore, clock) -> tuple[Delivery, Delivery]:
    """Holder A claims; its lease expires; holder B claims. (A, B)."""
    assert isinstance(await store.admissions.admit(workflow_id="wf", params={},
                                                   execution_id=EID), Admitted)
    [a] = await store.leases.claim_due(1, LEASE, "worker-A")
    await clock.expire_lease(EID)
    [b] = await store.leases.claim_due(1, LEASE, "worker-B")
    assert b.lease.token == a.lease.token + 1
    return a, b


async def rejections(store: ExecutionStore, token: int) -> list[dict]:
    return [e for e in await store.history.events(EID)
            if e["kind"] in ("fenced_write_rejected", "renewal_lost") and e["token"] == token]


async def _step(store: ExecutionStore, lease):
    await store.steps.write_step(lease, "s", value=1)


async def _timer(store: ExecutionStore, lease):
    await store.steps.record_timer(lease, "nap", delay_seconds=5)


async def _attempt(store: ExecutionStore, lease):
    await store.steps.record_attempt(lease, "s", 1, {"name": "E", "message": "m"})


async def _effect_begin(store: ExecutionStore, lease):
    await store.effects.begin_effect(lease, "pay", idempotency_key="k", function_name="pay")


async def _effect_retry(store: ExecutionStore, lease):
    await store.effects.retry_effect(lease, "pay")


async def _effect_park(store: ExecutionStore, lease):
    await store.effects.park_outcome_unknown(lease, "pay")


async def _signal(store: ExecutionStore, lease):
    await store.signals.consume_signal(lease, "sig", "go")


async def _acknowledge(store: ExecutionStore, lease):
    await store.leases.acknowledge(lease, "completed", result=1)


async def _release(store: ExecutionStore, lease):
    await store.leases.release(lease)


async def _transaction(store: ExecutionStore, lease):
    async def fn(conn):
        raise AssertionError("a stale holder's transactional step must not run")

    await store.compose.transaction_step(lease, "tx", fn, (), function_name="fn", attempts=1,
                                         check_value=lambda v: None)


async def _child(store: ExecutionStore, lease):
    await store.compose.start_child(lease, "kid", workflow_id="wf", params={},
                                    child_id="stale-1-kid")


WRITES = {
    "step": _step, "timer": _timer, "attempt": _attempt, "effect-begin": _effect_begin,
    "effect-retry": _effect_retry, "effect-park": _effect_park, "signal-consume": _signal,
    "acknowledge": _acknowledge, "release": _release, "transaction-step": _transaction,
    "child-start": _child,
}


@pytest.mark.parametrize("write", list(WRITES))
async def test_a_stale_write_is_refused_and_recorded_once(store, clock, write):
    a, b = await stale_holder(store, clock)
    before = await store.history.get(EID)
    with pytest.raises(LeaseLost):
        await WRITES[write](store, a.lease)
    [rejected] = await rejections(store, a.lease.token)
    assert rejected["kind"] == "fenced_write_rejected"
    after = await store.history.get(EID)
    assert after == {**before, "read_at": after["read_at"]}
    assert await store.history.steps([EID]) == {EID: {}}
    assert await store.history.exists("stale-1-kid") is False


async def test_a_stale_renewal_is_refused_and_recorded_once(store, clock):
    a, b = await stale_holder(store, clock)
    renewed, lost = await store.leases.renew([a.lease], LEASE)
    assert (renewed, lost) == ([], [a.lease])
    [rejected] = await rejections(store, a.lease.token)
    assert rejected["kind"] == "renewal_lost"
