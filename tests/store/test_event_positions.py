"""Each execution's history is ordered by places taken from a counter on its
row (executions.event_seq, revision 0012), in the statement that writes the
events. Many writers of one history at once (a holder's step writes in
batches, a stale holder's refused writes, signals, wakes) never share a
place, and every place taken is at most the counter."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from app.store import ExecutionStore
from app.store.types import Lease, LeaseLost
from tests.support.admission import admit

pytestmark = pytest.mark.citus

WRITERS = 20


async def test_many_writers_of_one_history_never_share_a_place(
        store: ExecutionStore, pool: asyncpg.Pool) -> None:
    eid = await admit(store, "busy", "many-writers")
    [delivery] = await store.leases.claim_due(1, 60.0, "w")
    stale = Lease(eid, delivery.lease.token - 1, delivery.lease.expires_at, "old")

    async def refused(i: int) -> None:
        with pytest.raises(LeaseLost):
            await store.steps.write_step(stale, f"stale-{i}", value=i, function_name="f")

    await asyncio.gather(*(
        job for i in range(WRITERS) for job in (
            store.steps.write_step(delivery.lease, f"step-{i}", value=i, function_name="f"),
            store.signals.send_signal(eid, "poke", i),
            store.operator.request_wake(eid),
            refused(i))))

    rows = await pool.fetch(
        "SELECT seq, kind FROM execution_events WHERE execution_id = $1 "
        "AND bucket = fencepost_bucket($1) ORDER BY seq", eid)
    kinds = [r["kind"] for r in rows]
    assert kinds[:2] == ["admitted", "claimed"]
    for kind in ("step_recorded", "signal_received", "wake_requested",
                 "fenced_write_rejected"):
        assert kinds.count(kind) == WRITERS, (kind, kinds)
    places = [r["seq"] for r in rows]
    assert len(set(places)) == len(places)
    counter = await pool.fetchval(
        "SELECT event_seq FROM executions WHERE execution_id = $1 "
        "AND bucket = fencepost_bucket($1)", eid)
    assert places[0] == 1 and places[-1] <= counter
