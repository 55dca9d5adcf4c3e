"""Waiting (never a fixed long sleep), reading rows, moving database time.
The general helpers are the SDK tests' own; these are the composition ones."""

from __future__ import annotations

import asyncpg

from app.store import Delivery, ExecutionStore

TERMINAL = ("completed", "failed", "cancelled", "timed_out")


async def claim_one(store: ExecutionStore, workflow_id: str, owner: str,
                    lease_seconds: float = 30.0) -> Delivery:
    deliveries = await store.leases.claim_due(1, lease_seconds, owner, [workflow_id])
    assert len(deliveries) == 1, f"nothing of {workflow_id} to claim"
    return deliveries[0]


async def expire_lease(pool: asyncpg.Pool, execution_id: str, ago: float = 3600.0) -> None:
    """Move the live lease's expiry `ago` seconds into the past: long enough
    that any redelivery delay counted from it has passed."""
    n = await pool.fetchval(
        """
        WITH u AS (
            UPDATE executions SET lease_expires_at = now() - make_interval(secs => $2)
            WHERE execution_id = $1 AND status = 'running' RETURNING 1
        ) SELECT count(*) FROM u
        """,
        execution_id, float(ago),
    )
    assert n == 1, f"{execution_id} has no lease"


async def orders(pool: asyncpg.Pool, execution_id: str) -> list[dict]:
    rows = await pool.fetch(
        "SELECT order_id, execution_id, holder, amount_cents FROM shop.orders "
        "WHERE execution_id = $1", execution_id)
    return [dict(r) for r in rows]


async def children_rows(pool: asyncpg.Pool, parent_id: str) -> list[dict]:
    rows = await pool.fetch(
        "SELECT execution_id, workflow_id, status, params, parent_execution_id, parent_step_key, "
        "cancel_requested_at, outcome FROM executions WHERE parent_execution_id = $1 "
        "ORDER BY execution_id", parent_id)
    return [dict(r) for r in rows]
