"""Rows of executions written directly on a Citus cluster, as the runtime
leaves them, and where they are (which node holds an execution's shard)."""

from __future__ import annotations

from datetime import UTC, datetime

import asyncpg

from app.store.buckets import bucket_of
from app.store.types import Lease

NEVER = datetime(2100, 1, 1, tzinfo=UTC)


def lease(eid: str, token: int) -> Lease:
    """The lease of token `token` on `eid`, as its holder has it (the fence
    checks the token, not the expiry the holder believes)."""
    return Lease(eid, token, NEVER, "w")


async def event_kinds(pool: asyncpg.Pool, eid: str) -> list[str]:
    """The kinds of `eid`'s events, in the history's order (`seq`)."""
    return [r["kind"] for r in await pool.fetch(
        "SELECT kind FROM execution_events WHERE execution_id = $1 "
        "AND bucket = fencepost_bucket($1) ORDER BY seq", eid)]


async def insert(pool: asyncpg.Pool, eid: str, status: str, *, token: int = 1,
                 expired: bool = False, parent: str | None = None,
                 cancelled: bool = False) -> None:
    """A row as the runtime leaves it: running with a lease (expired or
    not), or unheld (`status`), a child of `parent`, a cancel requested."""
    await pool.execute(
        "INSERT INTO executions (execution_id, bucket, workflow_id, params, context, status, "
        "token, lease_owner, lease_expires_at, ever_suspended, parent_execution_id, "
        "parent_step_key, cancel_requested_at) "
        "VALUES ($1, fencepost_bucket($1), 'wf', 'null', '{}', $2, $3, "
        "CASE WHEN $2 = 'running' THEN 'w' END, "
        "CASE WHEN $2 = 'running' THEN now() + CASE WHEN $4 THEN interval '-1 minute' "
        "ELSE interval '1 hour' END END, $2 = 'suspended', $5::text, "
        "CASE WHEN $5::text IS NOT NULL THEN 'child' END, CASE WHEN $6 THEN now() END)",
        eid, status, token, expired, parent, cancelled)


async def node(pool: asyncpg.Pool, eid: str) -> int:
    port: int = await pool.fetchval(
        "SELECT nodeport FROM pg_dist_shard_placement "
        "WHERE shardid = get_shard_id_for_distribution_column('executions', $1::smallint)",
        bucket_of(eid))
    return port


async def on_other_nodes(pool: asyncpg.Pool, prefix: str) -> tuple[str, str]:
    """A child's ID and its parent's, whose rows are on different nodes."""
    child = f"{prefix}-child"
    for i in range(100):
        parent = f"{prefix}-parent-{i}"
        if await node(pool, parent) != await node(pool, child):
            return child, parent
    raise AssertionError("no two IDs on different nodes")


async def state(pool: asyncpg.Pool, eid: str) -> asyncpg.Record:
    row: asyncpg.Record = await pool.fetchrow(
        "SELECT status, token, unacknowledged_deliveries, lease_owner, due_at <= now() AS due "
        "FROM executions WHERE execution_id = $1 AND bucket = fencepost_bucket($1)", eid)
    return row
