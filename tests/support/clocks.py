"""Moving database time in tests: the stored times of one execution are shifted
into the past by UPDATE-ing its rows (all time is the database's now(); no
test sleeps to make time pass), and a live lease can be taken over by another
dispatcher. Helpers take the pool explicitly so a test can also call them on a
second pool (e.g. after a "restart"); `Clock` binds them to one pool."""

from __future__ import annotations

from datetime import datetime, timedelta

import asyncpg

from app.store import Delivery, ExecutionStore


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
        claimed = await intruder.leases.claim_due(100, duration, owner)
    mine = [d for d in claimed if d.lease.execution_id == execution_id]
    assert len(mine) == 1, claimed
    return mine[0]


def parse_ts(value: str | datetime) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)
