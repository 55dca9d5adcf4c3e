"""Retention on Citus, shard by shard (History.prune_terminal): ended
executions past retention are deleted in every shard on the node that owns
it, each leaving its tombstone there, so its ID stays taken."""

from __future__ import annotations

import asyncpg
import pytest

from app.retention import RetentionPruner
from app.store import ExecutionStore
from app.store.buckets import bucket_of

pytestmark = pytest.mark.citus


async def test_ended_executions_past_retention_are_retired_in_every_shard(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    old = [f"old-{i}" for i in range(40)]
    assert len({bucket_of(i) for i in old}) > 20
    for eid in [*old, "recent", "old-but-open"]:
        await pool.execute(
            "INSERT INTO executions (execution_id, bucket, workflow_id, params, context, "
            "status, outcome, token, updated_at) VALUES ($1, fencepost_bucket($1), 'wf', "
            "'null', '{}', $2, CASE WHEN $2 = 'completed' THEN '{\"result\": 1}'::jsonb END, "
            "3, now() - CASE WHEN $1 = 'recent' THEN interval '0' ELSE interval '30 days' END)",
            eid, "admitted" if eid == "old-but-open" else "completed")
    await pool.execute(
        "INSERT INTO execution_events (execution_id, bucket, kind, token, seq) "
        "SELECT x, fencepost_bucket(x), 'claimed', 3, 1000 FROM unnest($1::text[]) x", old)
    pruned = await RetentionPruner(store, retention_seconds=14 * 86400, batch=5).run_once()
    assert pruned == len(old)
    left = {r["execution_id"] for r in await pool.fetch("SELECT execution_id FROM executions")}
    assert left == {"recent", "old-but-open"}
    tombs = await pool.fetch("SELECT execution_id, last_token FROM retired_executions")
    assert sorted((r["execution_id"], r["last_token"]) for r in tombs) == sorted(
        (eid, 3) for eid in old)
    assert await pool.fetchval("SELECT count(*) FROM execution_events") == 0
    assert await store.history.prune_terminal(14 * 86400, 100) == 0
