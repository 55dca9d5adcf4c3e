"""Helpers for the in-process SDK/worker tests: waiting with timeouts (never a
fixed long sleep), reading the record, events and signals, and moving
database time by UPDATE-ing rows."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from datetime import datetime
from typing import Any

import asyncpg

from app.store import Admitted, Delivery, ExecutionStore

END_KINDS = ("acknowledged", "released", "lease_expired")


async def wait_until(predicate: Callable[[], Any], *, timeout: float = 10.0,
                     interval: float = 0.02, what: str = "condition") -> Any:
    """Poll `predicate` (sync or async) until it returns something truthy."""
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
    """The record once its (healed) status is one of `statuses`."""
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
            f"{exc}; last status {record.get('status')!r}, outcome {record.get('outcome')!r}, "
            f"token {record.get('token')!r}"
        ) from None


async def wait_event(store: ExecutionStore, execution_id: str, kind: str, *, count: int = 1,
                     timeout: float = 10.0) -> list[dict]:
    async def check():
        found = [e for e in await store.events(execution_id) if e["kind"] == kind]
        return found if len(found) >= count else None

    return await wait_until(check, timeout=timeout,
                            what=f"{count} {kind!r} event(s) of {execution_id}")


async def admit(store: ExecutionStore, workflow_id: str, execution_id: str,
                params: Any = None, context: dict | None = None) -> str:
    result = await store.admit(workflow_id=workflow_id, params={} if params is None else params,
                               execution_id=execution_id, context=context)
    assert isinstance(result, Admitted), result
    return execution_id


async def kinds(store: ExecutionStore, execution_id: str) -> list[str]:
    return [e["kind"] for e in await store.events(execution_id)]


async def kinds_ignoring_late_renewals(store: ExecutionStore, execution_id: str) -> list[str]:
    """Event kinds, leaving out 'renewal_lost' events for a token whose
    delivery had already ended (acknowledged/released/expired) before. The
    store writes none when the holder ended it itself (see
    test_a_delivery_ended_by_its_holder_is_not_recorded_as_a_lost_renewal);
    a lease ended by the reaper or a newer claim still gets one."""
    ended: set[int] = set()
    out = []
    for e in await store.events(execution_id):
        if e["kind"] in END_KINDS:
            ended.add(e["token"])
        if e["kind"] == "renewal_lost" and e["token"] in ended:
            continue
        out.append(e["kind"])
    return out


async def events_of(store: ExecutionStore, execution_id: str, kind: str) -> list[dict]:
    return [e for e in await store.events(execution_id) if e["kind"] == kind]


async def step_rows(pool: asyncpg.Pool, execution_id: str) -> dict[str, dict]:
    rows = await pool.fetch(
        "SELECT * FROM execution_steps WHERE execution_id = $1 ORDER BY recorded_at, step_key",
        execution_id,
    )
    return {r["step_key"]: dict(r) for r in rows}


async def signal_rows(pool: asyncpg.Pool, execution_id: str) -> list[dict]:
    rows = await pool.fetch(
        """
        SELECT signal_id, name, payload, consumed_step, consumed_token
        FROM signals WHERE execution_id = $1 ORDER BY signal_id
        """,
        execution_id,
    )
    return [dict(r) for r in rows]


async def fast_forward_timer(pool: asyncpg.Pool, execution_id: str, step_key: str) -> None:
    """Move database time past a recorded timer of a suspended execution: its
    recorded wake time and the pending wake both move one second before
    now(), and idle workers are notified (as a due wake would be)."""
    row = await pool.fetchrow(
        """
        WITH s AS (
            UPDATE execution_steps
            SET value = to_jsonb(now() - interval '1 second')
            WHERE execution_id = $1 AND step_key = $2 AND function_name = 'sleep'
            RETURNING 1
        ), e AS (
            UPDATE executions SET due_at = now() - interval '1 second'
            WHERE execution_id = $1 AND status = 'suspended'
            RETURNING 1
        )
        SELECT (SELECT count(*) FROM s) AS steps, (SELECT count(*) FROM e) AS executions,
               pg_notify('fencepost_due', '')
        """,
        execution_id,
        step_key,
    )
    assert (row["steps"], row["executions"]) == (1, 1), (
        f"{execution_id}: no suspended execution with timer {step_key!r} to move"
    )


async def steal_lease(pool: asyncpg.Pool, settings, execution_id: str,
                      owner: str = "intruder", duration: float = 60.0) -> Delivery:
    """Another dispatcher takes over: in one transaction the live lease is
    backdated past its expiry (and past the redelivery delay) and claimed by
    a separate store call. Atomic, so the victim's renewer cannot slip in
    between the backdate and the claim."""
    async with pool.acquire() as conn, conn.transaction():
        n = await conn.fetchval(
            """
            WITH u AS (
                UPDATE executions SET lease_expires_at = now() - interval '1 hour'
                WHERE execution_id = $1 AND status = 'running' RETURNING 1
            ) SELECT count(*) FROM u
            """,
            execution_id,
        )
        assert n == 1, f"{execution_id} has no live lease to steal"
        # A Connection offers the same fetch/fetchrow/execute as a Pool.
        intruder = ExecutionStore.from_settings(conn, settings)  # type: ignore[arg-type]
        claimed = await intruder.claim_due(100, duration, owner)
    mine = [d for d in claimed if d.lease.execution_id == execution_id]
    assert len(mine) == 1, claimed
    return mine[0]


def parse_ts(value: str | datetime) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)
