"""The acknowledgement on Citus (Leases.acknowledge): a batch of the group
commit split by shard, each part written on its shard in a transaction of its
own, with the parents its ends wake (on any node) and the notices after it.
Every acknowledgement keeps its own fence: a stale token is refused and
recorded, nothing written; a child's end wakes its parent on another node;
an acknowledgement racing a takeover ends the delivery once."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from app.store import ExecutionStore
from app.store.buckets import bucket_of
from app.store.types import Lease, LeaseLost
from tests.citus.rows import event_kinds, insert, on_other_nodes, state

pytestmark = pytest.mark.citus


async def test_a_batch_over_many_shards_acknowledges_each_under_its_own_fence(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    ids = [f"acked-{i}" for i in range(40)]
    assert len({bucket_of(i) for i in ids}) > 20
    for eid in ids:
        await insert(pool, eid, "running", token=2)
    stale = ids[::5]
    # Concurrent acknowledgements go in batches of the group commit.
    answers = await asyncio.gather(*(
        store.leases.acknowledge(Lease(eid, 1 if eid in stale else 2, None, "w"), "completed",
                                 result={"id": eid})
        for eid in ids), return_exceptions=True)
    for eid, answer in zip(ids, answers, strict=True):
        row = await state(pool, eid)
        if eid in stale:
            assert isinstance(answer, LeaseLost), (eid, answer)
            assert row["status"] == "running"
            assert await event_kinds(pool, eid) == ["fenced_write_rejected"]
        else:
            assert (answer.status, answer.outcome) == ("completed", {"result": {"id": eid}})
            assert row["status"] == "completed"
            assert await event_kinds(pool, eid) == ["acknowledged"]
    # Acknowledged again with the same token: the recorded outcome, nothing written.
    again = await store.leases.acknowledge(Lease(ids[1], 2, None, "w"), "failed")
    assert (again.status, again.outcome) == ("completed", {"result": {"id": ids[1]}})
    assert await event_kinds(pool, ids[1]) == ["acknowledged"]


async def test_a_suspension_stays_with_its_wait_and_a_cancel_wins(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    await insert(pool, "waits", "running")
    await insert(pool, "cancelled", "running", cancelled=True)
    waits, cancelled = await asyncio.gather(
        store.leases.acknowledge(Lease("waits", 1, None, "w"), "suspended",
                                 waiting_on={"signal": "go"}),
        store.leases.acknowledge(Lease("cancelled", 1, None, "w"), "completed", result=1))
    assert waits.status == "suspended" and cancelled.status == "cancelled"
    assert await pool.fetchval(
        "SELECT waiting_on->>'signal' FROM executions WHERE execution_id = 'waits' "
        "AND bucket = fencepost_bucket('waits')") == "go"
    assert await event_kinds(pool, "cancelled") == ["acknowledged", "cancelled"]


@pytest.mark.parametrize("batched", [True, False])
async def test_a_child_end_wakes_its_parent_on_another_node(
        pool: asyncpg.Pool, store: ExecutionStore, batched: bool) -> None:
    child, parent = await on_other_nodes(pool, f"acked-{batched}")
    await insert(pool, parent, "suspended")
    await insert(pool, child, "running", parent=parent)
    assert not (await state(pool, parent))["due"]
    lease = Lease(child, 1, None, "w")
    if batched:
        answer = await store.leases.acknowledge(lease, "completed", result=1)
    else:
        async with store.transaction() as objects:
            answer = await objects.leases.acknowledge(lease, "completed", result=1)
    assert answer.status == "completed"
    assert (await state(pool, parent))["due"] is True


async def test_an_acknowledgement_racing_a_takeover_ends_the_delivery_once(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    """The holder acknowledges just as its expired lease is taken over: the
    acknowledgement and the claim each on a connection of their own. Either
    the acknowledgement wins (the claim finds nothing) or the claim does (the
    acknowledgement is refused, recorded, nothing of it written); never both.
    Rounds run until each side has won at least once."""
    # A claim visits every shard group in turn, so it reaches the row at any
    # point of its run: the acknowledgement starts up to one claim's time late.
    store.leases.wake_claims()
    started = asyncio.get_running_loop().time()
    assert await store.leases.claim_due(5, 30, "warm", workflow_ids=["wf"]) == []
    span = asyncio.get_running_loop().time() - started
    wins = {"acknowledged": 0, "taken over": 0}
    i = 0
    while min(wins.values()) == 0:
        assert i < 60, wins
        eid = f"raced-{i}"
        await insert(pool, eid, "running", token=1, expired=True)

        async def ack(eid: str, delay: float) -> str:
            await asyncio.sleep(delay)
            try:
                await store.leases.acknowledge(Lease(eid, 1, None, "w"), "completed", result=1)
            except LeaseLost:
                return "lost"
            return "acknowledged"

        async def claim() -> list[str]:
            store.leases.wake_claims()
            return [d.lease.execution_id for d in await store.leases.claim_due(
                5, 30, "new", workflow_ids=["wf"])]

        acked, claimed = await asyncio.gather(ack(eid, span * (i % 5) / 4), claim())
        row = await state(pool, eid)
        if acked == "acknowledged":
            assert claimed == [] and row["status"] == "completed", (i, claimed, row)
            assert await event_kinds(pool, eid) == ["acknowledged"]
            wins["acknowledged"] += 1
        else:
            assert claimed == [eid] and row["status"] == "running", (i, acked, row)
            assert row["token"] == 2 and row["lease_owner"] == "new"
            assert await event_kinds(pool, eid) == ["lease_expired", "claimed",
                                               "fenced_write_rejected"]
            wins["taken over"] += 1
        i += 1
