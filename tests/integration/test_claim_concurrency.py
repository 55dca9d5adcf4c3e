"""Concurrent claims and fenced writes against real Postgres.

Every racer is its own ExecutionStore on its own single-connection pool, so
concurrent calls are really concurrent statements in separate sessions (each
test checks the backend pids differ). Rounds are repeated 200 times; the
whole module runs in a few seconds.
"""

from __future__ import annotations

import asyncio
import collections
import random

import pytest

from app.store import Admitted, Conflict, Delivery, ExecutionStore, LeaseLost, StepRecord

LEASE = 30.0
ROUNDS = 200


async def racers(open_pool, settings, n: int) -> list[ExecutionStore]:
    stores = [ExecutionStore.from_settings(await open_pool(max_size=1), settings) for _ in range(n)]
    pids = {await s.pool.fetchval("SELECT pg_backend_pid()") for s in stores}
    assert len(pids) == n, "racers must use separate connections"
    return stores


async def admit(store: ExecutionStore, execution_id: str) -> None:
    result = await store.admit(workflow_id="w", params={}, execution_id=execution_id)
    assert isinstance(result, Admitted)


async def jitter() -> None:
    """Vary which racer's statement reaches the server first."""
    if random.random() < 0.5:
        await asyncio.sleep(random.random() * 0.001)


@pytest.mark.parametrize("candidate", ["due", "lease-expired"])
@pytest.mark.parametrize("claimers", [2, 8])
async def test_concurrent_claims_of_one_execution_grant_exactly_one_lease(
    store, clock, settings, open_pool, claimers, candidate
):
    stores = await racers(open_pool, settings, claimers)
    random.seed(claimers)

    async def one(i: int, s: ExecutionStore) -> list[Delivery]:
        await jitter()
        return await s.claim_due(1, LEASE, f"claimer-{i}")

    for r in range(ROUNDS):
        eid = f"exec-{r}"
        await admit(store, eid)
        expected_token = 1
        if candidate == "lease-expired":
            [first] = await store.claim_due(1, LEASE, "first-holder")
            assert first.lease.execution_id == eid
            await clock.expire_lease(eid)
            expected_token = 2

        results = await asyncio.gather(*(one(i, s) for i, s in enumerate(stores)))

        leases = [d.lease for batch in results for d in batch]
        assert len(leases) == 1, f"round {r}: {leases}"
        assert leases[0].execution_id == eid and leases[0].token == expected_token
        rec = await store.get(eid)
        assert rec["token"] == expected_token and rec["lease_owner"] == leases[0].owner
    assert await store.pool.fetchval(
        "SELECT count(*) FROM execution_events WHERE kind = 'claimed'"
    ) == (ROUNDS * (2 if candidate == "lease-expired" else 1))


async def test_a_stale_write_step_racing_a_new_claim_is_recorded_before_it_or_not_at_all(
    store, clock, settings, open_pool
):
    """The stale holder A writes step "charge" while B claims the execution
    after A's lease expired. Allowed outcomes per round:

    * A's write loses: LeaseLost, nothing recorded by A; B's own write of the
      step records B's value with B's token.
    * A's write wins: recorded with A's token strictly before B's claim (in
      the event history), and B's write of the same key returns A's value.

    Never both values, never A's write after B's claim.
    """
    stale_store, claimer = await racers(open_pool, settings, 2)
    random.seed(7)
    outcomes: collections.Counter[str] = collections.Counter()

    async def stale_write(lease) -> StepRecord | LeaseLost:
        if random.random() < 0.5:
            await jitter()
        try:
            return await stale_store.write_step(lease, "charge", value={"by": "A"})
        except LeaseLost as exc:
            return exc

    async def new_claim() -> list[Delivery]:
        if random.random() < 0.5:
            await jitter()
        return await claimer.claim_due(1, LEASE, "worker-B")

    for r in range(ROUNDS):
        eid = f"exec-{r}"
        await admit(store, eid)
        [a] = await store.claim_due(1, LEASE, "worker-A")
        await clock.expire_lease(eid)

        written, claimed = await asyncio.gather(stale_write(a.lease), new_claim())

        if not claimed:
            # The claim skipped the row A's write held locked; A must have won,
            # and the execution is claimable as soon as A's write committed.
            assert isinstance(written, StepRecord), f"round {r}: nobody got anywhere"
            claimed = await claimer.claim_due(1, LEASE, "worker-B")
            outcomes["claim-skipped-locked-row"] += 1
        [b] = claimed
        assert b.lease.execution_id == eid and b.lease.token == a.lease.token + 1

        b_step = await store.write_step(b.lease, "charge", value={"by": "B"})
        steps = (await store.steps([eid]))[eid]
        events = await store.events(eid)
        recorded = [e for e in events if e["kind"] == "step_recorded"]
        claim_b = next(e for e in events if e["kind"] == "claimed" and e["token"] == b.lease.token)

        assert len(steps) == 1 and len(recorded) == 1
        if isinstance(written, StepRecord):
            outcomes["stale-write-first"] += 1
            assert written.token == a.lease.token and written.value == {"by": "A"}
            assert b_step.value == {"by": "A"} and b_step.token == a.lease.token
            assert steps["charge"] == written
            assert recorded[0]["token"] == a.lease.token
            assert recorded[0]["event_id"] < claim_b["event_id"], (
                f"round {r}: A's step after B's claim"
            )
        else:
            outcomes["stale-write-rejected"] += 1
            assert isinstance(written, LeaseLost), written
            assert b_step.value == {"by": "B"} and b_step.token == b.lease.token
            assert steps["charge"].token == b.lease.token
            assert recorded[0]["token"] == b.lease.token
            rejected = [e for e in events if e["kind"] == "fenced_write_rejected"]
            assert [e["token"] for e in rejected] == [a.lease.token]
            assert not [
                e for e in events if e["token"] == a.lease.token and e["kind"] == "step_recorded"
            ]

    print(f"\nstale write vs claim, {ROUNDS} rounds: {dict(outcomes)}")
    assert outcomes["stale-write-first"] + outcomes["stale-write-rejected"] == ROUNDS


