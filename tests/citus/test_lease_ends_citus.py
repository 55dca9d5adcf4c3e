"""Leases and executions that end without an acknowledgement, on Citus: a
holder's release, the reaper and the sweep of interrupted executions, shard
by shard (Leases.release, reap_expired, sweep_interrupted). Each runs on the
node that owns the shard (app/store/on_shard.py), ends what it finds in every
shard, and a child it ends wakes its parent in the same transaction, also
when the parent's row is on another node."""

from __future__ import annotations

import asyncpg
import pytest

from app.reaper import LeaseReaper
from app.store import ExecutionStore
from app.store.buckets import bucket_of
from app.store.types import Lease, LeaseLost

pytestmark = pytest.mark.citus


async def _insert(conn: asyncpg.Connection, eid: str, status: str, *, token: int = 1,
                  expired: bool = False, parent: str | None = None,
                  cancelled: bool = False) -> None:
    """A row as the runtime leaves it: running with a lease (expired or
    not), or unheld (`status`), a child of `parent`, a cancel requested."""
    await conn.execute(
        "INSERT INTO executions (execution_id, bucket, workflow_id, params, context, status, "
        "token, lease_owner, lease_expires_at, ever_suspended, parent_execution_id, "
        "parent_step_key, cancel_requested_at) "
        "VALUES ($1, fencepost_bucket($1), 'wf', 'null', '{}', $2, $3, "
        "CASE WHEN $2 = 'running' THEN 'w' END, "
        "CASE WHEN $2 = 'running' THEN now() + CASE WHEN $4 THEN interval '-1 minute' "
        "ELSE interval '1 hour' END END, $2 = 'suspended', $5::text, "
        "CASE WHEN $5::text IS NOT NULL THEN 'child' END, CASE WHEN $6 THEN now() END)",
        eid, status, token, expired, parent, cancelled)


async def _node(conn: asyncpg.Connection, eid: str) -> int:
    port: int = await conn.fetchval(
        "SELECT nodeport FROM pg_dist_shard_placement "
        "WHERE shardid = get_shard_id_for_distribution_column('executions', $1::smallint)",
        bucket_of(eid))
    return port


async def _on_other_nodes(conn: asyncpg.Connection, prefix: str) -> tuple[str, str]:
    """A child's ID and its parent's, whose rows are on different nodes."""
    child = f"{prefix}-child"
    for i in range(100):
        parent = f"{prefix}-parent-{i}"
        if await _node(conn, parent) != await _node(conn, child):
            return child, parent
    raise AssertionError("no two IDs on different nodes")


async def _row(conn: asyncpg.Connection, eid: str) -> asyncpg.Record:
    row: asyncpg.Record = await conn.fetchrow(
        "SELECT status, token, unacknowledged_deliveries, lease_owner, due_at <= now() AS due "
        "FROM executions WHERE execution_id = $1 AND bucket = fencepost_bucket($1)", eid)
    return row


async def test_the_reaper_ends_expired_leases_in_every_shard(
        database_url: str, store: ExecutionStore) -> None:
    ids = [f"expired-{i}" for i in range(40)]
    assert len({bucket_of(i) for i in ids}) > 20
    conn = await asyncpg.connect(database_url)
    try:
        for eid in ids:
            await _insert(conn, eid, "running", expired=True)
        await _insert(conn, "still-held", "running")
        result = await LeaseReaper(store, batch=5).run_once()
        assert sorted(result.execution_ids) == sorted(ids)
        for eid in ids:
            row = await _row(conn, eid)
            assert (row["status"], row["unacknowledged_deliveries"], row["lease_owner"]) == (
                "admitted", 1, None), eid
        assert (await _row(conn, "still-held"))["status"] == "running"
        assert await conn.fetchval(
            "SELECT count(*) FROM execution_events WHERE kind = 'lease_expired'") == len(ids)
        assert (await store.leases.reap_expired()).expired == 0
    finally:
        await conn.close()


async def test_a_child_the_reaper_cancels_wakes_its_parent_on_another_node(
        database_url: str, store: ExecutionStore) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        child, parent = await _on_other_nodes(conn, "reaped")
        await _insert(conn, parent, "suspended")
        # Its lease expired after a cancel request: the reaper ends it cancelled.
        await _insert(conn, child, "running", expired=True, parent=parent, cancelled=True)
        assert not (await _row(conn, parent))["due"]
        result = await store.leases.reap_expired()
        assert result.execution_ids == [child]
        assert (await _row(conn, child))["status"] == "cancelled"
        assert (await _row(conn, parent))["due"] is True
    finally:
        await conn.close()


async def test_the_sweep_ends_cancelled_executions_in_every_shard_and_wakes_parents(
        database_url: str, store: ExecutionStore) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        child, parent = await _on_other_nodes(conn, "swept")
        await _insert(conn, parent, "suspended")
        # Never ran (token 0) and cancelled: no cleanup to run, the sweep ends it.
        await _insert(conn, child, "admitted", token=0, parent=parent, cancelled=True)
        others = [f"swept-{i}" for i in range(30)]
        for eid in others:
            await _insert(conn, eid, "admitted", token=0, cancelled=True)
        await _insert(conn, "not-cancelled", "admitted", token=0)
        swept = await store.leases.sweep_interrupted(500)
        assert sorted(swept) == sorted([child, *others])
        for eid in [child, *others]:
            assert (await _row(conn, eid))["status"] == "cancelled", eid
        assert (await _row(conn, "not-cancelled"))["status"] == "admitted"
        assert (await _row(conn, parent))["due"] is True
        assert await store.leases.sweep_interrupted(500) == []
    finally:
        await conn.close()


async def test_a_release_is_fenced_and_settled_on_the_shard(
        database_url: str, store: ExecutionStore) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await _insert(conn, "released", "running", token=2)
        with pytest.raises(LeaseLost):
            await store.leases.release(Lease("released", 1, None, "w"))
        assert (await _row(conn, "released"))["status"] == "running"
        assert await store.leases.release(
            Lease("released", 2, None, "w"), reason={"name": "Retry", "message": "later"}) is None
        row = await _row(conn, "released")
        assert (row["status"], row["unacknowledged_deliveries"], row["lease_owner"]) == (
            "admitted", 1, None)
        kinds = [r["kind"] for r in await conn.fetch(
            "SELECT kind FROM execution_events WHERE execution_id = $1 "
            "AND bucket = fencepost_bucket($1) ORDER BY event_id", "released")]
        assert kinds == ["fenced_write_rejected", "released"]
        assert await conn.fetchval(
            "SELECT error->>'message' FROM attempt_history WHERE execution_id = $1 "
            "AND bucket = fencepost_bucket($1)", "released") == "later"

        # Released after a cancel request: settled cancelled, its parent woken.
        child, parent = await _on_other_nodes(conn, "released")
        await _insert(conn, parent, "suspended")
        await _insert(conn, child, "running", parent=parent, cancelled=True)
        assert await store.leases.release(Lease(child, 1, None, "w")) == "cancelled"
        assert (await _row(conn, child))["status"] == "cancelled"
        assert (await _row(conn, parent))["due"] is True
    finally:
        await conn.close()
