"""No over-claim, ever: eight claimers on eight connections race for a queue
of concurrency 1, round after round.

The harness is shown to stage the race: with the claim's queue lock taken
out of the counting function (a copy installed only in this test's
database), the same rounds over-claim. With the real function they never do.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest_asyncio

from app.db import create_pool
from app.store import ExecutionStore
from tests.support.admission import admit

CLAIMERS = 8
ROUNDS = 300


@pytest_asyncio.fixture
async def wide_pool(settings) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(settings, min_size=CLAIMERS, max_size=CLAIMERS)
    try:
        yield pool
    finally:
        await pool.close()


async def race(store: ExecutionStore, pool: asyncpg.Pool, rounds: int) -> tuple[int, int]:
    """Run `rounds` rounds; return (rounds that over-claimed, most live leases
    seen at once). Each round: two due executions, eight simultaneous claims
    (each would take both), then whatever was claimed completes."""
    await store.queues.change("one", {"concurrency": 1}, actor="test")
    over, most = 0, 0
    for r in range(rounds):
        for i in range(2 - int(await pool.fetchval(
                "SELECT count(*) FROM executions WHERE status = 'admitted'"))):
            await admit(store, "wf", f"r{r}-{i}", queue="one")
        start = asyncio.Event()

        async def claimer(n: int, start: asyncio.Event = start) -> list:
            await start.wait()
            return await store.leases.claim_due(2, 30.0, f"claimer-{n}")

        tasks = [asyncio.create_task(claimer(n)) for n in range(CLAIMERS)]
        await asyncio.sleep(0)
        start.set()
        deliveries = [d for batch in await asyncio.gather(*tasks) for d in batch]
        live = int(await pool.fetchval(
            "SELECT count(*) FROM executions "
            "WHERE queue = 'one' AND status = 'running' AND lease_expires_at > now()"))
        most = max(most, live, len(deliveries))
        over += live > 1 or len(deliveries) > 1
        for d in deliveries:
            await store.leases.acknowledge(d.lease, "completed", result=None)
    return over, most


async def test_eight_claimers_never_take_two_slots_of_a_limit_of_one(wide_pool):
    store = ExecutionStore(wide_pool)

    over, most = await race(store, wide_pool, ROUNDS)

    assert (over, most) == (0, 1)


async def test_without_the_queue_lock_the_same_race_over_claims(wide_pool):
    """The control: the race above is real (this harness does stage two
    claimers counting at once), so its zero means the lock prevents it."""
    source = await wide_pool.fetchval(
        "SELECT pg_get_functiondef('fencepost_claim_limits(text[])'::regprocedure)")
    unlocked = source.replace(
        "PERFORM pg_advisory_xact_lock(1179665745, hashtext(q.name));", "NULL;")
    assert unlocked != source
    await wide_pool.execute(unlocked)
    store = ExecutionStore(wide_pool)

    over, most = await race(store, wide_pool, ROUNDS)

    assert over > 0 and most >= 2, (over, most)


async def test_a_claim_with_nothing_due_in_a_limited_queue_does_not_wait_for_its_lock(wide_pool):
    """Claimers serialize only on the limited queues they may take work
    from: a claim for other workflows proceeds while a limited queue's lock
    is held (by a claimer of that queue, stood for here by a held lock)."""
    store = ExecutionStore(wide_pool)
    await store.queues.change("busy", {"concurrency": 1}, actor="test")
    await admit(store, "busy-wf", "b1", queue="busy")
    await admit(store, "other-wf", "o1")
    async with wide_pool.acquire() as holder, holder.transaction():
        await holder.execute("SELECT pg_advisory_xact_lock(1179665745, hashtext('busy'))")

        claimed = await asyncio.wait_for(
            store.leases.claim_due(10, 30.0, "w-other", ["other-wf"]), timeout=5)
        assert [d.lease.execution_id for d in claimed] == ["o1"]

        # A claimer that may take the limited queue's work waits for its lock.
        waiting = asyncio.create_task(store.leases.claim_due(10, 30.0, "w-busy", ["busy-wf"]))
        await asyncio.sleep(0.5)
        assert not waiting.done()
    assert [d.lease.execution_id for d in await asyncio.wait_for(waiting, 5)] == ["b1"]


async def test_a_rate_limit_set_while_a_claim_waits_counts_that_claims_starts(wide_pool):
    """The claim records its starts by what its counting (after the lock)
    saw, not by the settings its own snapshot read before the lock: a rate
    limit committed while the claim waited is never exceeded."""
    store = ExecutionStore(wide_pool)
    await store.queues.change("api", {"concurrency": 100}, actor="test")
    for i in range(10):
        await admit(store, "wf", f"a{i}", queue="api")
    async with wide_pool.acquire() as holder:
        tx = holder.transaction()
        await tx.start()
        # What PUT /v1/queues/api does: the settings lock, then the change.
        await holder.execute("SELECT pg_advisory_xact_lock(1179665746, 0)")
        await holder.execute(
            "UPDATE queues SET override = override || "
            "'{\"rate_limit\": 5, \"rate_period\": 3600}'::jsonb WHERE name = 'api'")
        waiting = asyncio.create_task(store.leases.claim_due(10, 30.0, "w1"))
        await asyncio.sleep(0.5)
        assert not waiting.done()
        await tx.commit()
    first = await asyncio.wait_for(waiting, 5)
    second = await store.leases.claim_due(10, 30.0, "w2")

    assert (len(first), len(second)) == (5, 0)
    assert await wide_pool.fetchval("SELECT count(*) FROM queue_starts WHERE queue = 'api'") == 5


async def test_expired_leases_of_a_full_queue_do_not_crowd_out_takeovers_elsewhere(wide_pool):
    store = ExecutionStore(wide_pool)
    await store.queues.change("full", {"concurrency": 10}, actor="test")
    for i in range(6):
        await admit(store, "wf", f"f{i}", queue="full")
    assert len(await store.leases.claim_due(10, 30.0, "w1")) == 6
    await admit(store, "wf", "other")
    assert len(await store.leases.claim_due(10, 30.0, "w1")) == 1
    # Five of the full queue's leases expired long ago, f5 holds its one slot;
    # the other queue's lease expired later.
    await wide_pool.execute(
        "UPDATE executions SET lease_expires_at = now() - interval '2 hours' "
        "WHERE execution_id IN ('f0', 'f1', 'f2', 'f3', 'f4')")
    await wide_pool.execute("UPDATE executions SET lease_expires_at = now() - interval '1 hour' "
                            "WHERE execution_id = 'other'")
    await store.queues.change("full", {"concurrency": 1}, actor="test")

    taken = await store.leases.claim_due(5, 30.0, "w2")

    assert [d.lease.execution_id for d in taken] == ["other"]


async def test_a_claim_locks_settings_once_and_only_the_limited_queues_it_may_take_from(
        wide_pool):
    """However many queues exist, a claim holds one shared lock on the
    queues' settings (a change takes it exclusively) and one lock per
    limited queue it may take work from: never one per queue."""
    store = ExecutionStore(wide_pool)
    for i in range(50):
        await admit(store, "wf", f"u{i}", queue=f"unlimited-{i:02d}")
    await store.queues.change("limited", {"concurrency": 5}, actor="test")
    await admit(store, "wf", "l1", queue="limited")
    await store.queues.change("limited-idle", {"concurrency": 5}, actor="test")

    async with store.transaction() as tx:
        claimed = await tx.leases.claim_due(100, 30.0, "w1")
        held = await tx.leases.db.fetch(
            "SELECT classid, objid, mode FROM pg_locks "
            "WHERE locktype = 'advisory' AND pid = pg_backend_pid() ORDER BY mode")
    assert len(claimed) == 51
    assert [r["mode"] for r in held] == ["ExclusiveLock", "ShareLock"], held
