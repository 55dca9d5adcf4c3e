"""Closing a test's pools without waiting for ever."""

from __future__ import annotations

import asyncio

import asyncpg


async def close_pool(pool: asyncpg.Pool, timeout: float = 10.0) -> None:
    """Close `pool`, or terminate it when its connections are not all back
    within `timeout` seconds: close() waits for every connection to be
    released, and a test that failed (or timed out) mid-race can leave one
    held by a task no one awaits, or in an aborted transaction."""
    try:
        await asyncio.wait_for(pool.close(), timeout)
    except Exception:
        pool.terminate()
