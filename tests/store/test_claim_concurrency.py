"""Concurrent claims and fenced writes against real Postgres.

Every racer is its own ExecutionStore on its own single-connection pool, so
concurrent calls are really concurrent statements in separate sessions (each
test checks the backend pids differ). Rounds are repeated 200 times (more,
up to 600, while an allowed interleaving has not happened yet), and each test
asserts that every allowed interleaving happened at least once
(tests/support/races.py: Outcomes). Each race between a fenced write and a
claim is also forced, one test per interleaving, with a StatementGate: the
first statement is held mid-flight, row locked, while the second runs. The
whole module runs in a few seconds.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from app.store import Admitted, Conflict, Delivery, ExecutionStore, LeaseLost, StepRecord
from tests.support.admission import admitting
from tests.support.races import Outcomes, StatementGate, until_waiting

LEASE = 30.0
ROUNDS = 200


async def racers(open_pool, settings, n: int) -> list[ExecutionStore]:
    stores = [ExecutionStore.from_settings(await open_pool(max_size=1), settings) for _ in range(n)]
    pids = {await s.pool.fetchval("SELECT pg_backend_pid()") for s in stores}
    assert len(pids) == n, "racers must use separate connections"
    return stores


admit = admitting("w")


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
        return await s.leases.claim_due(1, LEASE, f"claimer-{i}")

    winners = Outcomes(*(f"claimer-{i}" for i in range(claimers)))
    for r in winners.rounds(ROUNDS, 1000):
        eid = f"exec-{r}"
        await admit(store, eid)
        expected_token = 1
        if candidate == "lease-expired":
            [first] = await store.leases.claim_due(1, LEASE, "first-holder")
            assert first.lease.execution_id == eid
            await clock.expire_lease(eid)
            expected_token = 2

        # Start the racers in a new order each round: any of them may win.
        order = random.sample(range(claimers), claimers)
        results = await asyncio.gather(*(one(i, stores[i]) for i in order))

        leases = [d.lease for batch in results for d in batch]
        assert len(leases) == 1, f"round {r}: {leases}"
        assert leases[0].execution_id == eid and leases[0].token == expected_token
        rec = await store.history.get(eid)
        assert rec["token"] == expected_token and rec["lease_owner"] == leases[0].owner
        winners.add(leases[0].owner, f"round {r}")
    # Every racer won some round: the statements really arrived in every order.
    winners.assert_each(f"{claimers} claimers of one {candidate} execution, who won")
    assert await store.pool.fetchval(
        "SELECT count(*) FROM execution_events WHERE kind = 'claimed'"
    ) == (winners.total * (2 if candidate == "lease-expired" else 1))


async def check_stale_write(store: ExecutionStore, where: str, eid: str, a: Delivery,
                            b: Delivery, written: StepRecord | LeaseLost) -> None:
    """After A's stale write raced B's claim, B writes the same step: either
    A's write landed strictly before B's claim and B gets A's value, or A got
    LeaseLost (recorded as a rejected fenced write) and B's value stands."""
    assert b.lease.execution_id == eid and b.lease.token == a.lease.token + 1, where
    b_step = await store.steps.write_step(b.lease, "charge", value={"by": "B"})
    steps = (await store.history.steps([eid]))[eid]
    events = await store.history.events(eid)
    recorded = [e for e in events if e["kind"] == "step_recorded"]
    claim_b = next(e for e in events if e["kind"] == "claimed" and e["token"] == b.lease.token)

    assert len(steps) == 1 and len(recorded) == 1, where
    if isinstance(written, StepRecord):
        assert written.token == a.lease.token and written.value == {"by": "A"}, where
        assert b_step.value == {"by": "A"} and b_step.token == a.lease.token, where
        assert steps["charge"] == written, where
        assert recorded[0]["token"] == a.lease.token, where
        assert recorded[0]["seq"] < claim_b["seq"], f"{where}: A's step after B's claim"
    else:
        assert isinstance(written, LeaseLost), f"{where}: {written!r}"
        assert b_step.value == {"by": "B"} and b_step.token == b.lease.token, where
        assert steps["charge"].token == b.lease.token, where
        assert recorded[0]["token"] == b.lease.token, where
        rejected = [e for e in events if e["kind"] == "fenced_write_rejected"]
        assert [e["token"] for e in rejected] == [a.lease.token], where
        assert not [
            e for e in events if e["token"] == a.lease.token and e["kind"] == "step_recorded"
        ], where


async def stale_write_of(store: ExecutionStore, lease) -> StepRecord | LeaseLost:
    try:
        return await store.steps.write_step(lease, "charge", value={"by": "A"})
    except LeaseLost as exc:
        return exc


