"""A signal racing the delivery that waits for it: no wakeup is lost.

The delivery does what `ctx.wait_for_signal` does with nothing pending: it
tries to consume the signal (`consume_signal`, fenced), finds none, and
acknowledges `suspended`. A sender's `send_signal` stores the signal and
requests a wake in one statement. Whatever the order, the signal is consumed
exactly once: by this delivery, or by the next one its wake starts; never
left pending with nothing due.

The race is run 200 times (more while an outcome has not happened yet) on two
connections and must go both ways; and each interleaving is forced: a
StatementGate holds one statement mid-flight with the row locked, or a
RowLock queues both statements on the row in a chosen order.
"""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from app.store import Delivery, ExecutionStore
from tests.support.admission import admitting
from tests.support.races import Outcomes, RowLock, StatementGate, until_waiting

LEASE = 30.0
ROUNDS = 200
KEY, NAME = "signal:go", "go"


admit = admitting("w")


async def separate_stores(open_pool, settings, n: int) -> list[ExecutionStore]:
    stores = [ExecutionStore.from_settings(await open_pool(max_size=1), settings)
              for _ in range(n)]
    pids = {await s.pool.fetchval("SELECT pg_backend_pid()") for s in stores}
    assert len(pids) == n, "racers must use separate connections"
    return stores


async def suspend_waiting(store: ExecutionStore, d: Delivery) -> None:
    await store.leases.acknowledge(d.lease, "suspended", waiting_on={"signal": NAME, "until": None})


async def waiting_delivery(store: ExecutionStore, d: Delivery) -> str:
    """consume, and with nothing pending, suspend: "consumed" or "suspended"."""
    if await store.signals.consume_signal(d.lease, KEY, NAME) is not None:
        await store.leases.acknowledge(d.lease, "completed", result="got it")
        return "consumed"
    await suspend_waiting(store, d)
    return "suspended"


async def settle(store: ExecutionStore, where: str, eid: str, first: str,
                 payload: dict) -> str:
    """After the race: the signal is consumed exactly once. If the first
    delivery suspended, the signal's wake must have survived its
    acknowledgement: the execution is due, and the next delivery consumes it."""
    if first == "consumed":
        outcome = "consumed by the waiting delivery"
    else:
        outcome = "woke the next delivery"
        rec = await store.history.get(eid)
        assert rec["status"] == "suspended" and rec["due_at"] is not None, (
            f"{where}: the signal's wake was lost: {rec}")
        [again] = await store.leases.claim_due(1, LEASE, "worker-C")
        assert again.lease.execution_id == eid, where
        step = await store.signals.consume_signal(again.lease, KEY, NAME)
        assert step is not None, f"{where}: woken, but no signal to consume"
        await store.leases.acknowledge(again.lease, "completed", result="got it")
    rec = await store.history.get(eid)
    assert rec["status"] == "completed", where
    steps = (await store.history.steps([eid]))[eid]
    assert steps[KEY].value == payload, where
    consumed = await store.pool.fetch(
        "SELECT consumed_step FROM signals WHERE execution_id = $1", eid)
    assert [r["consumed_step"] for r in consumed] == [KEY], where
    assert await store.leases.claim_due(10, LEASE, "worker-D") == [], where
    return outcome


@pytest.mark.citus
async def test_a_signal_racing_its_waiting_delivery_is_never_lost(store, settings, open_pool):
    waiter, sender = await separate_stores(open_pool, settings, 2)
    rng = random.Random(12)
    outcomes = Outcomes("consumed by the waiting delivery", "woke the next delivery")

    # Each side starts up to one send's time late (the longest seen so far):
    # 2 ms on one Postgres, several times that on Citus, where a send is a
    # locking read and a call on the shard's node.
    spread = [0.002]

    async def jitter() -> None:
        if rng.random() < 0.5:
            await asyncio.sleep(rng.random() * spread[0])

    async def wait(d: Delivery) -> str:
        await jitter()
        return await waiting_delivery(waiter, d)

    async def send(eid: str, payload: dict):
        await jitter()
        started = time.monotonic()
        answer = await sender.signals.send_signal(eid, NAME, payload)
        spread[0] = max(spread[0], time.monotonic() - started)
        return answer

    for r in outcomes.rounds(ROUNDS):
        eid = f"sig-{r}"
        await admit(store, eid)
        [d] = await store.leases.claim_due(1, LEASE, "worker-B")
        payload = {"round": r}
        first, sent = await asyncio.gather(wait(d), send(eid, payload))
        assert sent == ("received", None), sent
        outcomes.add(await settle(store, f"round {r}", eid, first, payload))
    outcomes.assert_each("signal vs the delivery waiting for it")


