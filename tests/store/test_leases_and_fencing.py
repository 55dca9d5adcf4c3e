"""Leases and fencing, store side, against real Postgres: `claim_due` hands
out a lease (a token and an expiry), `renew` extends it (batched), `release`
and `acknowledge` end it, and every fenced write (`write_step`, `acknowledge`,
...) of a holder whose token is no longer current is rejected: `LeaseLost`,
or the `lost` half of renew's answer. A delivery's "retry" reply is a release.
Each test is named after the behaviour it checks. Time moves by UPDATE-ing the
record (tests/support/clocks.py), never by sleeping.

Where a behaviour needs a worker process, its store side is tested here (the
worker side: tests/sdk/test_dispatch.py and tests/worker_processes):

* A worker crashes: a lease that is neither renewed nor released is not
  handed out before it expires, and is delivered again, with a higher token,
  after it has.
* The process holding a lease dies: once a new claim exists, every fenced
  write of the old holder is rejected (the fencing tests below).
* N executions due with concurrency N, or more due than concurrency:
  claim_due returns at most `limit` leases and never the same execution twice.
* Several dispatchers share one database: several claimers on separate
  connections never hold two live leases (here and, hammered, in
  test_claim_concurrency.py).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from app.reaper import LeaseReaper
from app.store import Delivery, ExecutionStore, LeaseLost
from tests.support.admission import admitting
from tests.support.claims import claim, claim_one
from tests.support.races import Outcomes

LEASE = 30.0  # as `claim` (tests/support/claims.py) takes them
WORKFLOW = "charge-order"


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #


admit = admitting(WORKFLOW, params={"orderId": 42})



async def reclaimed(store: ExecutionStore, clock, execution_id: str) -> tuple[Delivery, Delivery]:
    """Holder A claims; its lease expires; holder B claims. Returns (A, B)."""
    a = await claim_one(store, execution_id, owner="worker-A")
    await clock.expire_lease(execution_id)
    b = await claim_one(store, execution_id, owner="worker-B")
    assert b.lease.token == a.lease.token + 1
    return a, b


def redelivery_delay(rec: dict) -> float:
    return (rec["redeliver_after"] - rec["last_unacknowledged_at"]).total_seconds()


async def kinds(store: ExecutionStore, execution_id: str) -> list[str]:
    return [e["kind"] for e in await store.history.events(execution_id)]


# --------------------------------------------------------------------------- #
# lease table
# --------------------------------------------------------------------------- #


async def test_two_dispatchers_call_claim_due_concurrently_for_one_due_execution(
    store, settings, open_pool
):
    """A short version; test_claim_concurrency.py repeats it 200 times."""
    d1 = ExecutionStore.from_settings(await open_pool(), settings)
    d2 = ExecutionStore.from_settings(await open_pool(), settings)
    pids = {
        await d1.pool.fetchval("SELECT pg_backend_pid()"),
        await d2.pool.fetchval("SELECT pg_backend_pid()"),
    }
    assert len(pids) == 2  # two connections, two sessions
    winners = Outcomes("d1", "d2")
    for i in winners.rounds(20, 200):
        await admit(store, f"order-{i}")
        # Either dispatcher's statement may be sent first.
        first, second = (d1, d2) if i % 2 else (d2, d1)
        got = await asyncio.gather(first.leases.claim_due(1, LEASE, "d1" if first is d1 else "d2"),
                                   second.leases.claim_due(1, LEASE, "d1" if second is d1 else "d2"))
        leases = [d.lease for batch in got for d in batch]
        assert [lease.execution_id for lease in leases] == [f"order-{i}"]
        assert leases[0].token == 1
        winners.add(leases[0].owner)
    winners.assert_each("two dispatchers, one due execution, who won")


async def test_claim_due_claims_a_due_execution(store, clock):
    await admit(store, "order-42")
    t0 = await clock.now()

    d = await claim_one(store, "order-42", owner="worker-7")

    rec = await store.history.get("order-42")
    assert rec["status"] == "running"
    assert rec["token"] == d.lease.token == 1
    assert rec["lease_owner"] == d.lease.owner == "worker-7"
    assert rec["lease_expires_at"] == d.lease.expires_at
    assert t0 + timedelta(seconds=LEASE) <= d.lease.expires_at <= await clock.later(LEASE)
    assert rec["due_at"] is None  # the covered wake is no longer pending
    assert (d.workflow_id, d.params, d.status_before) == (WORKFLOW, {"orderId": 42}, "admitted")
    assert await kinds(store, "order-42") == ["admitted", "claimed"]


async def test_a_lease_expires_without_renewal(store, clock):
    await admit(store, "order-42")
    a = await claim_one(store, "order-42", owner="worker-A")

    # Expired just now: the first redelivery delay (1 s) is still running.
    await clock.expire_lease("order-42", ago=0.1)
    rec = await store.history.get("order-42")
    assert rec["lease_expires_at"] is None and rec["status"] == "admitted"
    assert redelivery_delay(rec) == pytest.approx(1.0)
    assert await claim(store, owner="worker-B") == {}

    await clock.expire_lease("order-42", ago=1.5)
    b = await claim_one(store, "order-42", owner="worker-B")
    assert b.lease.token > a.lease.token
    rec = await store.history.get("order-42")
    assert rec["status"] == "running" and rec["lease_owner"] == "worker-B"
    assert rec["token"] == b.lease.token


@pytest.mark.parametrize("ended_by", ["healed-read", "reaper", "takeover"])
async def test_a_lease_expires_after_an_earlier_suspended_delivery(store, clock, ended_by):
    await admit(store, "order-42")
    d = await claim_one(store, "order-42")
    await store.leases.acknowledge(d.lease, "suspended")
    await store.operator.request_wake("order-42")
    second = await claim_one(store, "order-42")
    assert second.status_before == "suspended"
    await clock.expire_lease("order-42")

    if ended_by == "reaper":
        assert (await LeaseReaper(store).run_once()).execution_ids == ["order-42"]
    elif ended_by == "takeover":
        third = await claim_one(store, "order-42", owner="worker-2")
        assert third.status_before == "suspended"
        await clock.expire_lease("order-42")
    rec = await store.history.get("order-42")
    assert rec["status"] == "suspended"
    assert rec["outcome"] is None


@pytest.mark.parametrize("ended_by", ["healed-read", "reaper", "takeover"])
async def test_a_lease_expires_before_any_acknowledgement(store, clock, ended_by):
    await admit(store, "order-42")
    await claim_one(store, "order-42")
    await clock.expire_lease("order-42")

    if ended_by == "reaper":
        assert (await LeaseReaper(store).run_once()).expired == 1
    elif ended_by == "takeover":
        assert (await claim_one(store, "order-42", owner="worker-2")).status_before == "admitted"
        await clock.expire_lease("order-42")
    rec = await store.history.get("order-42")
    assert rec["status"] == "admitted"
    assert rec["outcome"] is None


async def test_renewal_keeps_the_lease_past_its_original_expiry(store, clock):
    await admit(store, "order-42")
    d = await claim_one(store, "order-42")
    original_expiry = d.lease.expires_at
    lease = d.lease

    # Three renewal periods of 25 s each: 75 s in all, well past the 30 s lease.
    for _ in range(3):
        await clock.backdate_lease("order-42", 25)
        t = await clock.now()
        renewed, lost = await store.leases.renew([lease], LEASE)
        assert lost == [] and len(renewed) == 1
        assert renewed[0].token == lease.token
        assert renewed[0].expires_at >= t + timedelta(seconds=LEASE)  # a full period again
        assert (await clock.raw("order-42"))["lease_expires_at"] == renewed[0].expires_at
        lease = renewed[0]
        assert await claim(store, owner="worker-2") == {}
        assert (await store.history.get("order-42"))["status"] == "running"

    # Shifted back by the 75 s that "passed", the original expiry is long gone.
    assert original_expiry - timedelta(seconds=75) < await clock.now()
    await store.steps.write_step(lease, "charge-card", value={"receipt": "r-1"})
    ack = await store.leases.acknowledge(lease, "completed", result={"receipt": "r-1"})
    assert ack.status == "completed"
    assert (await kinds(store, "order-42")).count("claimed") == 1
    assert (await store.history.get("order-42"))["unacknowledged_deliveries"] == 0


@pytest.mark.parametrize("stale_because", ["reclaimed", "acknowledged", "released", "reaped"])
async def test_renewal_uses_a_stale_token(store, clock, stale_because):
    await admit(store, "order-42")
    d = await claim_one(store, "order-42", owner="worker-A")
    current = None
    if stale_because == "reclaimed":
        await clock.expire_lease("order-42")
        current = await claim_one(store, "order-42", owner="worker-B")
    elif stale_because == "acknowledged":
        await store.leases.acknowledge(d.lease, "suspended")
    elif stale_because == "released":
        await store.leases.release(d.lease)
    else:
        await clock.expire_lease("order-42")
        await store.leases.reap_expired()
    before = await store.history.get("order-42")

    renewed, lost = await store.leases.renew([d.lease], LEASE)

    assert renewed == [] and lost == [d.lease]
    after = await store.history.get("order-42")
    assert after["lease_expires_at"] == before["lease_expires_at"]
    assert after["status"] == before["status"] and after["token"] == before["token"]
    last = (await store.history.events("order-42"))[-1]
    if stale_because in ("acknowledged", "released"):
        # The holder ended the lease itself: a renewal racing its own
        # acknowledgement or release is not a loss worth a history entry.
        assert last["kind"] == stale_because
    else:
        assert last["kind"] == "renewal_lost" and last["token"] == d.lease.token
    if current is not None:
        # One batch with a stale and a current lease: only the current one renews.
        renewed, lost = await store.leases.renew([d.lease, current.lease], LEASE)
        assert [x.token for x in renewed] == [current.lease.token]
        assert lost == [d.lease]


async def test_a_lease_is_released(store, clock):
    await admit(store, "order-42")
    d = await claim_one(store, "order-42")

    assert await store.leases.release(d.lease) is None

    rec = await store.history.get("order-42")
    assert rec["status"] == "admitted"
    assert rec["lease_owner"] is None and rec["lease_expires_at"] is None
    assert rec["unacknowledged_deliveries"] == 1
    assert redelivery_delay(rec) > 0
    assert await claim(store, owner="worker-2") == {}  # not before the delay
    await clock.backdate_redelivery("order-42", redelivery_delay(rec))
    again = await claim_one(store, "order-42", owner="worker-2")
    assert again.lease.token > d.lease.token
    with pytest.raises(LeaseLost):  # a released lease is over
        await store.leases.release(d.lease)


async def test_a_delivery_acknowledges_suspended_with_a_future_wake_requested_during_it(
    store, clock
):
    await admit(store, "order-42")
    d = await claim_one(store, "order-42")
    wake_at = await clock.later(600)
    await store.operator.request_wake("order-42", wake_at)

    await store.leases.acknowledge(d.lease, "suspended")

    rec = await store.history.get("order-42")
    assert rec["status"] == "suspended"
    assert rec["lease_owner"] is None and rec["lease_expires_at"] is None
    assert rec["due_at"] == wake_at
    assert (await store.leases.renew([d.lease], LEASE))[1] == [d.lease]  # the lease has ended
    assert await claim(store) == {}
    await clock.backdate_due("order-42", 601)
    assert (await claim_one(store, "order-42")).lease.token == d.lease.token + 1


async def test_a_delivery_acknowledges_suspended_with_no_wake_requested_during_it(store, clock):
    await admit(store, "order-42")
    d = await claim_one(store, "order-42")

    await store.leases.acknowledge(d.lease, "suspended")

    rec = await store.history.get("order-42")
    assert rec["status"] == "suspended"
    assert rec["lease_expires_at"] is None
    assert rec["due_at"] is None
    await clock.backdate_due("order-42", 3600)  # no amount of time makes it due
    assert await claim(store) == {}
    with pytest.raises(LeaseLost):
        await store.leases.release(d.lease)


async def test_a_worker_crashes(store, clock):
    """Store side: the crashed worker neither renews nor releases."""
    await admit(store, "order-42")
    crashed = await claim_one(store, "order-42", owner="worker-crashed")

    await clock.backdate_lease("order-42", LEASE - 2)  # still live, two seconds left
    assert await claim(store, owner="worker-2") == {}
    await clock.expire_lease("order-42", ago=5)  # expired 5 s ago; first delay is 1 s
    again = await claim_one(store, "order-42", owner="worker-2")
    assert again.lease.token == crashed.lease.token + 1
    assert again.unacknowledged_deliveries == 1  # the crash counted


# --------------------------------------------------------------------------- #
# fencing table
# --------------------------------------------------------------------------- #


async def test_a_stale_holder_writes_a_heap_step_after_a_reclaim(store, clock):
    await admit(store, "order-42")
    a = await claim_one(store, "order-42", owner="worker-A")
    await store.steps.write_step(a.lease, "load-order", value={"status": "open"})
    await clock.expire_lease("order-42")
    b = await claim_one(store, "order-42", owner="worker-B")
    await store.steps.write_step(b.lease, "charge-card", value={"receipt": "by-B"})
    steps_before = await store.history.steps(["order-42"])

    with pytest.raises(LeaseLost):
        await store.steps.write_step(a.lease, "charge-card", value={"receipt": "by-A"})
    with pytest.raises(LeaseLost):
        await store.steps.write_step(a.lease, "ship-order", value={"shipped": True})
    with pytest.raises(LeaseLost):
        await store.steps.write_step(a.lease, "load-order", value={"status": "closed"})

    steps = await store.history.steps(["order-42"])
    assert steps == steps_before
    assert steps["order-42"]["charge-card"].value == {"receipt": "by-B"}
    assert steps["order-42"]["charge-card"].token == b.lease.token
    assert steps["order-42"]["load-order"].token == a.lease.token
    rejected = [e for e in await store.history.events("order-42") if e["kind"] == "fenced_write_rejected"]
    assert [(e["token"], e["detail"]["stepKey"]) for e in rejected] == [
        (a.lease.token, "charge-card"),
        (a.lease.token, "ship-order"),
        (a.lease.token, "load-order"),
    ]


@pytest.mark.parametrize("current_state", ["running", "completed"])
async def test_a_stale_holder_acknowledges_after_a_reclaim(store, clock, current_state):
    await admit(store, "order-42")
    a, b = await reclaimed(store, clock, "order-42")
    if current_state == "completed":
        await store.leases.acknowledge(b.lease, "completed", result={"by": "B"})
    before = await store.history.get("order-42")

    for status, kw in (
        ("completed", {"result": {"by": "A"}}),
        ("failed", {"error": {"name": "E", "message": "from A"}}),
        ("suspended", {}),
    ):
        with pytest.raises(LeaseLost):
            await store.leases.acknowledge(a.lease, status, **kw)

    after = await store.history.get("order-42")
    assert (after["status"], after["outcome"], after["token"]) == (
        before["status"],
        before["outcome"],
        before["token"],
    )
    assert after["lease_expires_at"] == before["lease_expires_at"]


async def test_a_holder_pauses_past_expiry_another_claims_and_the_first_resumes(store, clock):
    await admit(store, "order-42")
    a = await claim_one(store, "order-42", owner="worker-A")
    await store.steps.write_step(a.lease, "load-order", value={"status": "open"})
    await clock.expire_lease("order-42")  # A is paused (GC, frozen VM...)
    b = await claim_one(store, "order-42", owner="worker-B")
    before = await store.history.get("order-42")

    # A resumes: every fenced write it makes is rejected.
    with pytest.raises(LeaseLost):
        await store.steps.write_step(a.lease, "charge-card", value={"receipt": "by-A"})
    renewed, lost = await store.leases.renew([a.lease], LEASE)
    assert renewed == [] and lost == [a.lease]
    with pytest.raises(LeaseLost):
        await store.leases.release(a.lease)
    with pytest.raises(LeaseLost):
        await store.leases.acknowledge(a.lease, "completed", result={"by": "A"})
    with pytest.raises(LeaseLost):
        await store.leases.acknowledge(a.lease, "suspended")

    after = await store.history.get("order-42")
    for key in (
        "status",
        "token",
        "lease_owner",
        "lease_expires_at",
        "unacknowledged_deliveries",
        "outcome",
    ):
        assert after[key] == before[key], key
    assert "charge-card" not in (await store.history.steps(["order-42"]))["order-42"]

    # B is unaffected.
    assert (await store.leases.renew([b.lease], LEASE))[0][0].token == b.lease.token
    step = await store.steps.write_step(b.lease, "charge-card", value={"receipt": "by-B"})
    assert step.value == {"receipt": "by-B"} and step.token == b.lease.token
    assert (await store.leases.acknowledge(b.lease, "completed", result="ok")).status == "completed"


async def test_the_current_holder_rewrites_an_existing_step_record(store, clock):
    await admit(store, "order-42")
    d = await claim_one(store, "order-42")
    first = await store.steps.write_step(
        d.lease, "charge-card", value={"receipt": "r-1"}, function_name="charge"
    )

    again = await store.steps.write_step(d.lease, "charge-card", value={"receipt": "r-2"}, attempts=3)
    failed = await store.steps.write_step(d.lease, "charge-card", error={"name": "E", "message": "m"})

    assert again == first and failed == first
    assert (await store.history.steps(["order-42"]))["order-42"]["charge-card"] == first
    assert (await kinds(store, "order-42")).count("step_recorded") == 1

    # A later holder replaying the step gets the recorded value too.
    await store.leases.release(d.lease)
    await clock.backdate_redelivery("order-42", 3600)
    later = await claim_one(store, "order-42")
    assert await store.steps.write_step(later.lease, "charge-card", value={"receipt": "r-3"}) == first


@pytest.mark.parametrize("current_acknowledges", ["suspended", "completed"])
async def test_a_stale_holder_requests_a_wake(store, clock, current_acknowledges):
    await admit(store, "order-42")
    a, b = await reclaimed(store, clock, "order-42")

    # Wakes are unfenced: the stale holder's wake is accepted.
    assert await store.operator.request_wake(a.lease.execution_id) == "requested"
    await store.steps.write_step(b.lease, "charge-card", value={"receipt": "r-1"})
    await store.leases.acknowledge(b.lease, current_acknowledges, result={"receipt": "r-1"})

    extra = 0
    for _ in range(3):
        claimed = await claim(store)
        if not claimed:
            break
        extra += 1
        d = claimed["order-42"]
        # The replay finds the recorded step; it acknowledges without new wakes.
        assert (await store.steps.write_step(d.lease, "charge-card", value={"receipt": "r-2"})).value == {
            "receipt": "r-1"
        }
        await store.leases.acknowledge(d.lease, "suspended")
    assert extra == (1 if current_acknowledges == "suspended" else 0)
    rec = await store.history.get("order-42")
    if current_acknowledges == "completed":
        assert rec["outcome"] == {"result": {"receipt": "r-1"}}
    assert (await store.history.steps(["order-42"]))["order-42"]["charge-card"].value == {"receipt": "r-1"}


# --------------------------------------------------------------------------- #
# dispatcher table (store side)
# --------------------------------------------------------------------------- #


async def test_more_executions_are_due_than_concurrency(store):
    """Store side: claim_due hands out at most `limit` leases per call."""
    for i in range(7):
        await admit(store, f"order-{i}")
    seen: list[str] = []
    for expected in (3, 3, 1, 0):
        batch = await store.leases.claim_due(3, LEASE, "worker-1")
        assert len(batch) == expected
        seen += [d.lease.execution_id for d in batch]
    assert sorted(seen) == sorted(f"order-{i}" for i in range(7))
    assert await store.leases.claim_due(0, LEASE, "worker-1") == []


async def test_several_dispatchers_share_one_backend(store, settings, open_pool):
    """Store side: four dispatchers on their own connections claim
    concurrently until nothing is due; no execution gets two leases."""
    n = 60
    for i in range(n):
        await admit(store, f"order-{i}")
    dispatchers = [ExecutionStore.from_settings(await open_pool(), settings) for _ in range(4)]
    # Each connection has claimed once before the race (a workflow nobody
    # admitted: nothing taken): a fresh backend's first claim (loading the
    # catalog, planning the statement) takes several warm claims' time, and
    # on a loaded machine the first one warm drained all 60 alone (CI).
    for s in dispatchers:
        assert await s.leases.claim_due(3, LEASE, "warm-up", workflow_ids=["no-such-workflow"]) == []

    # All four start claiming together: one must not drain the queue before
    # the others have even begun.
    start = asyncio.Barrier(len(dispatchers))

    async def run(idx: int, s: ExecutionStore) -> list[Delivery]:
        got: list[Delivery] = []
        await start.wait()
        while batch := await s.leases.claim_due(3, LEASE, f"dispatcher-{idx}"):
            got += batch
        return got

    results = await asyncio.gather(*(run(i, s) for i, s in enumerate(dispatchers)))
    leases = [d.lease for batch in results for d in batch]
    assert len(leases) == n
    # They really claimed side by side: more than one dispatcher got some.
    assert sum(1 for r in results if r) >= 2, [len(r) for r in results]
    assert sorted(lease.execution_id for lease in leases) == sorted(f"order-{i}" for i in range(n))
    assert {lease.token for lease in leases} == {1}
    live = await store.pool.fetchval(
        "SELECT count(*) FROM executions WHERE status = 'running' AND lease_expires_at > now()"
    )
    assert live == n


async def test_a_delivery_replies_retry(store, clock):
    await admit(store, "order-42")
    for expected in (1, 2, 3):
        d = await claim_one(store, "order-42")
        await store.leases.release(d.lease)  # the retry reply
        rec = await store.history.get("order-42")
        assert rec["unacknowledged_deliveries"] == expected
        assert rec["lease_expires_at"] is None and rec["status"] == "admitted"
        released = (await store.history.events("order-42"))[-1]
        assert released["kind"] == "released"
        assert released["detail"]["unacknowledgedDeliveries"] == expected
        await clock.backdate_redelivery("order-42", 3600)


async def test_a_delivery_replies_retry_several_times_in_a_row(store, clock):
    await admit(store, "order-42")
    delays: list[float] = []
    for _ in range(8):
        d = await claim_one(store, "order-42")
        await store.leases.release(d.lease)
        rec = await store.history.get("order-42")
        delay = redelivery_delay(rec)
        delays.append(delay)
        # Not claimable before the delay has passed, claimable once it has.
        assert await claim(store) == {}
        await clock.backdate_redelivery("order-42", delay)
    assert all(x > 0 for x in delays)
    assert delays == sorted(delays), delays
    assert delays[-1] > delays[0]


async def test_the_redelivery_delay_never_decreases_up_to_its_cap(pool, clock):
    store = ExecutionStore(pool, redelivery_base_seconds=0.25, redelivery_cap_seconds=3.0)
    await admit(store, "order-42")
    delays = []
    for _ in range(10):
        d = await claim_one(store, "order-42")
        await store.leases.release(d.lease)
        delays.append(redelivery_delay(await store.history.get("order-42")))
        await clock.backdate_redelivery("order-42", 3600)
    assert delays[:5] == pytest.approx([0.25, 0.5, 1.0, 2.0, 3.0])
    assert delays[5:] == pytest.approx([3.0] * 5)


@pytest.mark.parametrize("ended_by", ["healed-read", "reaper", "takeover"])
async def test_a_lease_expires_after_a_retry_reply(store, clock, ended_by):
    await admit(store, "order-42")
    d = await claim_one(store, "order-42")
    await store.leases.release(d.lease)
    await clock.backdate_redelivery("order-42", 3600)
    await claim_one(store, "order-42")
    await clock.expire_lease("order-42")

    if ended_by == "reaper":
        await LeaseReaper(store).run_once()
        assert (await clock.raw("order-42"))["unacknowledged_deliveries"] == 2
    elif ended_by == "takeover":
        third = await claim_one(store, "order-42", owner="worker-2")
        assert third.unacknowledged_deliveries == 2
        return
    rec = await store.history.get("order-42")
    assert rec["unacknowledged_deliveries"] == 2
    assert redelivery_delay(rec) == pytest.approx(2.0)  # base * 2^(2-1)


async def test_a_delivery_is_acknowledged_after_several_retry_replies(store, clock):
    await admit(store, "order-42")
    for _ in range(4):
        d = await claim_one(store, "order-42")
        await store.leases.release(d.lease)
        await clock.backdate_redelivery("order-42", 3600)
    assert (await store.history.get("order-42"))["unacknowledged_deliveries"] == 4
    d = await claim_one(store, "order-42")

    await store.leases.acknowledge(d.lease, "suspended")

    rec = await store.history.get("order-42")
    assert rec["unacknowledged_deliveries"] == 0
    assert rec["redeliver_after"] is None and rec["last_unacknowledged_at"] is None
    assert await store.operator.request_wake("order-42") == "requested"
    assert (await claim_one(store, "order-42")).lease.token == d.lease.token + 1  # not delayed