async def test_a_stale_write_step_racing_a_new_claim_is_recorded_before_it_or_not_at_all(
    store, clock, settings, open_pool
):
    """The stale holder A writes step "charge" while B claims the execution
    after A's lease expired. Allowed outcomes per round, each must occur:

    * claim-first: A's write loses: LeaseLost, nothing recorded by A; B's own
      write of the step records B's value with B's token.
    * write-first: A's write commits before B's claim: recorded with A's
      token strictly before B's claim (in the event history), and B's write
      of the same key returns A's value.
    * claim-skipped-locked-row: B's claim runs while A's write holds the row
      (FOR SHARE): it skips the row, and claims it once A's write committed;
      then as write-first.

    Never both values, never A's write after B's claim.
    """
    stale_store, claimer = await racers(open_pool, settings, 2)
    random.seed(7)
    outcomes = Outcomes("claim-first", "write-first", "claim-skipped-locked-row")

    async def stale_write(lease) -> StepRecord | LeaseLost:
        if random.random() < 0.5:
            await jitter()
        return await stale_write_of(stale_store, lease)

    async def new_claim() -> list[Delivery]:
        if random.random() < 0.5:
            await jitter()
        return await claimer.leases.claim_due(1, LEASE, "worker-B")

    for r in outcomes.rounds(ROUNDS):
        eid = f"exec-{r}"
        await admit(store, eid)
        [a] = await store.leases.claim_due(1, LEASE, "worker-A")
        await clock.expire_lease(eid)

        written, claimed = await asyncio.gather(stale_write(a.lease), new_claim())

        if not claimed:
            # The claim skipped the row A's write held locked; A must have won,
            # and the execution is claimable as soon as A's write committed.
            assert isinstance(written, StepRecord), f"round {r}: nobody got anywhere"
            claimed = await claimer.leases.claim_due(1, LEASE, "worker-B")
            outcomes.add("claim-skipped-locked-row")
        else:
            outcomes.add("write-first" if isinstance(written, StepRecord) else "claim-first")
        [b] = claimed
        await check_stale_write(store, f"round {r}", eid, a, b, written)

    outcomes.assert_each("stale write vs claim")


@pytest.mark.parametrize("order", ["claim-holds-row-write-waits", "write-holds-row-claim-skips",
                                   "write-commits-then-claim"])
async def test_a_stale_write_step_and_a_new_claim_in_each_order(store, clock, pool, order):
    """Each interleaving of the race above, forced: a StatementGate holds the
    first statement mid-flight (its row lock taken, its event not yet
    written) while the second runs."""
    eid = "forced"
    await admit(store, eid)
    [a] = await store.leases.claim_due(1, LEASE, "worker-A")
    await clock.expire_lease(eid)

    if order == "claim-holds-row-write-waits":
        async with StatementGate(pool, "execution_events",
                                 "NEW.kind = 'claimed' AND NEW.token = 2") as gate:
            claim = asyncio.create_task(store.leases.claim_due(1, LEASE, "worker-B"))
            await gate.until_held(also=claim.done)
            write = asyncio.create_task(stale_write_of(store, a.lease))
            # A's FOR SHARE waits for the claim's row lock, then re-reads the row.
            await until_waiting(pool, 1, "row", what="A's write behind the claim",
                                also=write.done)
            assert not write.done()
            await gate.open()
            claimed, written = await claim, await write
        assert isinstance(written, LeaseLost)
    elif order == "write-holds-row-claim-skips":
        async with StatementGate(pool, "execution_events",
                                 "NEW.kind = 'step_recorded' AND NEW.token = 1") as gate:
            write = asyncio.create_task(stale_write_of(store, a.lease))
            await gate.until_held(also=write.done)
            # SKIP LOCKED: the claim does not wait for A's write, it passes over.
            assert await store.leases.claim_due(1, LEASE, "worker-B") == []
            await gate.open()
            written = await write
        assert isinstance(written, StepRecord)
        claimed = await store.leases.claim_due(1, LEASE, "worker-B")
    else:
        written = await stale_write_of(store, a.lease)
        assert isinstance(written, StepRecord)
        claimed = await store.leases.claim_due(1, LEASE, "worker-B")
    [b] = claimed
    await check_stale_write(store, order, eid, a, b, written)


async def stale_ack_of(store: ExecutionStore, lease):
    try:
        return await store.leases.acknowledge(lease, "completed", result={"by": "A"})
    except LeaseLost as exc:
        return exc


