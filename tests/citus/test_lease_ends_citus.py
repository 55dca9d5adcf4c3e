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

pytestmark = pytest.mark.citus


async def _insert(pool: asyncpg.Pool, eid: str, status: str, *, token: int = 1,
                  expired: bool = False, parent: str | None = None,
                  cancelled: bool = False) -> None:
    """A row as the runtime leaves it: running with a lease (expired or
    not), or unheld (`status`), a child of `parent`, a cancel requested."""
    await pool.execute(
        "INSERT INTO executions (execution_id, bucket, workflow_id, params, context, status, "
        "token, lease_owner, lease_expires_at, ever_suspended, parent_execution_id, "
        "parent_step_key, cancel_requested_at) "
        "VALUES ($1, fencepost_bucket($1), 'wf', 'null', '{}', $2, $3, "
        "CASE WHEN $2 = 'running' THEN 'w' END, "
        "CASE WHEN $2 = 'running' THEN now() + CASE WHEN $4 THEN interval '-1 minute' "
        "ELSE interval '1 hour' END END, $2 = 'suspended', $5::text, "
        "CASE WHEN $5::text IS NOT NULL THEN 'child' END, CASE WHEN $6 THEN now() END)",
        eid, status, token, expired, parent, cancelled)


async def _node(pool: asyncpg.Pool, eid: str) -> int:
    port: int = await pool.fetchval(
        "SELECT nodeport FROM pg_dist_shard_placement "
        "WHERE shardid = get_shard_id_for_distribution_column('executions', $1::smallint)",
        bucket_of(eid))
    return port


async def _on_other_nodes(pool: asyncpg.Pool, prefix: str) -> tuple[str, str]:
    """A child's ID and its parent's, whose rows are on different nodes."""
    child = f"{prefix}-child"
    for i in range(100):
        parent = f"{prefix}-parent-{i}"
        if await _node(pool, parent) != await _node(pool, child):
            return child, parent
    raise AssertionError("no two IDs on different nodes")


async def _row(pool: asyncpg.Pool, eid: str) -> asyncpg.Record:
    row: asyncpg.Record = await pool.fetchrow(
        "SELECT status, token, unacknowledged_deliveries, lease_owner, due_at <= now() AS due "
        "FROM executions WHERE execution_id = $1 AND bucket = fencepost_bucket($1)", eid)
    return row


async def test_the_reaper_ends_expired_leases_in_every_shard(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    ids = [f"expired-{i}" for i in range(40)]
    assert len({bucket_of(i) for i in ids}) > 20
    for eid in ids:
        await _insert(pool, eid, "running", expired=True)
    await _insert(pool, "still-held", "running")
    result = await LeaseReaper(store, batch=5).run_once()
    assert sorted(result.execution_ids) == sorted(ids)
    for eid in ids:
        row = await _row(pool, eid)
        assert (row["status"], row["unacknowledged_deliveries"], row["lease_owner"]) == (
            "admitted", 1, None), eid
    assert (await _row(pool, "still-held"))["status"] == "running"
    assert await pool.fetchval(
        "SELECT count(*) FROM execution_events WHERE kind = 'lease_expired'") == len(ids)
    assert (await store.leases.reap_expired()).expired == 0


async def test_a_child_the_reaper_cancels_wakes_its_parent_on_another_node(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    child, parent = await _on_other_nodes(pool, "reaped")
    await _insert(pool, parent, "suspended")
    # Its lease expired after a cancel request: the reaper ends it cancelled.
    await _insert(pool, child, "running", expired=True, parent=parent, cancelled=True)
    assert not (await _row(pool, parent))["due"]
    result = await store.leases.reap_expired()
    assert result.execution_ids == [child]
    assert (await _row(pool, child))["status"] == "cancelled"
    assert (await _row(pool, parent))["due"] is True


async def test_the_sweep_ends_cancelled_executions_in_every_shard_and_wakes_parents(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    child, parent = await _on_other_nodes(pool, "swept")
    await _insert(pool, parent, "suspended")
    # Never ran (token 0) and cancelled: no cleanup to run, the sweep ends it.
    await _insert(pool, child, "admitted", token=0, parent=parent, cancelled=True)
    others = [f"swept-{i}" for i in range(30)]
    for eid in others:
        await _insert(pool, eid, "admitted", token=0, cancelled=True)
    await _insert(pool, "not-cancelled", "admitted", token=0)
    swept = await store.leases.sweep_interrupted(500)
    assert sorted(swept) == sorted([child, *others])
    for eid in [child, *others]:
        assert (await _row(pool, eid))["status"] == "cancelled", eid
    assert (await _row(pool, "not-cancelled"))["status"] == "admitted"
    assert (await _row(pool, parent))["due"] is True
    assert await store.leases.sweep_interrupted(500) == []


async def test_a_release_is_fenced_and_settled_on_the_shard(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    await _insert(pool, "released", "running", token=2)
    with pytest.raises(LeaseLost):
        await store.leases.release(Lease("released", 1, None, "w"))
    assert (await _row(pool, "released"))["status"] == "running"
    assert await store.leases.release(
        Lease("released", 2, None, "w"), reason={"name": "Retry", "message": "later"}) is None
    row = await _row(pool, "released")
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
    child, parent = await _on_other_nodes(pool, "released")
    await _insert(pool, parent, "suspended")
    await _insert(pool, child, "running", parent=parent, cancelled=True)
    assert await store.leases.release(Lease(child, 1, None, "w")) == "cancelled"
    assert (await _row(pool, child))["status"] == "cancelled"
    assert (await _row(pool, parent))["due"] is True


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
        await _insert(pool, eid, "running", expired=True)
        released, reaped = await asyncio.gather(release(eid, i % 2 == 1), reap(i % 2 == 0))
        assert (released == "released") != (eid in reaped), (i, released, reaped)
        row = await _row(pool, eid)
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
