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


async def claim_one(store: Any, execution_id: str, owner: str = "worker-1",
                    lease_seconds: float = 30.0) -> Delivery:
    """Claim the one due execution, `execution_id`, and return its delivery."""
    claimed = await claim(store, owner, lease_seconds=lease_seconds)
    assert list(claimed) == [execution_id], claimed
    return claimed[execution_id]