async def check_stale_ack(store: ExecutionStore, where: str, eid: str, a: Delivery,
                          acked, claimed: list[Delivery]) -> str:
    rec = await store.history.get(eid)
    if isinstance(acked, LeaseLost):
        [b] = claimed
        assert b.lease.token == a.lease.token + 1, where
        assert rec["status"] == "running" and rec["token"] == b.lease.token, where
        assert rec["outcome"] is None, where
        return "ack-rejected"
    assert claimed == [], f"{where}: claimed a record acknowledged completed"
    assert acked.status == "completed", where
    assert rec["status"] == "completed" and rec["outcome"] == {"result": {"by": "A"}}, where
    assert rec["token"] == a.lease.token, where
    return "ack-first"


async def test_a_stale_acknowledge_racing_a_new_claim_never_lands_after_it(
    store, clock, settings, open_pool
):
    """Same race for acknowledge: either A's ack ends the delivery before B's
    claim (B then finds nothing due, or a completed record it may not claim),
    or A gets LeaseLost and B holds the only lease. Both must occur."""
    stale_store, claimer = await racers(open_pool, settings, 2)
    random.seed(11)
    outcomes = Outcomes("ack-rejected", "ack-first")

    async def stale_ack(lease):
        await jitter()
        return await stale_ack_of(stale_store, lease)

    async def new_claim():
        await jitter()
        return await claimer.leases.claim_due(1, LEASE, "worker-B")

    for r in outcomes.rounds(ROUNDS):
        eid = f"exec-{r}"
        await admit(store, eid)
        [a] = await store.leases.claim_due(1, LEASE, "worker-A")
        await clock.expire_lease(eid)

        acked, claimed = await asyncio.gather(stale_ack(a.lease), new_claim())
        outcomes.add(await check_stale_ack(store, f"round {r}", eid, a, acked, claimed))
    outcomes.assert_each("stale ack vs claim")


@pytest.mark.parametrize("order", ["claim-holds-row-ack-waits", "ack-holds-row-claim-skips",
                                   "ack-commits-then-claim"])
async def test_a_stale_acknowledge_and_a_new_claim_in_each_order(store, clock, pool, order):
    eid = "forced"
    await admit(store, eid)
    [a] = await store.leases.claim_due(1, LEASE, "worker-A")
    await clock.expire_lease(eid)

    if order == "claim-holds-row-ack-waits":
        async with StatementGate(pool, "execution_events",
                                 "NEW.kind = 'claimed' AND NEW.token = 2") as gate:
            claim = asyncio.create_task(store.leases.claim_due(1, LEASE, "worker-B"))
            await gate.until_held(also=claim.done)
            ack = asyncio.create_task(stale_ack_of(store, a.lease))
            # A's UPDATE waits for the claim's row lock, then re-checks the token.
            await until_waiting(pool, 1, "row", what="A's ack behind the claim", also=ack.done)
            assert not ack.done()
            await gate.open()
            claimed, acked = await claim, await ack
        expected = "ack-rejected"
    elif order == "ack-holds-row-claim-skips":
        async with StatementGate(pool, "execution_events",
                                 "NEW.kind = 'acknowledged' AND NEW.token = 1") as gate:
            ack = asyncio.create_task(stale_ack_of(store, a.lease))
            await gate.until_held(also=ack.done)
            assert await store.leases.claim_due(1, LEASE, "worker-B") == []  # skipped, not waited
            await gate.open()
            acked = await ack
        claimed = await store.leases.claim_due(1, LEASE, "worker-B")  # completed: nothing due
        expected = "ack-first"
    else:
        acked = await stale_ack_of(store, a.lease)
        claimed = await store.leases.claim_due(1, LEASE, "worker-B")
        expected = "ack-first"
    assert await check_stale_ack(store, order, eid, a, acked, claimed) == expected


async def test_concurrent_admissions_of_one_id_admit_exactly_once(store, settings, open_pool):
    stores = await racers(open_pool, settings, 8)
    random.seed(3)

    async def one(i: int, s: ExecutionStore, eid: str):
        await jitter()
        return await s.admissions.admit(workflow_id="w", params={"by": i}, execution_id=eid)

    winners = Outcomes(*(f"admitter-{i}" for i in range(8)))
    for r in winners.rounds(50, 1000):
        eid = f"order-{r}"
        order = random.sample(range(8), 8)  # a new start order each round
        results = await asyncio.gather(*(one(i, stores[i], eid) for i in order))
        admitted = [i for i, x in zip(order, results, strict=True) if isinstance(x, Admitted)]
        conflicts = [x for x in results if isinstance(x, Conflict)]
        assert len(admitted) == 1 and len(conflicts) == 7, results
        assert all(c.execution_id == eid for c in conflicts)
        events = await store.history.events(eid)
        assert [e["kind"] for e in events] == ["admitted"]
        assert (await store.history.get(eid))["params"] == {"by": admitted[0]}
        winners.add(f"admitter-{admitted[0]}")
    winners.assert_each("8 admissions of one ID, who won")
    assert await store.pool.fetchval("SELECT count(*) FROM executions") == winners.total


