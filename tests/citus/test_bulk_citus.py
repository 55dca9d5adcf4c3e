"""Bulk operations on Citus: a preview counts and samples over every shard,
and an operation created from a filter is stored and carried out, items on
both nodes (the matches are read before the operation is stored: a
transaction that read the distributed executions in parallel may not write
the operations reference tables; a batch spanning nodes commits with
two-phase commit, so the statements run on shards send no NOTIFY there)."""

from __future__ import annotations

import asyncpg
import pytest

from app.store import ExecutionStore
from tests.citus.rows import insert, node

pytestmark = pytest.mark.citus


async def test_a_bulk_cancel_previews_and_reaches_executions_on_both_nodes(
        pool: asyncpg.Pool, store: ExecutionStore) -> None:
    ids = [f"bulk-{i}" for i in range(10)]
    assert len({await node(pool, eid) for eid in ids}) == 2
    for eid in ids:
        await insert(pool, eid, "admitted", token=0)
    matched, sample = await store.operations.preview_operation({"workflowId": "wf"})
    assert (matched, sample) == (10, sorted(ids)[:len(sample)]) and sample, sample

    created = await store.operations.create_operation("cancel", {"workflowId": "wf"}, by="ops")
    assert created is not None and created["matched"] == 10
    while await store.operations.run_operation_batch(limit=4):
        pass
    record = await store.operations.get_operation(created["operation_id"])
    assert record is not None and record["status"] == "completed", record
    statuses = {r["status"] for r in await pool.fetch(
        "SELECT status FROM executions WHERE execution_id = ANY($1::text[])", ids)}
    assert statuses == {"cancelled"}
    # Over the limit: nothing stored.
    assert await store.operations.create_operation(
        "cancel", {"workflowId": "wf"}, by="ops", max_matched=5) is None
    assert await pool.fetchval("SELECT count(*) FROM operations") == 1
