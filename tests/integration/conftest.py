"""Fixtures for the ExecutionStore integration tests (real Postgres).

The top-level tests/conftest.py gives every test a fresh migrated database
(`database_url`), its `settings` and a `pool`. Here:

  store   ExecutionStore.from_settings(pool, settings)
  clock   moves database time for one execution by UPDATE-ing its rows
          (backdate_lease / backdate_redelivery / backdate_due / expire_lease),
          plus `now()` and `raw()` reads. All time is database now(); no test
          sleeps to make time pass.

Helper coroutines take the pool explicitly so tests can also call them on a
second pool (e.g. after a "restart").
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import asyncpg
import pytest
import pytest_asyncio

from app.db import create_pool
from app.settings import Settings
from app.store import ExecutionStore

# --------------------------------------------------------------------------- #
# moving time: shift the stored times of one execution into the past
# --------------------------------------------------------------------------- #


async def backdate_lease(pool: asyncpg.Pool, execution_id: str, seconds: float) -> None:
    """Shift the live lease's expiry `seconds` into the past (as if that much
    time had passed since the claim / last renewal)."""
    n = await pool.fetchval(
        """
        WITH u AS (
            UPDATE executions
            SET lease_expires_at = lease_expires_at - make_interval(secs => $2)
            WHERE execution_id = $1 AND lease_expires_at IS NOT NULL
            RETURNING 1
        ) SELECT count(*) FROM u
        """,
        execution_id,
        float(seconds),
    )
    assert n == 1, f"{execution_id} has no lease to backdate"


async def expire_lease(pool: asyncpg.Pool, execution_id: str, ago: float = 3600.0) -> None:
    """Set the lease expiry to `ago` seconds before now(): long enough (by
    default) that any redelivery delay counted from the expiry has passed."""
    n = await pool.fetchval(
        """
        WITH u AS (
            UPDATE executions SET lease_expires_at = now() - make_interval(secs => $2)
            WHERE execution_id = $1 AND lease_expires_at IS NOT NULL
            RETURNING 1
        ) SELECT count(*) FROM u
        """,
        execution_id,
        float(ago),
    )
    assert n == 1, f"{execution_id} has no lease to expire"


async def backdate_redelivery(pool: asyncpg.Pool, execution_id: str, seconds: float) -> None:
    """Shift the end of the last unacknowledged delivery (and with it the end
    of the redelivery delay) `seconds` into the past."""
    await pool.execute(
        """
        UPDATE executions
        SET last_unacknowledged_at = last_unacknowledged_at - make_interval(secs => $2),
            redeliver_after = redeliver_after - make_interval(secs => $2)
        WHERE execution_id = $1
        """,
        execution_id,
        float(seconds),
    )


async def backdate_due(pool: asyncpg.Pool, execution_id: str, seconds: float) -> None:
    """Shift the pending wakes (due_at and covered_due_at) into the past."""
    await pool.execute(
        """
        UPDATE executions
        SET due_at = due_at - make_interval(secs => $2),
            covered_due_at = covered_due_at - make_interval(secs => $2)
        WHERE execution_id = $1
        """,
        execution_id,
        float(seconds),
    )


async def db_now(pool: asyncpg.Pool) -> datetime:
    return await pool.fetchval("SELECT now()")


async def raw_record(pool: asyncpg.Pool, execution_id: str) -> dict | None:
    """The row as stored (no healing)."""
    row = await pool.fetchrow("SELECT * FROM executions WHERE execution_id = $1", execution_id)
    return dict(row) if row is not None else None


class Clock:
    """The helpers above bound to one pool."""

    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool

    async def now(self) -> datetime:
        return await db_now(self.pool)

    async def later(self, seconds: float) -> datetime:
        return await db_now(self.pool) + timedelta(seconds=seconds)

    async def backdate_lease(self, execution_id: str, seconds: float) -> None:
        await backdate_lease(self.pool, execution_id, seconds)

    async def expire_lease(self, execution_id: str, ago: float = 3600.0) -> None:
        await expire_lease(self.pool, execution_id, ago)

    async def backdate_redelivery(self, execution_id: str, seconds: float) -> None:
        await backdate_redelivery(self.pool, execution_id, seconds)

    async def backdate_due(self, execution_id: str, seconds: float) -> None:
        await backdate_due(self.pool, execution_id, seconds)

    async def raw(self, execution_id: str) -> dict | None:
        return await raw_record(self.pool, execution_id)


# --------------------------------------------------------------------------- #
# fixtures
# --------------------------------------------------------------------------- #


@pytest.fixture
def store(pool: asyncpg.Pool, settings: Settings) -> ExecutionStore:
    return ExecutionStore.from_settings(pool, settings)


@pytest.fixture
def clock(pool: asyncpg.Pool) -> Clock:
    return Clock(pool)


@pytest_asyncio.fixture
async def extra_pools(settings: Settings) -> AsyncIterator[list[asyncpg.Pool]]:
    """A list to which tests append pools they open with `open_pool`; all are
    closed after the test."""
    pools: list[asyncpg.Pool] = []
    try:
        yield pools
    finally:
        for p in pools:
            try:
                await p.close()
            except Exception:
                p.terminate()


@pytest.fixture
def open_pool(settings: Settings, extra_pools: list[asyncpg.Pool]):
    """`await open_pool(max_size=1)`: another pool on the test database,
    closed after the test."""

    async def _open(*, min_size: int = 1, max_size: int = 1) -> asyncpg.Pool:
        p = await create_pool(settings, min_size=min_size, max_size=max_size)
        extra_pools.append(p)
        return p

    return _open
