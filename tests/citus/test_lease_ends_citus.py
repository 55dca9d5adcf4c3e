"""Leases and executions that end without an acknowledgement, on Citus: a
holder's release, the reaper and the sweep of interrupted executions, shard
by shard (Leases.release, reap_expired, sweep_interrupted). Each runs on the
node that owns the shard (app/store/on_shard.py), ends what it finds in every
shard, and a child it ends wakes its parent in the same transaction, also
when the parent's row is on another node."""

from __future__ import annotations

import asyncio
import random

import asyncpg
import pytest

from app.reaper import LeaseReaper
from app.store import ExecutionStore
from app.store.buckets import bucket_of
from app.store.types import Lease, LeaseLost
from tests.citus.rows import insert, on_other_nodes, state

pytestmark = pytest.mark.citus


async def test_the_reaper_ends_expired_leases_in_every_shard(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    ids = [f"expired-{i}" for i in range(40)]
    assert len({bucket_of(i) for i in ids}) > 20
    for eid in ids:
        await insert(pool, eid, "running", expired=True)
    await insert(pool, "still-held", "running")
    result = await LeaseReaper(store, batch=5).run_once()
    assert sorted(result.execution_ids) == sorted(ids)
    for eid in ids:
        row = await state(pool, eid)
        assert (row["status"], row["unacknowledged_deliveries"], row["lease_owner"]) == (
            "admitted", 1, None), eid
    assert (await state(pool, "still-held"))["status"] == "running"
    assert await pool.fetchval(
        "SELECT count(*) FROM execution_events WHERE kind = 'lease_expired'") == len(ids)
    assert (await store.leases.reap_expired()).expired == 0


async def test_a_child_the_reaper_cancels_wakes_its_parent_on_anothernode(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    child, parent = await on_other_nodes(pool, "reaped")
    await insert(pool, parent, "suspended")
    # Its lease expired after a cancel request: the reaper ends it cancelled.
    await insert(pool, child, "running", expired=True, parent=parent, cancelled=True)
    assert not (await state(pool, parent))["due"]
    result = await store.leases.reap_expired()
    assert result.execution_ids == [child]
    assert (await state(pool, child))["status"] == "cancelled"
    assert (await state(pool, parent))["due"] is True


async def test_the_sweep_ends_cancelled_executions_in_every_shard_and_wakes_parents(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    child, parent = await on_other_nodes(pool, "swept")
    await insert(pool, parent, "suspended")
    # Never ran (token 0) and cancelled: no cleanup to run, the sweep ends it.
    await insert(pool, child, "admitted", token=0, parent=parent, cancelled=True)
    others = [f"swept-{i}" for i in range(30)]
    for eid in others:
        await insert(pool, eid, "admitted", token=0, cancelled=True)
    await insert(pool, "not-cancelled", "admitted", token=0)
    swept = await store.leases.sweep_interrupted(500)
    assert sorted(swept) == sorted([child, *others])
    for eid in [child, *others]:
        assert (await state(pool, eid))["status"] == "cancelled", eid
    assert (await state(pool, "not-cancelled"))["status"] == "admitted"
    assert (await state(pool, parent))["due"] is True
    assert await store.leases.sweep_interrupted(500) == []


async def test_a_release_is_fenced_and_settled_on_the_shard(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    await insert(pool, "released", "running", token=2)
    with pytest.raises(LeaseLost):
        await store.leases.release(Lease("released", 1, None, "w"))
    assert (await state(pool, "released"))["status"] == "running"
    assert await store.leases.release(
        Lease("released", 2, None, "w"), reason={"name": "Retry", "message": "later"}) is None
    row = await state(pool, "released")
    assert (row["status"], row["unacknowledged_deliveries"], row["lease_owner"]) == (
        "admitted", 1, None)
    kinds = [r["kind"] for r in await pool.fetch(
        "SELECT kind FROM execution_events WHERE execution_id = $1 "
        "AND bucket = fencepost_bucket($1) ORDER BY event_id", "released")]
    assert kinds == ["fenced_write_rejected", "released"]
    assert await pool.fetchval(
        "SELECT error->>'message' FROM attempt_history WHERE execution_id = $1 "
        "AND bucket = fencepost_bucket($1)", "released") == "later"

    # Released after a cancel request: settled cancelled, its parent woken.
    child, parent = await on_other_nodes(pool, "released")
    await insert(pool, parent, "suspended")
    await insert(pool, child, "running", parent=parent, cancelled=True)
    assert await store.leases.release(Lease(child, 1, None, "w")) == "cancelled"
    assert (await state(pool, child))["status"] == "cancelled"
    assert (await state(pool, parent))["due"] is True


async def test_a_release_racing_the_reaper_ends_the_lease_once(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    """The holder releases a lease just as it expires and the reaper ends it,
    each on a connection of its own: on the shard, one of them ends it, never
    both (one unacknowledged delivery, one event). Rounds run until each side
    has won at least once."""
    # Who reaches the row first varies: each round one side starts up to 4 ms
    # late, the releaser in odd rounds, the reaper in even ones.
    async def release(eid: str, late: bool) -> str:
        await asyncio.sleep(random.random() * 0.004 * late)
        try:
            await store.leases.release(Lease(eid, 1, None, "w"))
            return "released"
        except LeaseLost:
            return "lost"

    async def reap(late: bool) -> list[str]:
        await asyncio.sleep(random.random() * 0.004 * late)
        return (await store.leases.reap_expired()).execution_ids

    winners: list[str] = []
    for i in range(60):
        eid = f"race-{i}"
        await insert(pool, eid, "running", expired=True)
        released, reaped = await asyncio.gather(release(eid, i % 2 == 1), reap(i % 2 == 0))
        assert (released == "released") != (eid in reaped), (i, released, reaped)
        row = await state(pool, eid)
        assert (row["status"], row["unacknowledged_deliveries"]) == ("admitted", 1), (i, row)
        kinds = [r["kind"] for r in await pool.fetch(
            "SELECT kind FROM execution_events WHERE execution_id = $1 "
            "AND bucket = fencepost_bucket($1) AND kind IN ('released', 'lease_expired')", eid)]
        assert kinds in (["released"], ["lease_expired"]), (i, kinds)
        winners.append(kinds[0])
        if len(set(winners)) == 2 and i >= 9:
            break
    print(f"release vs reaper: {winners.count('released')} released, "
          f"{winners.count('lease_expired')} reaped in {len(winners)} rounds")
    assert set(winners) == {"released", "lease_expired"}, winners
