"""Claiming in tests: everything due at once, by execution ID."""

from __future__ import annotations

from typing import Any

from app.store import Delivery


async def claim(store: Any, owner: str = "worker-1", limit: int = 100,
                lease_seconds: float = 30.0) -> dict[str, Delivery]:
    """The deliveries of one claim_due call, by execution ID; a claim never
    hands out one execution twice."""
    deliveries = await store.leases.claim_due(limit, lease_seconds, owner)
    ids = [d.lease.execution_id for d in deliveries]
    assert len(ids) == len(set(ids)), f"one execution twice in one claim: {ids}"
    return {d.lease.execution_id: d for d in deliveries}
