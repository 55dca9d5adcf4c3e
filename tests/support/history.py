"""Reading an execution's history in tests: its event kinds, events of one
kind, its recorded steps and signals."""

from __future__ import annotations

from typing import Any

import asyncpg

# The event kinds that end a delivery (its token's lease).
END_KINDS = ("acknowledged", "released", "lease_expired")


async def kinds(store: Any, execution_id: str) -> list[str]:
    return [e["kind"] for e in await store.history.events(execution_id)]


async def kinds_ignoring_late_renewals(store: Any, execution_id: str) -> list[str]:
    """Event kinds, leaving out 'renewal_lost' events for a token whose
    delivery had already ended (acknowledged/released/expired) before. The
    store writes none when the holder ended it itself (see
    test_a_delivery_ended_by_its_holder_is_not_recorded_as_a_lost_renewal);
    a lease ended by the reaper or a newer claim still gets one."""
    ended: set[int] = set()
    out = []
    for e in await store.history.events(execution_id):
        if e["kind"] in END_KINDS:
            ended.add(e["token"])
        if e["kind"] == "renewal_lost" and e["token"] in ended:
            continue
        out.append(e["kind"])
    return out


async def events_of(store: Any, execution_id: str, kind: str) -> list[dict]:
    return [e for e in await store.history.events(execution_id) if e["kind"] == kind]


async def event_count(store: Any) -> int:
    """Events of every execution (to show an operation recorded nothing)."""
    return await store.pool.fetchval("SELECT count(*) FROM execution_events")


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
