"""Transactional steps: `ctx.transaction(key, fn, *args)` runs `fn(conn, *args)`
inside the transaction that checks the token and records the step's receipt.

The application's row lives in its own schema (shop.orders). Either the row
and the receipt (execution_steps) commit together, or neither does; a stale
holder racing a new claim is rolled back before it can commit anything;
replay returns the recorded result without running `fn`.
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections import Counter

import pytest

from app.sdk import json_problem
from app.store import ExecutionStore, LeaseLost, StepRecord
from tests.compose import flows
from tests.compose.helpers import claim_one, expire_lease, orders
from tests.support.admission import admit
from tests.support.history import events_of, step_rows
from tests.support.races import Outcomes, StatementGate, until_waiting
from tests.support.waiting import wait_status, wait_until

RACE_ROUNDS = 150


async def run_txn(store, workers, eid: str, **params) -> dict:
    await workers.start(concurrency=2)
    await admit(store, "cmp-txn", eid, {"order_id": f"order-{eid}", **params})
    return await wait_status(store, eid, "completed", "failed")


# ------------------------------------------------------------------ commit together


@pytest.mark.citus
async def test_row_and_receipt_both_present_after_success(store, workers, pool):
    record = await run_txn(store, workers, "txn-ok", amount_cents=4200)

    assert record["status"] == "completed", record["outcome"]
    assert record["outcome"]["result"] == {"order": {"orderId": "order-txn-ok", "amountCents": 4200}}
    rows = await orders(pool, "txn-ok")
    assert rows == [{"order_id": "order-txn-ok", "execution_id": "txn-ok", "holder": None,
                     "amount_cents": 4200}]
    steps = await step_rows(pool, "txn-ok")
    assert set(steps) == {"create-order"}
    receipt = steps["create-order"]
    assert receipt["status"] == "completed"
    assert receipt["value"] == {"orderId": "order-txn-ok", "amountCents": 4200}
    assert receipt["function_name"] == "insert_order"
    assert receipt["token"] == 1 and receipt["attempts"] == 1
    recorded = await events_of(store, "txn-ok", "step_recorded")
    assert [e["detail"] for e in recorded] == [
        {"stepKey": "create-order", "status": "completed", "transaction": True}
    ]
    assert flows.calls("txn-ok", "insert_order") == 1


@pytest.mark.citus
async def test_an_exception_in_fn_leaves_neither_row_nor_receipt(store, workers, pool):
    record = await run_txn(store, workers, "txn-fail", mode="fail")

    # StepFailed was raised into the workflow (which caught it and returned).
    assert record["status"] == "completed", record["outcome"]
    assert record["outcome"]["result"] == {"failed": {
        "step": "create-order", "name": "ValueError",
        "message": "card declined for order-txn-fail"}}
    assert await orders(pool, "txn-fail") == []  # the insert was rolled back
    steps = await step_rows(pool, "txn-fail")
    # No receipt of success: the step's record is its failure.
    assert set(steps) == {"create-order"}
    assert steps["create-order"]["status"] == "failed"
    assert steps["create-order"]["value"] is None
    assert steps["create-order"]["error"] == {"name": "ValueError",
                                              "message": "card declined for order-txn-fail"}
    assert flows.calls("txn-fail", "insert_order") == 1


@pytest.mark.parametrize(("mode", "error_name"), [
    ("not-json", "TypeError"),          # fn's value is not JSON
    ("nul", "StepResultNotJSON"),       # JSON, but jsonb cannot store \u0000
])
@pytest.mark.citus
async def test_a_result_that_cannot_be_recorded_rolls_back_the_row(store, workers, pool,
                                                                  mode, error_name):
    eid = f"txn-{mode}"
    record = await run_txn(store, workers, eid, mode=mode)

    assert record["status"] == "completed", record["outcome"]
    assert record["outcome"]["result"]["failed"]["name"] == error_name
    assert await orders(pool, eid) == []
    steps = await step_rows(pool, eid)
    assert steps["create-order"]["status"] == "failed"
    assert steps["create-order"]["error"]["name"] == error_name


@pytest.mark.citus
async def test_a_retried_transaction_commits_once(store, workers, pool):
    record = await run_txn(store, workers, "txn-flaky", mode="flaky", attempts=3)

    assert record["status"] == "completed", record["outcome"]
    assert record["outcome"]["result"]["order"]["call"] == 2
    # The first attempt's insert was rolled back with it.
    assert len(await orders(pool, "txn-flaky")) == 1
    receipt = (await step_rows(pool, "txn-flaky"))["create-order"]
    assert (receipt["status"], receipt["attempts"]) == ("completed", 2)
    assert flows.calls("txn-flaky", "insert_order") == 2


@pytest.mark.citus
async def test_fn_leaving_the_transaction_aborted_fails_the_step(store, workers, pool):
    record = await run_txn(store, workers, "txn-swallow", mode="swallow")

    assert await orders(pool, "txn-swallow") == []  # nothing committed, whatever happens
    assert record["status"] == "completed", record["outcome"]
    assert record["outcome"]["result"]["failed"]["step"] == "create-order"
    assert (await step_rows(pool, "txn-swallow"))["create-order"]["status"] == "failed"


# ------------------------------------------------------------------------- replay


@pytest.mark.citus
async def test_replay_returns_the_recorded_result_without_running_fn(store, workers, pool):
    """The first delivery commits the transaction and ends unacknowledged;
    the second replays the step from its receipt."""
    await workers.start(concurrency=2)
    await admit(store, "cmp-txn-replay", "txn-replay", {"order_id": "o-1", "amount_cents": 7})
    record = await wait_status(store, "txn-replay", "completed", "failed")

    assert record["status"] == "completed", record["outcome"]
    assert record["outcome"]["result"] == {"order": {"orderId": "o-1", "amountCents": 7},
                                           "attempt": 2}
    assert flows.calls("txn-replay", "body") == 2
    assert flows.calls("txn-replay", "insert_order") == 1
    assert len(await orders(pool, "txn-replay")) == 1
    assert len(await step_rows(pool, "txn-replay")) == 1
    assert len(await events_of(store, "txn-replay", "released")) == 1


@pytest.mark.citus
async def test_store_replay_of_a_recorded_transaction_does_not_run_fn(store: ExecutionStore,
                                                                      pool):
    """Same holder twice (a replay within the lease), then a later holder."""
    eid = await admit(store, "cmp-store-txn", "txn-store-replay")
    lease = (await claim_one(store, "cmp-store-txn", "holder-A")).lease
    ran: list[str] = []

    async def fn(conn, execution_id, holder):
        ran.append(holder)
        await conn.execute("INSERT INTO shop.orders (order_id, execution_id, holder, amount_cents)"
                           " VALUES ('o', $1, $2, 1)", execution_id, holder)
        return {"holder": holder}

    async def txn(lease, holder):
        return await store.compose.transaction_step(lease, "create-order", fn, (eid, holder),
                                            function_name="fn", attempts=1,
                                            check_value=json_problem)

    first = await txn(lease, "A")
    again = await txn(lease, "A-again")
    await store.leases.release(lease)
    await pool.execute("UPDATE executions SET redeliver_after = now() WHERE execution_id = $1",
                       eid)
    later = (await claim_one(store, "cmp-store-txn", "holder-B")).lease
    replayed = await txn(later, "B")

    assert ran == ["A"]
    for record in (first, again, replayed):
        assert (record.value, record.token, record.status) == ({"holder": "A"}, 1, "completed")
    assert [r["holder"] for r in await orders(pool, eid)] == ["A"]


# --------------------------------------------------------------------- stale holder


@pytest.mark.citus
async def test_a_stale_holder_is_rolled_back_before_fn_runs(store: ExecutionStore, pool):
    eid = await admit(store, "cmp-store-txn", "txn-stale")
    a = (await claim_one(store, "cmp-store-txn", "holder-A")).lease
    await expire_lease(pool, eid)
    b = (await claim_one(store, "cmp-store-txn", "holder-B")).lease
    ran = []

    async def fn(conn):
        ran.append(1)
        await conn.execute("INSERT INTO shop.orders (order_id, execution_id, amount_cents) "
                           "VALUES ('o', $1, 1)", eid)
        return "x"

    with pytest.raises(LeaseLost):
        await store.compose.transaction_step(a, "create-order", fn, (), function_name="fn", attempts=1,
                                     check_value=json_problem)
    assert ran == [] and b.token == a.token + 1
    assert await orders(pool, eid) == [] and await step_rows(pool, eid) == {}


async def insert_order(conn, execution_id, holder, ran: Counter, hold: float = 0.0,
                       barrier: asyncio.Event | None = None):
    ran[holder] += 1
    await conn.execute(
        "INSERT INTO shop.orders (order_id, execution_id, holder, amount_cents) "
        "VALUES ('o', $1, $2, 1)", execution_id, holder)
    if hold:
        await asyncio.sleep(hold)
    if barrier is not None:
        await barrier.wait()
    return {"holder": holder}


async def stale_txn(store: ExecutionStore, a, eid: str, ran: Counter, **kw):
    try:
        return await store.compose.transaction_step(
            a, "create-order", functools.partial(insert_order, ran=ran, **kw), (eid, "A"),
            function_name="insert_row", attempts=1, check_value=json_problem)
    except LeaseLost as exc:
        return exc


async def check_txn_race(store: ExecutionStore, pool, where: str, wf: str, eid: str, a,
                         answer, claimed: list, ran: Counter) -> str:
    """What the stale transaction and the claim left, whichever order they
    ran in; returns the interleaving that happened."""
    rows = await orders(pool, eid)
    steps = await step_rows(pool, eid)
    where = f"{where}: answer {answer!r}, claimed {claimed!r}, rows {rows}, steps {steps}"
    assert len(rows) <= 1, where
    assert bool(rows) == bool(steps), where  # never a row without a receipt (or v.v.)
    if isinstance(answer, LeaseLost):
        # The claim committed first: the stale transaction saw a newer token.
        outcome = "stale lost"
        assert len(claimed) == 1 and claimed[0].lease.token == a.token + 1, where
        assert rows == [] and steps == {}, where
        assert ran["A"] == 0, where  # rolled back before fn ran
        b = claimed[0].lease
    else:
        assert isinstance(answer, StepRecord), where
        assert (answer.token, answer.value) == (a.token, {"holder": "A"}), where
        assert [r["holder"] for r in rows] == ["A"], where
        assert (steps["create-order"]["token"], steps["create-order"]["value"]) == (
            a.token, {"holder": "A"}), where
        if claimed:
            outcome = "stale committed, then claimed"
        else:
            # The claim found the row locked by the stale transaction and
            # skipped it; it is claimable once that has committed.
            outcome = "stale committed, claim skipped"
            claimed = await store.leases.claim_due(1, 30.0, "holder-B", [wf])
            assert len(claimed) == 1, where
        b = claimed[0].lease
        assert b.token == a.token + 1, where
        recorded_at = [e["event_id"] for e in await events_of(store, eid, "step_recorded")]
        claim_at = [e["event_id"] for e in await events_of(store, eid, "claimed")
                    if e["token"] == b.token]
        assert len(recorded_at) == 1 and recorded_at[0] < claim_at[0], where
    # The stale holder gets nothing more in.
    assert isinstance(await stale_txn(store, a, eid, ran), LeaseLost), where
    # The new holder: replays the receipt, or (the stale one lost) runs fn once.
    mine = await store.compose.transaction_step(
        b, "create-order", functools.partial(insert_order, ran=ran), (eid, "B"),
        function_name="insert_row", attempts=1, check_value=json_problem)
    winner = "B" if isinstance(answer, LeaseLost) else "A"
    assert mine.value == {"holder": winner}, where
    assert ran == Counter({winner: 1}), where
    assert [r["holder"] for r in await orders(pool, eid)] == [winner], where
    assert len(await step_rows(pool, eid)) == 1, where
    return outcome


TXN_OUTCOMES = ("stale lost", "stale committed, then claimed", "stale committed, claim skipped")


@pytest.mark.citus
async def test_a_stale_holder_racing_a_new_claim_never_leaves_its_row_behind(
        store: ExecutionStore, pool):
    """Real concurrent connections: the stale holder's transaction_step and a
    new claim_due run at once (asyncio.gather, separate pool connections),
    RACE_ROUNDS times (more while an interleaving is missing) with jitter on
    both sides. Either the stale transaction committed strictly before the
    claim (row AND receipt, and the new holder replays the receipt without
    running fn), or it got LeaseLost and neither its row nor its receipt
    exists. Never a row without a receipt, never two. Each interleaving must
    occur: the claim first, the transaction first, the claim while the
    transaction held the row (skipped)."""
    rng = random.Random(20240607)
    outcomes = Outcomes(*TXN_OUTCOMES)
    for i in outcomes.rounds(RACE_ROUNDS):
        wf = f"cmp-race-txn-{i}"  # claims below take this round's execution only
        eid = await admit(store, wf, f"race-txn-{i}")
        a = (await claim_one(store, wf, "holder-A")).lease
        await expire_lease(pool, eid)
        ran: Counter = Counter()
        mode = i % 3
        delay_txn = rng.uniform(0, 0.004) if mode == 2 else 0.0
        delay_claim = rng.uniform(0, 0.004) if mode == 1 else 0.0
        hold = rng.choice([0.0, 0.0, 0.001, 0.003])

        async def stale(a=a, eid=eid, delay=delay_txn, ran=ran, hold=hold):
            await asyncio.sleep(delay)
            return await stale_txn(store, a, eid, ran, hold=hold)

        async def new_claim(wf=wf, delay=delay_claim):
            await asyncio.sleep(delay)
            return await store.leases.claim_due(1, 30.0, "holder-B", [wf])

        answer, claimed = await asyncio.gather(stale(), new_claim())
        outcomes.add(await check_txn_race(store, pool, f"round {i}", wf, eid, a, answer,
                                          claimed, ran))

    # The race really went every way.
    outcomes.assert_each("stale transaction vs claim")


# Not marked `citus`: it holds rows with a StatementGate (a trigger) or a
# FOR UPDATE that names no bucket, which Citus refuses on distributed tables.
@pytest.mark.parametrize("order", TXN_OUTCOMES)
async def test_a_stale_transaction_and_a_new_claim_in_each_order(store: ExecutionStore, pool,
                                                                 order):
    """Each interleaving of the race above, forced. The claim first: a
    StatementGate holds the claim with the row locked while the transaction
    starts (its FOR SHARE waits, then fails the token check). The claim
    while the transaction holds the row: fn waits on an event while the
    claim runs (and skips the row)."""
    wf = "cmp-race-txn-forced"
    eid = await admit(store, wf, "forced-txn")
    a = (await claim_one(store, wf, "holder-A")).lease
    await expire_lease(pool, eid)
    ran: Counter = Counter()
    if order == "stale lost":
        async with StatementGate(pool, "execution_events",
                                 f"NEW.kind = 'claimed' AND NEW.token = {a.token + 1}") as gate:
            claim = asyncio.create_task(store.leases.claim_due(1, 30.0, "holder-B", [wf]))
            await gate.until_held(also=claim.done)
            txn = asyncio.create_task(stale_txn(store, a, eid, ran))
            await until_waiting(pool, 1, "row", what="the transaction behind the claim",
                                also=txn.done)
            assert not txn.done()
            await gate.open()
            claimed, answer = await claim, await txn
    elif order == "stale committed, claim skipped":
        inside = asyncio.Event()
        txn = asyncio.create_task(stale_txn(store, a, eid, ran, barrier=inside))
        await wait_until(lambda: ran["A"], what="fn running", interval=0.005)
        claimed = await store.leases.claim_due(1, 30.0, "holder-B", [wf])
        assert claimed == [] and not txn.done()  # skipped while the transaction holds the row
        inside.set()
        answer = await txn
    else:
        answer = await stale_txn(store, a, eid, ran)
        claimed = await store.leases.claim_due(1, 30.0, "holder-B", [wf])
    assert await check_txn_race(store, pool, order, wf, eid, a, answer, claimed, ran) == order


# ------------------------------------------------------- a long transaction's lock


@pytest.mark.citus
async def test_a_long_transaction_does_not_stall_renewal_of_other_leases(store, workers, pool):
    await workers.start(concurrency=4)
    await admit(store, "cmp-slow-step", "plain-slow", {"order_id": "x", "seconds": 3.0})
    await wait_until(lambda: flows.calls("plain-slow", "slow_step"), what="plain step started")
    await admit(store, "cmp-txn-slow", "txn-slow", {"order_id": "y", "seconds": 2.5})
    await wait_status(store, "txn-slow", "completed", timeout=15)
    await wait_status(store, "plain-slow", "completed", timeout=15)

    # The plain step ran in one delivery whose lease was renewed throughout.
    assert await events_of(store, "plain-slow", "lease_expired") == []
    assert len(await events_of(store, "plain-slow", "claimed")) == 1
    assert flows.calls("plain-slow", "slow_step") == 1
