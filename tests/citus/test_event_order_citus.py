"""An execution's history keeps the order it was written in on Citus, where
event IDs come from each node's own range: its places come from a counter on
the execution's row (revision 0012), not from the IDs. Here the execution's
shard moves, mid-delivery, to the node whose range is lower, and a child
started on the other node writes its parent's `child_started`."""

from __future__ import annotations

import asyncpg
import pytest

from app.store import ExecutionStore
from app.store.buckets import bucket_of
from tests.citus.rows import node, on_other_nodes

pytestmark = pytest.mark.citus


async def _events(pool: asyncpg.Pool, eid: str) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT event_id, seq, kind, detail->>'stepKey' AS step FROM execution_events "
        "WHERE execution_id = $1 AND bucket = fencepost_bucket($1) ORDER BY seq", eid)


async def test_a_history_keeps_its_order_when_its_shard_moves_to_a_lower_range(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    workers = await pool.fetch(
        "SELECT nodename, nodeport FROM pg_dist_node WHERE groupid > 0 ORDER BY groupid")
    low, high = (r["nodeport"] for r in workers)
    host = workers[0]["nodename"]
    eid = [e for e in [f"moving-{i}" for i in range(20)] if await node(pool, e) == high][0]
    await store.admissions.admit(workflow_id="wf", params={}, execution_id=eid)
    (delivery,) = await store.leases.claim_due(1, 60.0, "w")
    await store.steps.write_step(delivery.lease, "before", value=1, function_name="f")

    await pool.execute(
        "SELECT citus_move_shard_placement("
        "get_shard_id_for_distribution_column('executions', $1::smallint), "
        "$2, $3, $2, $4, shard_transfer_mode => 'block_writes')",
        bucket_of(eid), host, high, low)
    assert await node(pool, eid) == low

    await store.steps.write_step(delivery.lease, "after", value=2, function_name="f")
    await store.leases.acknowledge(delivery.lease, "completed", result=3)

    events = await _events(pool, eid)
    assert [(e["kind"], e["step"]) for e in events] == [
        ("admitted", None), ("claimed", None), ("step_recorded", "before"),
        ("step_recorded", "after"), ("acknowledged", None)]
    # The case itself: the events written after the move took lower IDs.
    assert events[3]["event_id"] < events[2]["event_id"]
    page = await store.history.execution_events_page(eid, after=events[2]["event_id"], limit=10)
    assert [e["kind"] for e in page or []] == ["step_recorded", "acknowledged"]


async def test_a_childs_start_takes_its_place_in_the_parents_history(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    child, parent = await on_other_nodes(pool, "starting")
    await store.admissions.admit(workflow_id="wf", params={}, execution_id=parent)
    (delivery,) = await store.leases.claim_due(1, 60.0, "w")
    await store.steps.write_step(delivery.lease, "first", value=1, function_name="f")
    answer, _ = await store.compose.start_child(
        delivery.lease, "spawn", workflow_id="wf", params={}, child_id=child)
    assert answer == "started"
    await store.steps.write_step(delivery.lease, "last", value=2, function_name="f")

    assert [(e["kind"], e["step"]) for e in await _events(pool, parent)] == [
        ("admitted", None), ("claimed", None), ("step_recorded", "first"),
        ("child_started", "spawn"), ("step_recorded", "last")]
    assert [(e["seq"], e["kind"]) for e in await _events(pool, child)] == [(1, "admitted")]
