"""Waiting (never a fixed long sleep), reading rows, moving database time."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

import asyncpg

from app.store import Admitted, Delivery, ExecutionStore

TERMINAL = ("completed", "failed", "cancelled", "timed_out")


async def wait_until(predicate: Callable[[], Any], *, timeout: float = 10.0,
                     interval: float = 0.02, what: str = "condition") -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if loop.time() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


async def wait_status(store: ExecutionStore, execution_id: str, *statuses: str,
                      timeout: float = 10.0) -> dict:
    last: dict[str, Any] = {}

    async def check():
        record = await store.get(execution_id)
        last["record"] = record
        return record if record is not None and record["status"] in statuses else None

    try:
        return await wait_until(check, timeout=timeout, what=f"{execution_id} in {statuses}")
    except AssertionError as exc:
        record = last.get("record") or {}
        raise AssertionError(
            f"{exc}; last status {record.get('status')!r}, outcome {record.get('outcome')!r}"
        ) from None


async def admit(store: ExecutionStore, workflow_id: str, execution_id: str,
                params: Any = None) -> str:
    result = await store.admit(workflow_id=workflow_id, params={} if params is None else params,
                               execution_id=execution_id)
    assert isinstance(result, Admitted), result
    return execution_id


async def claim_one(store: ExecutionStore, workflow_id: str, owner: str,
                    lease_seconds: float = 30.0) -> Delivery:
    deliveries = await store.claim_due(1, lease_seconds, owner, [workflow_id])
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


async def step_rows(pool: asyncpg.Pool, execution_id: str) -> dict[str, dict]:
    rows = await pool.fetch(
        "SELECT * FROM execution_steps WHERE execution_id = $1 ORDER BY recorded_at, step_key",
        execution_id)
    return {r["step_key"]: dict(r) for r in rows}


async def events_of(store: ExecutionStore, execution_id: str, kind: str) -> list[dict]:
    return [e for e in await store.events(execution_id) if e["kind"] == kind]


async def children_rows(pool: asyncpg.Pool, parent_id: str) -> list[dict]:
    rows = await pool.fetch(
        "SELECT execution_id, workflow_id, status, params, parent_execution_id, parent_step_key, "
        "cancel_requested_at, outcome FROM executions WHERE parent_execution_id = $1 "
        "ORDER BY execution_id", parent_id)
    return [dict(r) for r in rows]