async def check_wake(store: ExecutionStore, where: str, eid: str, d: Delivery) -> str:
    """Acknowledge the claimed delivery `suspended`: a wake that came before
    the claim was covered by it (nothing due after the ack), a later one is
    kept (due after the ack, and claimed once more)."""
    await store.leases.acknowledge(d.lease, "suspended")
    events = await store.history.events(eid)
    wake_id = next(e["event_id"] for e in events if e["kind"] == "wake_requested")
    claim_id = next(e["event_id"] for e in events if e["kind"] == "claimed")
    rec = await store.history.get(eid)
    if wake_id < claim_id:
        outcome = "covered"
        assert rec["due_at"] is None, f"{where}: a covered wake survived the ack"
    else:
        outcome = "kept"
        assert rec["due_at"] is not None, f"{where}: a later wake was lost"
        [again] = await store.leases.claim_due(1, LEASE, "worker-C")
        assert again.lease.execution_id == eid, where
        await store.leases.acknowledge(again.lease, "suspended")
    assert await store.leases.claim_due(10, LEASE, "worker-D") == [], where
    return outcome


async def test_a_wake_racing_a_claim_is_either_covered_by_it_or_kept_for_later(
    store, settings, open_pool
):
    """A claim covers every wake pending when it was claimed; wakes
    requested after the claim stay pending past the acknowledgement. Each
    interleaving must occur: the wake committed before the claim (covered),
    the wake held the row while the claim ran (the claim skips it; the next
    claim covers it), the claim came first (kept)."""
    waker, claimer = await racers(open_pool, settings, 2)
    random.seed(5)
    outcomes = Outcomes("covered", "claim-skipped-locked-row", "kept")

    async def wake(eid: str):
        await jitter()
        return await waker.operator.request_wake(eid)

    async def claim():
        await jitter()
        return await claimer.leases.claim_due(1, LEASE, "worker-B")

    for r in outcomes.rounds(ROUNDS):
        eid = f"exec-{r}"
        await admit(store, eid)

        woken, claimed = await asyncio.gather(wake(eid), claim())

        assert woken == "requested"
        skipped = not claimed
        if skipped:  # the wake held the row: the claim skipped it
            claimed = await claimer.leases.claim_due(1, LEASE, "worker-B")
        [d] = claimed
        outcome = await check_wake(store, f"round {r}", eid, d)
        if skipped:
            assert outcome == "covered", f"round {r}: a skipped claim's retry missed the wake"
            outcome = "claim-skipped-locked-row"
        outcomes.add(outcome)
    outcomes.assert_each("wake vs claim")


@pytest.mark.parametrize("order", ["claim-holds-row-wake-waits", "wake-holds-row-claim-skips",
                                   "wake-commits-then-claim"])
async def test_a_wake_and_a_claim_in_each_order(store, pool, order):
    eid = "forced"
    await admit(store, eid)
    if order == "claim-holds-row-wake-waits":
        async with StatementGate(pool, "execution_events",
                                 "NEW.kind = 'claimed' AND NEW.token = 1") as gate:
            claim = asyncio.create_task(store.leases.claim_due(1, LEASE, "worker-B"))
            await gate.until_held(also=claim.done)
            wake = asyncio.create_task(store.operator.request_wake(eid))
            await until_waiting(pool, 1, "row", what="the wake behind the claim", also=wake.done)
            assert not wake.done()
            await gate.open()
            claimed, woken = await claim, await wake
        expected = "kept"
    elif order == "wake-holds-row-claim-skips":
        async with StatementGate(pool, "execution_events",
                                 "NEW.kind = 'wake_requested'") as gate:
            wake = asyncio.create_task(store.operator.request_wake(eid))
            await gate.until_held(also=wake.done)
            assert await store.leases.claim_due(1, LEASE, "worker-B") == []  # skipped, not waited
            await gate.open()
            woken = await wake
        claimed = await store.leases.claim_due(1, LEASE, "worker-B")
        expected = "covered"
    else:
        woken = await store.operator.request_wake(eid)
        claimed = await store.leases.claim_due(1, LEASE, "worker-B")
        expected = "covered"
    assert woken == "requested"
    [d] = claimed
    assert await check_wake(store, order, eid, d) == expected