async def test_a_stale_acknowledge_racing_a_new_claim_never_lands_after_it(
    store, clock, settings, open_pool
):
    """Same race for acknowledge: either A's ack ends the delivery before B's
    claim (B then finds nothing due, or a completed record it may not claim),
    or A gets LeaseLost and B holds the only lease."""
    stale_store, claimer = await racers(open_pool, settings, 2)
    random.seed(11)
    outcomes: collections.Counter[str] = collections.Counter()

    async def stale_ack(lease):
        await jitter()
        try:
            return await stale_store.acknowledge(lease, "completed", result={"by": "A"})
        except LeaseLost as exc:
            return exc

    async def new_claim():
        await jitter()
        return await claimer.claim_due(1, LEASE, "worker-B")

    for r in range(ROUNDS):
        eid = f"exec-{r}"
        await admit(store, eid)
        [a] = await store.claim_due(1, LEASE, "worker-A")
        await clock.expire_lease(eid)

        acked, claimed = await asyncio.gather(stale_ack(a.lease), new_claim())

        rec = await store.get(eid)
        if isinstance(acked, LeaseLost):
            outcomes["ack-rejected"] += 1
            [b] = claimed
            assert rec["status"] == "running" and rec["token"] == b.lease.token
            assert rec["outcome"] is None
        else:
            outcomes["ack-first"] += 1
            assert claimed == [], f"round {r}: claimed a record acknowledged completed"
            assert rec["status"] == "completed" and rec["outcome"] == {"result": {"by": "A"}}
            assert rec["token"] == a.lease.token
    print(f"\nstale ack vs claim, {ROUNDS} rounds: {dict(outcomes)}")


async def test_concurrent_admissions_of_one_id_admit_exactly_once(store, settings, open_pool):
    stores = await racers(open_pool, settings, 8)
    random.seed(3)

    async def one(i: int, s: ExecutionStore, eid: str):
        await jitter()
        return await s.admit(workflow_id="w", params={"by": i}, execution_id=eid)

    for r in range(50):
        eid = f"order-{r}"
        results = await asyncio.gather(*(one(i, s, eid) for i, s in enumerate(stores)))
        admitted = [x for x in results if isinstance(x, Admitted)]
        conflicts = [x for x in results if isinstance(x, Conflict)]
        assert len(admitted) == 1 and len(conflicts) == 7, results
        assert all(c.execution_id == eid for c in conflicts)
        events = await store.events(eid)
        assert [e["kind"] for e in events] == ["admitted"]
    assert await store.pool.fetchval("SELECT count(*) FROM executions") == 50


async def test_a_wake_racing_a_claim_is_either_covered_by_it_or_kept_for_later(
    store, settings, open_pool
):
    """RFC 001: a claim covers every wake pending when it was claimed; wakes
    requested after the claim stay pending past the acknowledgement."""
    waker, claimer = await racers(open_pool, settings, 2)
    random.seed(5)
    outcomes: collections.Counter[str] = collections.Counter()

    async def wake(eid: str):
        await jitter()
        return await waker.request_wake(eid)

    async def claim():
        await jitter()
        return await claimer.claim_due(1, LEASE, "worker-B")

    for r in range(ROUNDS):
        eid = f"exec-{r}"
        await admit(store, eid)

        woken, claimed = await asyncio.gather(wake(eid), claim())

        assert woken == "requested"
        if not claimed:  # the wake held the row: the claim skipped it
            claimed = await claimer.claim_due(1, LEASE, "worker-B")
        [d] = claimed
        await store.acknowledge(d.lease, "suspended")
        events = await store.events(eid)
        wake_id = next(e["event_id"] for e in events if e["kind"] == "wake_requested")
        claim_id = next(e["event_id"] for e in events if e["kind"] == "claimed")
        rec = await store.get(eid)
        if wake_id < claim_id:
            outcomes["covered"] += 1
            assert rec["due_at"] is None, f"round {r}: a covered wake survived the ack"
        else:
            outcomes["kept"] += 1
            assert rec["due_at"] is not None, f"round {r}: a later wake was lost"
            [again] = await store.claim_due(1, LEASE, "worker-C")
            assert again.lease.execution_id == eid
            await store.acknowledge(again.lease, "suspended")
        assert await store.claim_due(10, LEASE, "worker-D") == []
    print(f"\nwake vs claim, {ROUNDS} rounds: {dict(outcomes)}")
