"""Writes to the shared tables (on Citus: reference tables, a copy on every
node) as the store makes them: worker registration, maintenance leadership,
queue declarations and changes, shared settings and code schedules. Each is
an upsert whose update path used to stamp now() in ON CONFLICT DO UPDATE SET,
which Citus refuses ("functions used in the DO UPDATE SET clause of INSERTs
on distributed tables must be marked IMMUTABLE"): a worker or an API process
could not start on a cluster. Marked `citus`: the same answers on one
Postgres and on a cluster."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from app.store import ExecutionStore

pytestmark = pytest.mark.citus


async def test_a_worker_registers_again_and_its_start_moves(store: ExecutionStore,
                                                            pool: asyncpg.Pool) -> None:
    workers = store.workers
    assert await workers.register_worker("w1", host="h", pid=1, workflows=["a"],
                                         concurrency=4, live_within_seconds=30) is None
    first = await pool.fetchval("SELECT started_at FROM workers WHERE worker_id = 'w1'")
    # The same ID from another live process is refused, its holder unchanged.
    holder = await workers.register_worker("w1", host="h", pid=2, workflows=["a"],
                                           concurrency=4, live_within_seconds=30)
    assert holder is not None and holder["pid"] == 1
    await workers.worker_stopped("w1")
    await asyncio.sleep(0.01)
    # Once stopped, the ID is taken again: a new start, not the old one.
    assert await workers.register_worker("w1", host="h", pid=2, workflows=["b"],
                                         concurrency=8, live_within_seconds=30) is None
    row = await pool.fetchrow("SELECT pid, workflows, concurrency, started_at, heartbeat_at, "
                              "stopped_at FROM workers WHERE worker_id = 'w1'")
    assert (row["pid"], row["workflows"], row["concurrency"]) == (2, ["b"], 8)
    assert row["started_at"] > first and row["heartbeat_at"] >= row["started_at"]
    assert row["stopped_at"] is None


async def test_leadership_is_renewed_refused_and_taken_over(store: ExecutionStore) -> None:
    leases = store.maintenance
    mine = await leases.acquire("sweeps", "a", 30)
    assert mine is not None and mine.token == 1
    again = await leases.acquire("sweeps", "a", 30)
    assert again is not None and again.token == 1 and again.expires_at >= mine.expires_at
    assert await leases.acquire("sweeps", "b", 30) is None
    # An expired term is taken over by the next holder, with a new token.
    short = await leases.acquire("other", "a", 0.05)
    assert short is not None
    await asyncio.sleep(0.2)
    taken = await leases.acquire("other", "b", 30)
    assert taken is not None and (taken.holder, taken.token) == ("b", 2)
    assert await leases.holds(taken) and not await leases.holds(short)


async def test_queue_declarations_and_changes_are_stored_and_recorded(
        store: ExecutionStore, pool: asyncpg.Pool) -> None:
    await store.queues.declare({"q": {"concurrency": 2}})
    await store.queues.declare({"q": {"concurrency": 3}})
    changed = await store.queues.change("q", {"concurrency": 5}, actor="op")
    assert changed["concurrency"] == 5 and changed["override"] == {"concurrency": 5}
    changes = await pool.fetch("SELECT actor, change FROM queue_changes WHERE queue = 'q' "
                               "ORDER BY change_id")
    assert [(c["actor"], c["change"]) for c in changes] == [
        ("code", {"declared": {"concurrency": 2}}),
        ("code", {"declared": {"concurrency": 3}}),
        ("op", {"set": {"concurrency": 5}, "reset": []}),
    ]


async def test_a_shared_setting_is_set_deliberately(store: ExecutionStore) -> None:
    stored = await store.settings.store_shared_settings({"max_unacknowledged_deliveries": 25})
    change = await store.settings.set_shared_setting("max_unacknowledged_deliveries", 7)
    assert (change.value, change.previous) == (7, 25)
    assert change.updated_at > stored["max_unacknowledged_deliveries"].updated_at


async def test_a_code_schedule_is_updated_in_place(store: ExecutionStore) -> None:
    first = await store.schedules.upsert_code_schedule(
        schedule_id="nightly", workflow_id="nightly", cron="0 3 * * *", timezone="UTC",
        params={})
    second = await store.schedules.upsert_code_schedule(
        schedule_id="nightly", workflow_id="nightly", cron="0 4 * * *", timezone="UTC",
        params={})
    assert first is not None and second is not None
    assert second["cron"] == "0 4 * * *" and second["updated_at"] > first["updated_at"]
