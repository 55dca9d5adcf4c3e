"""Acknowledgements by group commit, against real Postgres.

On the pool, acknowledgements that arrive while earlier ones are in flight
go together in one statement (`store.leases.acknowledgements`, a
GroupCommit). Every row keeps its own fence and its own outcome rules, and
each caller gets its own answer. Batches are formed deterministically: the
first two acknowledgements (as many as GroupCommit keeps in flight) wait on
a row lock another transaction holds, every acknowledgement sent meanwhile
waits for the next statement, and the lock is then released.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from app.store import Acknowledged, Delivery, ExecutionStore, InvalidEvent, LeaseLost
from tests.support.admission import admitting
from tests.support.claims import claim, claim_one
from tests.support.waiting import wait_until

WORKFLOW = "ack-batch"
admit = admitting(WORKFLOW, params={})


async def held(store: ExecutionStore, n: int, prefix: str) -> dict[str, Delivery]:
    """`n` executions admitted and claimed, by ID."""
    ids = [f"{prefix}-{i}" for i in range(n)]
    for eid in ids:
        await admit(store, eid)
    claimed = await claim(store)
    assert sorted(claimed) == sorted(ids)
    return claimed


async def in_one_batch(store: ExecutionStore, pool: asyncpg.Pool, blockers: list[Delivery],
                       sends: list[Callable[[], Awaitable[Any]]]) -> list[Any]:
    """Acknowledge `blockers` (completed) while another transaction holds
    their rows, so that both flushes GroupCommit keeps in flight wait; run
    `sends` meanwhile (all waiting for the next statement); release the lock.
    Returns the answers of `sends` (an exception is an answer), after
    checking that they went in one statement together."""
    group = store.leases.acknowledgements
    assert group is not None  # the store is on the pool
    assert len(blockers) == 2
    before = (group.batches, group.requests)
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        try:
            await conn.execute("SELECT 1 FROM executions WHERE execution_id = ANY($1::text[]) "
                               "FOR UPDATE", [d.lease.execution_id for d in blockers])
            first = [asyncio.ensure_future(store.leases.acknowledge(d.lease, "completed"))
                     for d in blockers]
            await wait_until(lambda: group.batches == before[0] + 2, timeout=10,
                             what="both blockers' statements in flight")
            rest = [asyncio.ensure_future(send()) for send in sends]
            for _ in range(5):
                await asyncio.sleep(0)  # each has submitted its request
            assert group.batches == before[0] + 2  # nothing more sent while both wait
        finally:
            await tx.rollback()
        answers = await asyncio.gather(*rest, return_exceptions=True)
        assert all(isinstance(a, Acknowledged) for a in await asyncio.gather(*first))
    # Two lone statements, then one with every request sent meanwhile.
    assert (group.batches - before[0], group.requests - before[1]) == (3, 2 + len(sends))
    return list(answers)


async def events(pool: asyncpg.Pool, execution_id: str) -> list[str]:
    return [r["kind"] for r in await pool.fetch(
        "SELECT kind FROM execution_events WHERE execution_id = $1 ORDER BY event_id",
        execution_id)]


async def test_a_stale_acknowledgement_in_a_batch_is_lease_lost_while_the_rest_commit(
        store, pool, clock):
    claimed = await held(store, 6, "stale")
    blockers = [claimed.pop("stale-0"), claimed.pop("stale-1")]
    # stale-2's lease expired and another worker holds it now.
    old = claimed["stale-2"]
    await clock.expire_lease("stale-2")
    new = await claim_one(store, "stale-2", owner="worker-B")
    assert new.lease.token == old.lease.token + 1
    order = sorted(claimed)

    answers = await in_one_batch(store, pool, blockers, [
        (lambda d=claimed[eid]: store.leases.acknowledge(d.lease, "completed",
                                                         result={"eid": d.lease.execution_id}))
        for eid in order])

    by_id = dict(zip(order, answers, strict=True))
    assert isinstance(by_id.pop("stale-2"), LeaseLost)
    for eid, answer in by_id.items():
        assert answer == Acknowledged("completed", {"result": {"eid": eid}}), (eid, answer)
        rec = await pool.fetchrow("SELECT status, outcome, token FROM executions "
                                  "WHERE execution_id = $1", eid)
        assert (rec["status"], rec["outcome"]) == ("completed", {"result": {"eid": eid}})
        assert (await events(pool, eid))[-1] == "acknowledged"
    # The stale row changed nothing: still the new holder's, running; the
    # refusal is recorded with the stale token.
    rec = await pool.fetchrow("SELECT status, token, lease_owner FROM executions "
                              "WHERE execution_id = 'stale-2'")
    assert (rec["status"], rec["token"], rec["lease_owner"]) == (
        "running", new.lease.token, "worker-B")
    rejected = await pool.fetch("SELECT token FROM execution_events WHERE execution_id = "
                                "'stale-2' AND kind = 'fenced_write_rejected'")
    assert [r["token"] for r in rejected] == [old.lease.token]
    assert "acknowledged" not in await events(pool, "stale-2")


async def test_a_cancel_requested_on_one_row_of_a_batch_cancels_that_row_only(store, pool):
    claimed = await held(store, 5, "cancel")
    blockers = [claimed.pop("cancel-0"), claimed.pop("cancel-1")]
    answer, _ = await store.operator.request_cancel("cancel-3", by="alice")
    order = sorted(claimed)

    answers = await in_one_batch(store, pool, blockers, [
        (lambda d=claimed[eid]: store.leases.acknowledge(d.lease, "completed", result=1))
        for eid in order])

    by_id = dict(zip(order, answers, strict=True))
    cancelled = by_id.pop("cancel-3")
    assert isinstance(cancelled, Acknowledged) and cancelled.status == "cancelled", cancelled
    assert cancelled.outcome is not None and cancelled.outcome["error"]["name"] == "Cancelled"
    assert (await events(pool, "cancel-3"))[-2:] == ["acknowledged", "cancelled"]
    for eid, got in by_id.items():
        assert got == Acknowledged("completed", {"result": 1}), (eid, got)
        assert (await events(pool, eid))[-1] == "acknowledged"


async def test_an_unstorable_result_in_a_batch_fails_only_its_own_acknowledgement(
        store, pool):
    claimed = await held(store, 5, "bad")
    blockers = [claimed.pop("bad-0"), claimed.pop("bad-1")]
    order = sorted(claimed)
    # "\u0000" is valid JSON that jsonb refuses: the statement fails in Postgres.
    results = {"bad-2": "fine", "bad-3": "nul \u0000 inside", "bad-4": [1, 2]}

    answers = await in_one_batch(store, pool, blockers, [
        (lambda d=claimed[eid]: store.leases.acknowledge(
            d.lease, "completed", result=results[d.lease.execution_id]))
        for eid in order])

    by_id = dict(zip(order, answers, strict=True))
    assert isinstance(by_id.pop("bad-3"), InvalidEvent)
    assert (await pool.fetchval("SELECT status FROM executions WHERE execution_id = 'bad-3'")
            == "running")
    for eid, got in by_id.items():
        assert got == Acknowledged("completed", {"result": results[eid]}), (eid, got)


async def test_a_child_and_its_waiting_parent_acknowledged_together_leave_the_parent_due(
        store, pool):
    # The child's end wakes its parent; the parent is written after it, alone
    # (one statement never writes a row twice), so the wake is not lost.
    blockers = await held(store, 2, "block")
    await admit(store, "parent")
    parent = await claim_one(store, "parent")
    await store.compose.start_child(parent.lease, "kid", workflow_id=WORKFLOW, params={},
                                    child_id="child")
    child = await claim_one(store, "child")

    answers = await in_one_batch(store, pool, list(blockers.values()), [
        lambda: store.leases.acknowledge(child.lease, "completed", result="done"),
        lambda: store.leases.acknowledge(parent.lease, "suspended",
                                         waiting_on={"child": "child"}),
    ])

    assert answers[0] == Acknowledged("completed", {"result": "done"})
    assert answers[1] == Acknowledged("suspended", None)
    rec = await pool.fetchrow("SELECT status, due_at <= now() AS due, waiting_on FROM "
                              "executions WHERE execution_id = 'parent'")
    assert (rec["status"], rec["due"], rec["waiting_on"]) == (
        "suspended", True, {"child": "child"})


@pytest.mark.parametrize("in_transaction", [False, True])
async def test_a_lone_acknowledgement_is_a_batch_of_one(store, pool, in_transaction):
    # Idle, on the pool: sent at once, alone. In a caller's transaction: no
    # group at all, the statement joins the transaction.
    claimed = await held(store, 1, "lone")
    lease = claimed["lone-0"].lease
    group = store.leases.acknowledgements
    before = (group.batches, group.requests)
    if in_transaction:
        async with store.transaction() as tx:
            assert tx.leases.acknowledgements is None
            got = await tx.leases.acknowledge(lease, "failed", error={"name": "E",
                                                                      "message": "m"})
        assert (group.batches, group.requests) == before
    else:
        got = await store.leases.acknowledge(lease, "failed", error={"name": "E",
                                                                     "message": "m"})
        assert (group.batches - before[0], group.requests - before[1]) == (1, 1)
    assert got == Acknowledged("failed", {"error": {"name": "E", "message": "m"}})
    # Again with the same token: the recorded outcome, not a rejection.
    again = await store.leases.acknowledge(lease, "completed", result=2)
    assert again == got
