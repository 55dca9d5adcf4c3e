"""What callers and operators decide from outside, and the effects a
delivery parks on, on Citus: signals, wakes, cancel and terminate of a tree
whose members sit on both worker nodes, resume, and an outcome-unknown step
parked and resolved. Each fenced or per-execution change runs on the node
holding the execution (app/store/on_shard.py); a cancel's tree is found
from the coordinator and changed shard by shard in one transaction."""

from __future__ import annotations

import asyncpg
import pytest

from app.store import ExecutionStore
from app.store.buckets import bucket_of
from app.store.types import LeaseLost
from tests.citus.rows import event_kinds, insert, lease, node, on_other_nodes, state

pytestmark = pytest.mark.citus


async def test_signals_reach_executions_on_every_shard_and_are_consumed_fenced(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    ids = [f"signalled-{i}" for i in range(24)]
    assert len({await node(pool, eid) for eid in ids}) == 2
    for eid in ids:
        await insert(pool, eid, "suspended")
        assert await store.signals.send_signal(eid, "go", {"to": eid}) == ("received", None)
        assert (await state(pool, eid))["due"] is True, eid
    assert await store.signals.send_signal("nobody", "go", 1) == ("not_found", None)
    for eid in ids:
        await pool.execute("UPDATE executions SET status = 'running', token = 2, "
                           "lease_owner = 'w', lease_expires_at = now() + interval '1 hour' "
                           "WHERE execution_id = $1 AND bucket = fencepost_bucket($1)", eid)
        # A stale holder takes nothing and is told so.
        with pytest.raises(LeaseLost):
            await store.signals.consume_signal(lease(eid, 1), "signal:go", "go")
        step = await store.signals.consume_signal(lease(eid, 2), "signal:go", "go")
        assert step is not None and step.value == {"to": eid}, eid
        # Taken once: the step is recorded, nothing more is pending.
        again = await store.signals.consume_signal(lease(eid, 2), "signal:go", "go")
        assert again is not None and again.value == {"to": eid}
        assert await pool.fetchval(
            "SELECT count(*) FROM signals WHERE execution_id = $1 AND consumed_step IS NULL "
            "AND bucket = fencepost_bucket($1)", eid) == 0
    assert await pool.fetchval(
        "SELECT count(*) FROM execution_events WHERE kind = 'signal_consumed'") == len(ids)


async def test_wakes_on_every_shard_and_an_owners_predicate(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    ids = [f"woken-{i}" for i in range(24)]
    assert len({bucket_of(eid) for eid in ids}) > 12
    for eid in ids:
        await insert(pool, eid, "suspended")
        await pool.execute("UPDATE executions SET admitted_by = 'token-a' "
                           "WHERE execution_id = $1 AND bucket = fencepost_bucket($1)", eid)
        assert not (await state(pool, eid))["due"]
        assert await store.operator.request_wake(eid, owner="token-b") == "not_found"
        assert not (await state(pool, eid))["due"], "a foreign owner's wake changed the row"
        assert await store.operator.request_wake(eid, owner="token-a") == "requested"
        assert (await state(pool, eid))["due"] is True
        assert (await event_kinds(pool, eid))[-1] == "wake_requested"
    await insert(pool, "ended", "suspended")
    await pool.execute("UPDATE executions SET status = 'completed', outcome = '{}' "
                       "WHERE execution_id = 'ended' AND bucket = fencepost_bucket('ended')")
    assert await store.operator.request_wake("ended") == "ignored"
    assert await store.operator.request_wake("nobody") == "not_found"


async def test_a_cancel_reaches_a_tree_on_both_nodes(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    child, root = await on_other_nodes(pool, "tree")
    grandchild = "tree-grandchild-0"
    for i in range(100):
        grandchild = f"tree-grandchild-{i}"
        if await node(pool, grandchild) == await node(pool, root):
            break
    await insert(pool, root, "suspended")
    await insert(pool, child, "running", parent=root)      # held: cleans up, keeps running
    await insert(pool, grandchild, "admitted", token=0, parent=child)  # never ran: ends now
    await insert(pool, "bystander", "suspended")
    assert await store.operator.request_cancel(root, "op") == ("requested", "suspended")
    assert (await state(pool, root))["due"] is True  # its cleanup delivery is due now
    assert (await state(pool, child))["status"] == "running"
    assert (await state(pool, grandchild))["status"] == "cancelled"
    assert await pool.fetchval(
        "SELECT count(*) FROM executions WHERE cancel_requested_by = 'op'") == 3
    assert (await state(pool, "bystander"))["status"] == "suspended"
    assert "cancel_requested" in await event_kinds(pool, child)
    assert (await event_kinds(pool, grandchild))[-2:] == ["cancel_requested", "cancelled"]
    # Terminate ends the rest at once; a second request finds nothing to do.
    assert await store.operator.terminate(root, "op") == ("cancelled", "cancelled")
    for eid in (root, child, grandchild):
        assert (await state(pool, eid))["status"] == "cancelled", eid
    assert await store.operator.request_cancel(root, "op") == ("terminal", "cancelled")
    assert await store.operator.request_cancel("nobody", "op") == ("not_found", None)


async def test_a_cancelled_child_wakes_its_parent_on_the_other_node(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    child, parent = await on_other_nodes(pool, "waiting")
    await insert(pool, parent, "suspended")
    await insert(pool, child, "admitted", token=0, parent=parent)
    assert not (await state(pool, parent))["due"]
    assert await store.operator.request_cancel(child, "op") == ("cancelled", "cancelled")
    assert (await state(pool, parent))["due"] is True
    assert (await state(pool, parent))["status"] == "suspended"


async def test_an_effect_parked_in_doubt_is_fenced_and_resolved_on_its_shard(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    ids = [f"charged-{i}" for i in range(12)]
    assert len({await node(pool, eid) for eid in ids}) == 2
    for eid in ids:
        await insert(pool, eid, "running", token=2)
        with pytest.raises(LeaseLost):
            await store.effects.begin_effect(lease(eid, 1), "charge",
                                             idempotency_key=f"{eid}:charge",
                                             function_name="remote_charge")
        attempt = await store.effects.begin_effect(lease(eid, 2), "charge",
                                                   idempotency_key=f"{eid}:charge",
                                                   function_name="remote_charge")
        assert (attempt.status, attempt.fresh) == ("started", True)
        await store.effects.retry_effect(lease(eid, 2), "charge")
        with pytest.raises(LeaseLost):
            await store.effects.park_outcome_unknown(lease(eid, 1), "charge")
        assert await store.effects.park_outcome_unknown(lease(eid, 2), "charge") == "parked"
        assert await store.operator.resolve_step(eid, "charge", "succeed", by="op",
                                                 result={"paid": eid}) == ("resolved",
                                                                           "admitted")
        assert (await state(pool, eid))["due"] is True
        steps = (await store.history.steps([eid]))[eid]
        assert steps["charge"].value == {"paid": eid}
        assert await pool.fetchval(
            "SELECT count(*) FROM effects WHERE execution_id = $1 "
            "AND bucket = fencepost_bucket($1)", eid) == 0
        assert await event_kinds(pool, eid) == [
            "fenced_write_rejected", "effect_started", "effect_attempted",
            "fenced_write_rejected", "parked", "resolved"]


async def test_a_poison_execution_is_resumed_on_its_shard(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    ids = [f"poisoned-{i}" for i in range(12)]
    for eid in ids:
        await insert(pool, eid, "parked")
        await pool.execute("UPDATE executions SET parked_reason = 'poison', "
                           "unacknowledged_deliveries = 3 "
                           "WHERE execution_id = $1 AND bucket = fencepost_bucket($1)", eid)
        assert await store.operator.resume(eid, "op") == ("resumed", "admitted")
        row = await state(pool, eid)
        assert (row["status"], row["due"], row["unacknowledged_deliveries"]) == (
            "admitted", True, 3)
        assert await store.operator.resume(eid, "op") == ("not_parked", "admitted")
