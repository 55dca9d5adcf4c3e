"""The maintenance lease in the database (app/store/leadership.py): one
holder per role at a time, renewed by its holder with the same token, taken
over by anyone once expired (token + 1), after which the old holder's term
no longer stands; a release hands the role over at once."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from pydantic import ValidationError

from app.maintenance import Leadership, schedules_role
from app.settings import Settings
from app.store import ExecutionStore, MaintenanceLeases


async def _expired(store: MaintenanceLeases, lease) -> bool:
    deadline = asyncio.get_running_loop().time() + 10
    while await store.holds(lease):
        assert asyncio.get_running_loop().time() < deadline, "the lease never expired"
        await asyncio.sleep(0.02)
    return True


async def test_one_holder_at_a_time_renewed_with_the_same_token(pool: asyncpg.Pool):
    store = ExecutionStore(pool).maintenance
    a = await store.acquire("sweeps", "A", 30)
    assert a is not None and (a.holder, a.token) == ("A", 1)
    assert await store.acquire("sweeps", "B", 30) is None  # A's term stands
    renewed = await store.acquire("sweeps", "A", 30)
    assert renewed is not None and renewed.token == 1 and renewed.expires_at >= a.expires_at
    assert await store.holds(a)
    assert [(lease.role, lease.holder) for lease in await store.leaders()] == [("sweeps", "A")]


async def test_an_expired_lease_is_taken_over_and_the_old_term_ends(pool: asyncpg.Pool):
    store = ExecutionStore(pool).maintenance
    a = await store.acquire("sweeps", "A", 0.2)
    assert await _expired(store, a)
    b = await store.acquire("sweeps", "B", 30)
    assert b is not None and (b.holder, b.token) == ("B", 2)
    # A resumes (it was paused): its renewal fails and its term does not stand.
    assert await store.acquire("sweeps", "A", 30) is None
    assert not await store.holds(a)
    assert await store.holds(b)


async def test_concurrent_takeovers_elect_exactly_one(pool: asyncpg.Pool):
    store = ExecutionStore(pool).maintenance
    old = await store.acquire("sweeps", "old", 0.1)
    assert await _expired(store, old)
    got = await asyncio.gather(*(store.acquire("sweeps", f"w{i}", 30) for i in range(6)))
    winners = [lease for lease in got if lease is not None]
    assert len(winners) == 1 and winners[0].token == 2, got


async def test_a_release_hands_the_role_over_at_once(pool: asyncpg.Pool):
    store = ExecutionStore(pool).maintenance
    a = await store.acquire("sweeps", "A", 30)
    assert await store.release(a)
    assert not await store.holds(a)
    b = await store.acquire("sweeps", "B", 30)
    assert b is not None and b.token == 2
    assert not await store.release(a)  # an ended term releases nothing


async def test_roles_are_independent_and_schedules_are_per_workflow_set(pool: asyncpg.Pool):
    store = ExecutionStore(pool).maintenance
    assert schedules_role(["b", "a"]) == schedules_role(["a", "b"]) == "schedules a,b"
    assert len(schedules_role([f"workflow-{i}" for i in range(50)])) < 60
    assert await store.acquire("sweeps", "A", 30) is not None
    assert await store.acquire(schedules_role(["a"]), "B", 30) is not None
    assert await store.acquire(schedules_role(["b"]), "C", 30) is not None


async def test_a_leader_checks_the_database_before_each_sweep(pool: asyncpg.Pool):
    """A paused leader's in-memory lease is stale: leading() asks the database."""
    store = ExecutionStore(pool).maintenance
    a = Leadership(store, "sweeps", "A", 0.2)
    b = Leadership(store, "sweeps", "B", 30)
    assert await a.attempt() and await a.leading()
    assert not await b.attempt()
    assert await _expired(store, a.lease)
    assert await b.attempt() and await b.leading()
    assert not await a.leading() and a.lease is None


def test_the_lease_ttl_setting_defaults_to_15_s_or_the_shorter_execution_lease(monkeypatch):
    for name in ("FENCEPOST_LEASE_SECONDS", "FENCEPOST_MAINTENANCE_LEASE_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    assert Settings().maintenance_lease_seconds == 15
    assert Settings(lease_seconds=2).maintenance_lease_seconds == 2
    assert Settings(lease_seconds=2, maintenance_lease_seconds=20).maintenance_lease_seconds == 20
    monkeypatch.setenv("FENCEPOST_MAINTENANCE_LEASE_SECONDS", "4")
    assert Settings(lease_seconds=2).maintenance_lease_seconds == 4
    for bad in ("0", "-1", "3601"):
        monkeypatch.setenv("FENCEPOST_MAINTENANCE_LEASE_SECONDS", bad)
        with pytest.raises(ValidationError, match="maintenance_lease_seconds"):
            Settings()
