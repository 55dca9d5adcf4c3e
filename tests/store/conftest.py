"""Fixtures for the store tests (ExecutionStore against real Postgres).

The top-level tests/conftest.py gives every test a fresh migrated database
(`database_url`), its `settings` and a `pool`. Here:

  clock   moves database time for one execution by UPDATE-ing its rows
          (tests/support/clocks.py: backdate_lease / backdate_redelivery /
          backdate_due / expire_lease), plus `now()` and `raw()` reads.
(`store`, on that pool and settings, comes from tests/conftest.py.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio

from app.db import create_pool
from app.settings import Settings
from tests.support.clocks import Clock
from tests.support.pools import close_pool

# --------------------------------------------------------------------------- #
# fixtures
# --------------------------------------------------------------------------- #


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
            await close_pool(p)


@pytest.fixture
def open_pool(settings: Settings, extra_pools: list[asyncpg.Pool]):
    """`await open_pool(max_size=1)`: another pool on the test database,
    closed after the test."""

    async def _open(*, min_size: int = 1, max_size: int = 1) -> asyncpg.Pool:
        p = await create_pool(settings, min_size=min_size, max_size=max_size)
        extra_pools.append(p)
        return p

    return _open
