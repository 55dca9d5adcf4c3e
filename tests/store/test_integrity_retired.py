"""Issue 10, item 9: an execution ID is never reused.

Retention leaves a tombstone (ID, last token) per deleted execution in the
statement that deletes it; admission (and start_child) refuse a retired ID,
and the API's 409 says the ID was retired."""

from __future__ import annotations

import asyncio

import asyncpg

from app.store import Admitted, ChildExecution, Conflict, ExecutionStore
from tests.http.conftest import api_settings
from tests.support.asgi import asgi_client
from tests.support.responses import assert_error
from tests.support.waiting import wait_until


async def finish(store: ExecutionStore, clock, execution_id: str, *, takeovers: int = 0) -> int:
    """Admit, claim (taking over `takeovers` expired leases first), complete;
    returns the last token."""
    result = await store.admissions.admit(workflow_id="ret-wf", params={}, execution_id=execution_id)
    assert isinstance(result, Admitted), result
    for _ in range(takeovers + 1):
        [d] = await store.leases.claim_due(1, 30.0, "w", ["ret-wf"])
        if _ < takeovers:
            await clock.expire_lease(execution_id)
    await store.steps.write_step(d.lease, "s", value=1)
    await store.leases.acknowledge(d.lease, "completed", result={"ok": True})
    return d.lease.token


async def age(pool: asyncpg.Pool, execution_id: str, days: int = 30) -> None:
    await pool.execute(
        "UPDATE executions SET updated_at = now() - make_interval(days => $2) "
        "WHERE execution_id = $1", execution_id, days)


async def tombstone(pool: asyncpg.Pool, execution_id: str) -> dict | None:
    row = await pool.fetchrow(
        "SELECT execution_id, last_token, workflow_id, retired_at FROM retired_executions "
        "WHERE execution_id = $1", execution_id)
    return dict(row) if row is not None else None


async def test_a_pruned_id_is_retired_with_its_last_token_and_refused(
        store: ExecutionStore, pool: asyncpg.Pool, clock):
    last = await finish(store, clock, "ret-1", takeovers=2)
    assert last == 3
    await finish(store, clock, "ret-young")
    await age(pool, "ret-1")

    assert await store.history.prune_terminal(14 * 86400, 100) == 1

    assert await store.history.get("ret-1") is None
    stone = await tombstone(pool, "ret-1")
    assert stone is not None and (stone["last_token"], stone["workflow_id"]) == (last, "ret-wf")
    assert await tombstone(pool, "ret-young") is None  # not pruned, not retired
    again = await store.admissions.admit(workflow_id="ret-wf", params={}, execution_id="ret-1")
    assert again == Conflict("ret-1", "retired", "ret-wf")
    assert await store.history.get("ret-1") is None  # nothing was admitted
    assert await pool.fetchval(
        "SELECT count(*) FROM execution_events WHERE execution_id = 'ret-1'") == 0


async def test_the_http_409_for_a_retired_id_says_it_was_retired(
        store: ExecutionStore, pool: asyncpg.Pool, clock, settings):
    await finish(store, clock, "ret-http")
    await age(pool, "ret-http")
    assert await store.history.prune_terminal(14 * 86400, 100) == 1

    async with asgi_client(api_settings(settings)) as client:
        r = await client.post("/v1/executions",
                              json={"workflowId": "ret-wf", "executionId": "ret-http",
                                    "params": {}})
        error = assert_error(r, 409, "EXECUTION_ID_CONFLICT")
        assert "retired" in error["message"] and "retention" in error["message"], error
        assert error.get("status", "retired") == "retired"
        # An ID that exists still gets the ordinary answer.
        await finish(store, clock, "ret-live")
        r = await client.post("/v1/executions",
                              json={"workflowId": "ret-wf", "executionId": "ret-live",
                                    "params": {}})
        assert "retired" not in assert_error(r, 409, "EXECUTION_ID_CONFLICT")["message"]


async def test_a_retired_id_cannot_become_a_child(store: ExecutionStore, pool, clock):
    await finish(store, clock, "ret-kid")
    await age(pool, "ret-kid")
    assert await store.history.prune_terminal(14 * 86400, 100) == 1
    await store.admissions.admit(workflow_id="ret-parent", params={}, execution_id="ret-par")
    [d] = await store.leases.claim_due(1, 30.0, "w", ["ret-parent"])

    answer = await store.compose.start_child(d.lease, "c", workflow_id="ret-wf", params={},
                                     child_id="ret-kid")
    assert answer == ("conflict", ChildExecution("ret-kid", "retired", "ret-wf"))
    assert await store.history.get("ret-kid") is None


async def test_admission_racing_the_prune_of_the_same_id_is_refused(
        store: ExecutionStore, pool: asyncpg.Pool, clock, open_pool):
    """The prune's transaction has deleted the row and written the tombstone
    but not committed when the admission of that ID arrives (forced: the
    prune runs in a transaction this test holds open). The admission must not
    wait for the delete and then insert: it answers from what it saw, and once
    the prune has committed the ID is retired."""
    await finish(store, clock, "ret-race")
    await age(pool, "ret-race")
    other = await open_pool()
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        assert await ExecutionStore(conn).history.prune_terminal(14 * 86400, 100) == 1
        admission = asyncio.create_task(
            ExecutionStore(other).admissions.admit(workflow_id="ret-wf", params={},
                                        execution_id="ret-race"))
        # Done, or waiting behind the uncommitted delete (the bug).
        async def done_or_waiting() -> bool:
            return admission.done() or bool(await store.pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"))

        await wait_until(done_or_waiting, timeout=10, interval=0.01,
                         what="the admission done or waiting for a lock")
        await tx.commit()
    first = await admission
    assert isinstance(first, Conflict), first
    assert first.status in ("completed", "retired"), first
    assert await store.history.get("ret-race") is None
    assert await store.admissions.admit(workflow_id="ret-wf", params={}, execution_id="ret-race") == \
        Conflict("ret-race", "retired", "ret-wf")
