"""Retention deletes terminal executions past the age, with everything that
hangs off them, and never anything unfinished."""

from app.retention import RetentionPruner
from app.store import ExecutionStore


async def _finish(store: ExecutionStore, execution_id: str, status: str) -> None:
    await store.admissions.admit(workflow_id="w", params={}, execution_id=execution_id)
    # Signalled before the claim, so the claim covers its wake: a suspended
    # execution is left with nothing due.
    await store.signals.send_signal(execution_id, "sig", {"x": 1})
    [d] = await store.leases.claim_due(1, 30, "w1")
    assert d.lease.execution_id == execution_id
    await store.steps.write_step(d.lease, "s", value=1)
    await store.steps.record_late_observation(d.lease, "s", value=2)
    if status == "suspended":
        await store.leases.acknowledge(d.lease, "suspended")
    elif status == "completed":
        await store.leases.acknowledge(d.lease, "completed", result=1)
    else:
        await store.leases.acknowledge(d.lease, "failed", error={"name": "E", "message": "m"})


async def _age(pool, execution_id: str, days: int) -> None:
    await pool.execute(
        "UPDATE executions SET updated_at = now() - make_interval(days => $2), "
        "admitted_at = now() - make_interval(days => $2) WHERE execution_id = $1",
        execution_id, days,
    )


async def _count(pool, table: str, execution_id: str) -> int:
    return await pool.fetchval(f"SELECT count(*) FROM {table} WHERE execution_id = $1",
                               execution_id)


async def test_retention_deletes_only_terminal_rows_past_the_age(pool, settings):
    store = ExecutionStore.from_settings(pool, settings)
    await _finish(store, "old-done", "completed")
    await _finish(store, "old-failed", "failed")
    await _finish(store, "old-waiting", "suspended")
    await _finish(store, "new-done", "completed")
    await store.admissions.admit(workflow_id="w", params={}, execution_id="old-admitted")
    for eid in ("old-done", "old-failed", "old-waiting", "old-admitted"):
        await _age(pool, eid, 30)

    pruner = RetentionPruner(store, retention_seconds=14 * 86400, batch=1)
    deleted = await pruner.run_once()  # batches of one: the loop goes on until short
    left = [r["execution_id"] for r in await pool.fetch("SELECT execution_id FROM executions")]
    assert deleted == 2, left

    for gone in ("old-done", "old-failed"):
        assert await store.history.get(gone) is None
        for table in ("execution_steps", "execution_events", "signals", "late_observations"):
            assert await _count(pool, table, gone) == 0, (gone, table)
    for kept in ("old-waiting", "old-admitted", "new-done"):
        assert await store.history.get(kept) is not None
        assert await _count(pool, "execution_events", kept) > 0
    assert await _count(pool, "execution_steps", "old-waiting") == 1
    # An ID is never reused: a deleted one is retired (a tombstone keeps it
    # and its last token); one still recorded is taken.
    retired = await store.admissions.admit(workflow_id="w", params={}, execution_id="old-done")
    assert (type(retired).__name__, retired.status) == ("Conflict", "retired")
    assert await pool.fetchval(
        "SELECT last_token FROM retired_executions WHERE execution_id = 'old-done'") >= 1
    taken = await store.admissions.admit(workflow_id="w", params={}, execution_id="new-done")
    assert (type(taken).__name__, taken.status) == ("Conflict", "completed")


async def test_retention_with_nothing_to_do_deletes_nothing(pool, settings):
    store = ExecutionStore.from_settings(pool, settings)
    await _finish(store, "fresh", "completed")
    assert await RetentionPruner(store, retention_seconds=3600).run_once() == 0
    assert await store.history.get("fresh") is not None