ORDERS = [
    "signal-commits-then-consume",
    "signal-holds-row-consume-waits",
    "consume-then-signal-holds-row-ack-waits",
    "consume-queued-before-signal",
    "consume-then-signal-then-ack",
    "ack-holds-row-signal-waits",
    "ack-then-signal",
]


# Not on Citus: the gates find a statement waiting in the coordinator's
# pg_locks, and there the waits are on the worker node holding the row.
@pytest.mark.parametrize("order", ORDERS)
async def test_a_signal_and_its_waiting_delivery_in_each_order(store, pool, order):
    eid = "sig-forced"
    await admit(store, eid)
    [d] = await store.leases.claim_due(1, LEASE, "worker-B")
    payload = {"order": order}

    def send():
        return asyncio.create_task(store.signals.send_signal(eid, NAME, payload))

    signal_gate = "NEW.kind = 'signal_received'"
    if order == "signal-commits-then-consume":
        assert (await send()) == ("received", None)
        first = await waiting_delivery(store, d)
        expected = "consumed by the waiting delivery"
    elif order == "signal-holds-row-consume-waits":
        # The consume's FOR SHARE waits for the sender's row lock.
        async with StatementGate(pool, "execution_events", signal_gate) as gate:
            sending = send()
            await gate.until_held(also=sending.done)
            consume = asyncio.create_task(store.signals.consume_signal(d.lease, KEY, NAME))
            await until_waiting(pool, 1, "row", what="consume behind the sender",
                                also=consume.done)
            assert not consume.done()
            await gate.open()
            assert await sending == ("received", None)
            taken = await consume
        # The danger this order exists for: the consume misses a signal that
        # committed while it waited (its scan of signals has the statement's
        # snapshot, taken before). That is what Postgres does; its wake must
        # not be lost. Were the signal seen, consuming it now is right too.
        if taken is None:
            await suspend_waiting(store, d)
            first, expected = "suspended", "woke the next delivery"
        else:
            await store.leases.acknowledge(d.lease, "completed", result="got it")
            first, expected = "consumed", "consumed by the waiting delivery"
    elif order == "consume-then-signal-holds-row-ack-waits":
        assert await store.signals.consume_signal(d.lease, KEY, NAME) is None
        async with StatementGate(pool, "execution_events", signal_gate) as gate:
            sending = send()
            await gate.until_held(also=sending.done)
            ack = asyncio.create_task(suspend_waiting(store, d))
            await until_waiting(pool, 1, "row", what="the ack behind the sender", also=ack.done)
            assert not ack.done()
            await gate.open()
            assert await sending == ("received", None)
            await ack
        first, expected = "suspended", "woke the next delivery"
    elif order == "consume-queued-before-signal":
        async with RowLock(pool, eid) as lock:
            consume = asyncio.create_task(store.signals.consume_signal(d.lease, KEY, NAME))
            await until_waiting(pool, 1, "row", what="consume", also=consume.done)
            sending = send()
            await until_waiting(pool, 2, "row", what="the sender behind it", also=sending.done)
            assert not consume.done() and not sending.done()
            await lock.release()
        assert await consume is None and await sending == ("received", None)
        await suspend_waiting(store, d)
        first, expected = "suspended", "woke the next delivery"
    elif order == "consume-then-signal-then-ack":
        assert await store.signals.consume_signal(d.lease, KEY, NAME) is None
        assert (await send()) == ("received", None)
        await suspend_waiting(store, d)
        first, expected = "suspended", "woke the next delivery"
    elif order == "ack-holds-row-signal-waits":
        assert await store.signals.consume_signal(d.lease, KEY, NAME) is None
        async with StatementGate(pool, "execution_events", "NEW.kind = 'acknowledged'") as gate:
            ack = asyncio.create_task(suspend_waiting(store, d))
            await gate.until_held(also=ack.done)
            sending = send()
            await until_waiting(pool, 1, "row", what="the sender behind the ack",
                                also=sending.done)
            assert not sending.done()
            await gate.open()
            await ack
            assert await sending == ("received", None)
        first, expected = "suspended", "woke the next delivery"
    else:
        assert order == "ack-then-signal"
        first = await waiting_delivery(store, d)
        assert first == "suspended"
        assert (await send()) == ("received", None)
        expected = "woke the next delivery"

    assert await settle(store, order, eid, first, payload) == expected
