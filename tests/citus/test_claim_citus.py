"""The claim on Citus (Leases.claim_due): the queues' limits counted on the
coordinator, then one claim statement per shard group, each on its shard, in
one transaction. Every due execution in every shard is claimed, once; two
claimers racing take disjoint executions; a limited queue's slots, keys and
starts hold across shards; an expired lease is taken over on its shard."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from app.db import create_pool
from app.store import ExecutionStore
from app.store.buckets import bucket_of
from tests.support.admission import admit

pytestmark = pytest.mark.citus


async def _claim_all(store: ExecutionStore, owner: str, limit: int = 50,
                     **kw: object) -> list[str]:
    """Claim until a claim comes back empty; the IDs claimed, in order."""
    store.leases.wake_claims()
    got: list[str] = []
    while True:
        batch = await store.leases.claim_due(limit, 30, owner, **kw)  # type: ignore[arg-type]
        if not batch:
            return got
        got.extend(d.lease.execution_id for d in batch)


async def test_a_claim_takes_due_executions_from_every_shard_once(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    ids = [f"due-{i}" for i in range(60)]
    assert len({bucket_of(i) for i in ids}) > 30
    for eid in ids:
        await admit(store, "wf", eid)
    got = await _claim_all(store, "w", limit=25)
    assert sorted(got) == sorted(ids)
    rows = await pool.fetch(
        "SELECT status, token, lease_owner FROM executions WHERE execution_id = ANY($1)", ids)
    assert {(r["status"], r["token"], r["lease_owner"]) for r in rows} == {("running", 1, "w")}
    assert await pool.fetchval(
        "SELECT count(*) FROM execution_events WHERE kind = 'claimed' AND token = 1 "
        "AND execution_id = ANY($1)", ids) == len(ids)


async def test_a_claim_of_other_workflows_takes_nothing(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    await admit(store, "wf", "only-wf")
    assert await _claim_all(store, "w", workflow_ids=["other"]) == []
    assert await _claim_all(store, "w", workflow_ids=["wf"]) == ["only-wf"]


async def test_two_claimers_racing_take_disjoint_executions(
        pool: asyncpg.Pool, store: ExecutionStore, settings) -> None:
    ids = [f"raced-{i}" for i in range(80)]
    for eid in ids:
        await admit(store, "wf", eid)
    second_pool = await create_pool(settings)
    try:
        second = ExecutionStore.from_settings(second_pool, settings)

        async def claimer(s: ExecutionStore, owner: str) -> list[str]:
            got: list[str] = []
            while True:
                s.leases.wake_claims()
                batch = await s.leases.claim_due(4, 30, owner)
                if not batch:
                    return got
                got.extend(d.lease.execution_id for d in batch)

        # Warm both pools first (a first claim on a new connection is slow:
        # it would let the other claimer take everything meanwhile).
        for s in (store, second):
            assert await s.leases.claim_due(4, 30, "warm", workflow_ids=["nobody"]) == []
        a, b = await asyncio.gather(claimer(store, "a"), claimer(second, "b"))
    finally:
        await second_pool.close()
    assert not set(a) & set(b)
    assert sorted(a + b) == sorted(ids)
    # Both claimers took work: they raced over the same shards.
    assert a and b, (len(a), len(b))
    owners = {r["execution_id"]: r["lease_owner"] for r in await pool.fetch(
        "SELECT execution_id, lease_owner FROM executions WHERE execution_id = ANY($1)", ids)}
    assert owners == {**{e: "a" for e in a}, **{e: "b" for e in b}}


async def test_a_limited_queue_counts_slots_and_keys_over_every_shard(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    await store.queues.change("q", {"concurrency": 4, "per_key_concurrency": 1}, actor="t")
    ids = [f"limited-{i}" for i in range(30)]
    for i, eid in enumerate(ids):
        await admit(store, "wf", eid, queue="q", concurrency_key=f"k{i % 3}")
    got = await _claim_all(store, "w", limit=10)
    # One per key (three keys), within the queue's four slots.
    assert len(got) == 3, got
    keys = await pool.fetch(
        "SELECT concurrency_key FROM executions WHERE execution_id = ANY($1)", got)
    assert sorted(r["concurrency_key"] for r in keys) == ["k0", "k1", "k2"]
    # Without the per-key limit, the queue's four slots (three held) leave one.
    await store.queues.change("q", {"per_key_concurrency": None}, actor="t")
    more = await _claim_all(store, "w", limit=10)
    assert len(more) == 1, more


async def test_a_rate_limited_queue_counts_its_starts_over_every_shard(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    await store.queues.change("r", {"rate_limit": 5, "rate_period": 3600}, actor="t")
    ids = [f"rated-{i}" for i in range(20)]
    for eid in ids:
        await admit(store, "wf", eid, queue="r")
    got = await _claim_all(store, "w", limit=3)
    assert len(got) == 5, got
    assert await pool.fetchval("SELECT count(*) FROM queue_starts WHERE queue = 'r'") == 5


async def test_an_expired_lease_is_taken_over_on_its_shard(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    await admit(store, "wf", "taken-over")
    assert await _claim_all(store, "old") == ["taken-over"]
    await pool.execute(
        "UPDATE executions SET lease_expires_at = now() - interval '1 hour' "
        "WHERE execution_id = 'taken-over' AND bucket = fencepost_bucket('taken-over')")
    store.leases.wake_claims()  # an expiry wakes no one: the group was idle
    batch = await store.leases.claim_due(5, 30, "new")
    assert [(d.lease.execution_id, d.lease.token, d.taken_over) for d in batch] == [
        ("taken-over", 2, True)]
    row = await pool.fetchrow(
        "SELECT lease_owner, unacknowledged_deliveries FROM executions "
        "WHERE execution_id = 'taken-over' AND bucket = fencepost_bucket('taken-over')")
    assert (row["lease_owner"], row["unacknowledged_deliveries"]) == ("new", 1)
    kinds = [r["kind"] for r in await pool.fetch(
        "SELECT kind FROM execution_events WHERE execution_id = 'taken-over' "
        "AND bucket = fencepost_bucket('taken-over') ORDER BY event_id")]
    assert kinds[-2:] == ["lease_expired", "claimed"]
