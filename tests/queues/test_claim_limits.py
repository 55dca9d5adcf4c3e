"""Flow control in the claim, against a real Postgres: each limit takes
effect in claim_due itself, and work that a limit holds back never blocks
work behind it (other queues, other keys, resumptions)."""

from __future__ import annotations

from typing import Any

import asyncpg

from app.store import ExecutionStore
from tests.support.admission import admit
from tests.support.claims import claim
from tests.support.clocks import backdate_redelivery, expire_lease

WF = "wf"


async def limit(store: ExecutionStore, queue: str, **settings: Any) -> None:
    await store.queues.change(queue, settings, actor="test")


async def running(pool: asyncpg.Pool, queue: str) -> int:
    return int(await pool.fetchval(
        "SELECT count(*) FROM executions WHERE queue = $1 AND status = 'running'", queue))


async def finish(store: ExecutionStore, delivery: Any) -> None:
    await store.leases.acknowledge(delivery.lease, "completed", result=None)


async def test_concurrency_limits_what_runs_at_once_and_frees_a_slot_on_completion(store, pool):
    await limit(store, "payments", concurrency=2)
    ids = [await admit(store, WF, f"p{i}", queue="payments") for i in range(5)]

    first = await claim(store)
    assert sorted(first) == ids[:2]
    assert await claim(store) == {}

    await finish(store, first["p0"])
    assert list(await claim(store)) == ["p2"]
    assert await running(pool, "payments") == 2


async def test_a_full_queue_does_not_hold_back_other_queues(store, pool):
    await limit(store, "slow", concurrency=1)
    for i in range(10):
        await admit(store, WF, f"slow{i}", queue="slow")
    await admit(store, WF, "other")

    claimed = await claim(store, limit=3)

    assert sorted(claimed) == ["other", "slow0"]


async def test_per_key_concurrency_skips_a_full_key_and_runs_other_keys(store, pool):
    await limit(store, "orders", per_key_concurrency=1)
    for i in range(5):
        await admit(store, WF, f"a{i}", queue="orders", concurrency_key="customer-a")
    await admit(store, WF, "b0", queue="orders", concurrency_key="customer-b")
    await admit(store, WF, "nokey", queue="orders")

    assert sorted(await claim(store)) == ["a0", "b0", "nokey"]
    # customer-a is full; its backlog is skipped, not waited behind.
    await admit(store, WF, "c0", queue="orders", concurrency_key="customer-c")
    assert list(await claim(store)) == ["c0"]


async def test_priority_orders_due_executions_within_a_queue(store, pool):
    await limit(store, "one", concurrency=1)
    await admit(store, WF, "early", queue="one")
    await admit(store, WF, "urgent", queue="one", priority=-1)

    assert list(await claim(store)) == ["urgent"]


async def test_equal_priorities_are_first_due_first_claimed(store, pool):
    for i in range(5):
        await admit(store, WF, f"e{i}", queue="fifo")
    await limit(store, "fifo", concurrency=1)

    order = []
    for _ in range(5):
        (eid, d), = (await claim(store)).items()
        order.append(eid)
        await finish(store, d)
    assert order == [f"e{i}" for i in range(5)]


async def test_a_delayed_start_is_admitted_now_and_due_later(store, pool):
    await admit(store, WF, "later", delay_seconds=3600)
    assert await claim(store) == {}
    row = await pool.fetchrow(
        "SELECT status, due_at - admitted_at AS delay FROM executions WHERE execution_id = 'later'")
    assert row["status"] == "admitted" and row["delay"].total_seconds() == 3600

    await pool.execute("UPDATE executions SET due_at = now() WHERE execution_id = 'later'")
    assert list(await claim(store)) == ["later"]


async def test_rate_limit_counts_starts_and_lets_resumptions_through(store, pool):
    await limit(store, "api", rate_limit=2, rate_period=3600.0)
    for i in range(4):
        await admit(store, WF, f"r{i}", queue="api")

    first = await claim(store)
    assert sorted(first) == ["r0", "r1"]
    # Ending them frees no start: starts count per period, not while running.
    for d in first.values():
        await store.leases.release(d.lease)
        await backdate_redelivery(pool, d.lease.execution_id, 3600)
    resumed = await claim(store)
    assert sorted(resumed) == ["r0", "r1"]  # released, so started before: not a start
    assert await pool.fetchval("SELECT count(*) FROM queue_starts WHERE queue = 'api'") == 2


async def test_rate_limit_per_key(store, pool):
    await limit(store, "api", rate_limit=1, rate_period=3600.0, rate_per_key=True)
    for key in ("a", "a", "b"):
        await admit(store, WF, queue="api", concurrency_key=key)

    assert len(await claim(store)) == 2
    keys = await pool.fetch("SELECT concurrency_key FROM executions WHERE status = 'running'")
    assert sorted(r[0] for r in keys) == ["a", "b"]


async def test_a_paused_queue_is_not_claimed_until_resumed(store, pool):
    await limit(store, "held", paused=True)
    await admit(store, WF, "h", queue="held")
    assert await claim(store) == {}
    await limit(store, "held", paused=False)
    assert list(await claim(store)) == ["h"]


async def test_a_suspended_execution_frees_its_slot_unless_the_queue_holds_it(store, pool):
    for queue, hold in (("free", False), ("hold", True)):
        await limit(store, queue, concurrency=1, hold_while_suspended=hold)
        await admit(store, WF, f"{queue}-1", queue=queue)
        await admit(store, WF, f"{queue}-2", queue=queue)
    first = await claim(store)
    assert sorted(first) == ["free-1", "hold-1"]
    for d in first.values():
        await store.leases.acknowledge(d.lease, "suspended")  # waits; holds no wake

    assert list(await claim(store)) == ["free-2"]


async def test_an_expired_lease_frees_its_slot(store, pool):
    await limit(store, "one", concurrency=1)
    await admit(store, WF, "held", queue="one")
    await admit(store, WF, "next", queue="one")
    assert list(await claim(store)) == ["held"]
    assert await claim(store) == {}

    await expire_lease(pool, "held")

    # The expired holder's slot is free: one of the two runs, never both.
    assert len(await claim(store)) == 1
    assert await running(pool, "one") == 1
