"""Issue 13 item 3: bulk operations. The store's batches and the HTTP API
with in-process workers; and a bulk redrive of 500 failed executions under
real worker processes with one SIGKILLed in the middle."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio

from app.store import ExecutionStore
from tests.support.admission import admit
from tests.support.harness import (
    Harness,
    opened,
)
from tests.support.history import events_of
from tests.support.responses import assert_error, post_raw
from tests.support.waiting import wait_status, wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.citus]


async def operation(api: httpx.AsyncClient, op_id: str) -> dict:
    r = await api.get(f"/v1/operations/{op_id}")
    assert r.status_code == 200, r.text
    return r.json()


async def finished(api: httpx.AsyncClient, op_id: str, timeout: float = 30) -> dict:
    async def check():
        op = await operation(api, op_id)
        return op if op["status"] != "running" else None
    return await wait_until(check, timeout=timeout, what=f"operation {op_id} finished")


async def test_a_bulk_cancel_reaches_every_matched_execution_and_reports_the_rest(
        store: ExecutionStore, workers, api: httpx.AsyncClient) -> None:
    await workers.start()
    waiting = [await admit(store, "rd-approval", f"bulk-{i}") for i in range(20)]
    for eid in waiting:
        await wait_status(store, eid, "suspended")
    done = await admit(store, "rd-order", "bulk-done")
    await wait_status(store, done, "completed")

    dry = await api.post("/v1/operations", json={
        "action": "cancel", "filter": {"workflowId": "rd-approval"}, "dryRun": True})
    assert dry.status_code == 200, dry.text
    assert dry.json()["matched"] == 20 and len(dry.json()["sample"]) == 10
    assert await store.pool.fetchval("SELECT count(*) FROM operations") == 0

    r = await api.post("/v1/operations", json={
        "action": "cancel", "filter": {"executionIds": [*waiting, done, "nobody"]},
        "reason": "incident 42", "by": "alice"})
    assert r.status_code == 202, r.text
    op = r.json()
    assert op["matched"] == 21 and op["status"] == "running", op  # "nobody" matches nothing
    assert r.headers["location"] == f"/v1/operations/{op['operationId']}"
    op = await finished(api, op["operationId"])
    assert (op["status"], op["done"], op["failed"], op["pending"]) == ("completed", 20, 1, 0), op
    assert op["failures"] == [{"executionId": done, "code": "EXECUTION_TERMINAL",
                               "message": "already ended (completed)"}]
    for eid in waiting:
        rec = await wait_status(store, eid, "cancelled")
        assert rec["outcome"]["error"]["name"] == "Cancelled"
        [requested] = await events_of(store, eid, "cancel_requested")
        assert requested["detail"]["by"] == f"alice (operation {op['operationId']})"


async def test_a_cancelled_operation_acts_on_nothing_more(
        store: ExecutionStore, workers, api: httpx.AsyncClient) -> None:
    eids = [await admit(store, "rd-order", f"stop-{i}") for i in range(5)]
    r = await api.post("/v1/operations", json={"action": "cancel",
                                               "filter": {"workflowId": "rd-order"}})
    op_id = r.json()["operationId"]
    stopped = await api.post(f"/v1/operations/{op_id}/cancel", json={"by": "bob"})
    assert stopped.status_code == 202 and stopped.json()["status"] == "cancelled", stopped.text
    assert_error(await api.post(f"/v1/operations/{op_id}/cancel"), 409, "OPERATION_FINISHED")
    await workers.start()
    for eid in eids:
        await wait_status(store, eid, "completed")  # ran normally: nobody cancelled them
    op = await operation(api, op_id)
    assert (op["done"], op["pending"]) == (0, 5), op


async def test_bulk_requests_are_checked_and_change_nothing(
        store: ExecutionStore, api: httpx.AsyncClient) -> None:
    await admit(store, "rd-order", "untouched")
    for body in ({"action": "cancel", "filter": {}},
                 {"action": "explode", "filter": {"workflowId": "rd-order"}},
                 {"action": "cancel", "filter": {"status": "sleeping"}},
                 {"action": "cancel", "filter": {"admittedFrom": "2026-01-01T00:00:00"}},
                 {"action": "cancel", "filter": {"executionIds": ["not ok"]}},
                 {"action": "resolve", "filter": {"workflowId": "rd-order"},
                  "resolution": {"action": "fail"}},
                 {"action": "cancel", "filter": {"workflowId": "rd-order"}, "extra": 1}):
        assert_error(await api.post("/v1/operations", json=body), 422, "INVALID_REQUEST")
    assert_error(await api.get("/v1/operations/op-0000000000000000"), 404, "OPERATION_NOT_FOUND")
    assert_error(await api.get("/v1/operations/whatever"), 404, "OPERATION_NOT_FOUND")
    assert await store.pool.fetchval("SELECT count(*) FROM operations") == 0
    assert (await store.history.get("untouched"))["status"] == "admitted"


# A resolution's result jsonb cannot hold exactly: a float written with an
# exponent (jsonb would give it back as an integer), at any depth.
UNSTORABLE_RESULTS = {
    "large-float": b"1e16",
    "negative-large-float": b"-2.5e20",
    "nested-large-float": b'{"a":[1,{"b":1e300}]}',
}


@pytest.mark.parametrize("result", list(UNSTORABLE_RESULTS.values()),
                         ids=list(UNSTORABLE_RESULTS))
@pytest.mark.parametrize("action", ["succeed", "retry"])
async def test_a_resolution_result_that_cannot_be_stored_exactly_is_refused_and_stores_nothing(
        store: ExecutionStore, api: httpx.AsyncClient, action: str, result: bytes) -> None:
    await admit(store, "rd-order", "parked-later")
    body = (b'{"action":"resolve","filter":{"workflowId":"rd-order"},"resolution":'
            b'{"action":"' + action.encode() + b'","result":' + result + b"}}")
    err = assert_error(await post_raw(api, body, "/v1/operations"), 422,
                       "INVALID_EXECUTION_EVENT")
    assert "resolution.result" in err["message"], err
    assert await store.pool.fetchval("SELECT count(*) FROM operations") == 0
    assert await store.pool.fetchval("SELECT count(*) FROM operation_items") == 0
    # Stored exactly (a float without an exponent, an integer): accepted.
    r = await api.post("/v1/operations", json={
        "action": "resolve", "filter": {"workflowId": "rd-order"},
        "resolution": {"action": "succeed", "result": [1.5, 10**16, -0.0]}})
    assert r.status_code == 202, r.text


# Times whose offset puts them before year 1 or after year 9999 in UTC (a
# date-time in the schema bounds its year as written).
BEFORE_YEAR_1 = "0001-01-01T00:00:00+05:00"
AFTER_9999 = "9999-12-31T23:30:00-01:00"


async def test_a_filter_time_beyond_the_years_utc_holds_reads_as_the_nearest_it_holds(
        store: ExecutionStore, api: httpx.AsyncClient) -> None:
    eid = await admit(store, "rd-order", "any-time")
    for times, matched in (({"admittedFrom": BEFORE_YEAR_1}, 1),
                           ({"admittedTo": AFTER_9999}, 1),
                           ({"admittedFrom": BEFORE_YEAR_1, "admittedTo": AFTER_9999}, 1),
                           ({"admittedFrom": AFTER_9999}, 0),
                           ({"admittedTo": BEFORE_YEAR_1}, 0)):
        body = {"action": "cancel", "filter": {"workflowId": "rd-order", **times}}
        dry = await api.post("/v1/operations", json={**body, "dryRun": True})
        assert dry.status_code == 200, (times, dry.text)
        assert dry.json()["matched"] == matched, (times, dry.json())
        if matched == 0:
            continue
        r = await api.post("/v1/operations", json={**body, "reason": "all of time"})
        assert r.status_code == 202, (times, r.text)
        op = r.json()
        assert op["matched"] == 1 and set(op["filter"]) == {"workflowId", *times}, op
    # The operations are not carried out here (no batch runs): nothing changed.
    assert (await store.history.get(eid))["status"] == "admitted"


async def test_bulk_resume_and_resolve(store: ExecutionStore, api: httpx.AsyncClient) -> None:
    poison = await admit(store, "rd-order", "poison-1")
    [d] = await store.leases.claim_due(1, 30, "w")
    await store.pool.execute("UPDATE executions SET unacknowledged_deliveries = 1000 "
                             "WHERE execution_id = $1", poison)
    await store.leases.release(d.lease)
    unknown = await admit(store, "rd-order", "unknown-1")
    [d] = await store.leases.claim_due(1, 30, "w")
    await store.effects.begin_effect(d.lease, "charge", idempotency_key="k", function_name="charge")
    await store.effects.park_outcome_unknown(d.lease, "charge")

    # Resume matches both parked ones and fails on the one parked for neither
    # poison nor nondeterminism (an outcome in doubt);
    # resolve then matches only the one still parked.
    for action, extra, outcome in (
            ("resume", {}, (1, 1)),
            ("resolve", {"resolution": {"action": "succeed", "result": {"charge": "ch_1"}}},
             (1, 0))):
        r = await api.post("/v1/operations", json={
            "action": action, "filter": {"status": "parked"}, **extra})
        assert r.status_code == 202, r.text
        while await store.operations.run_operation_batch(10):
            pass
        op = await operation(api, r.json()["operationId"])
        assert (op["status"], op["done"], op["failed"]) == ("completed", *outcome), op
    assert (await store.history.get(poison))["status"] == "admitted"
    assert (await store.history.steps([unknown]))[unknown]["charge"].value == {"charge": "ch_1"}


# ------------------------------------------------------- real worker processes


class BulkHarness(Harness):
    flows_module = "tests.redrive.flows"
    worker_prefix = "bulk-worker"


@pytest_asyncio.fixture
async def harness(database_url, tmp_path, request) -> AsyncIterator[Harness]:
    async with opened(BulkHarness(database_url, tmp_path / "h"), request) as h:
        yield h


@pytest.mark.timeout(240)
async def test_a_bulk_redrive_of_500_failed_executions_survives_a_sigkilled_worker(
        harness: Harness) -> None:
    h = harness
    n = 500
    a = await h.start_worker("A", concurrency=16)
    b = await h.start_worker("B", concurrency=16)
    for i in range(n):
        await h.store.admissions.admit(workflow_id="rd-bulk", params={}, execution_id=f"b-{i:03d}")
    eids = [f"b-{i:03d}" for i in range(n)]
    await h.wait_for(lambda: h.all_terminal(eids), timeout=120, what="all 500 failed")
    assert set((await h.statuses(eids)).values()) == {"failed"}

    (h.mark_dir / "rd-fixed").write_text("the cause is fixed")
    created = await h.store.operations.create_operation(
        "redrive", {"workflowId": "rd-bulk", "status": "failed"}, by="ops",
        reason="downstream back")
    op_id = created["operation_id"]
    assert created["matched"] == n

    async def some_done() -> bool:
        op = await h.store.operations.get_operation(op_id)
        return op["done"] >= 50
    await h.wait_for(some_done, timeout=60, what="the operation under way")
    a.signal(signal.SIGKILL)
    mid = await h.store.operations.get_operation(op_id)
    print(f"worker A SIGKILLed with {mid['done']} of {n} items done")
    assert mid["done"] < n, "the operation finished before the kill: nothing was tested"

    async def complete() -> bool:
        op = await h.store.operations.get_operation(op_id)
        return op["status"] == "completed"
    await h.wait_for(complete, timeout=120, what="the operation completed")
    op = await h.store.operations.get_operation(op_id)
    assert (op["done"], op["failed"], op["pending"]) == (n, 0, 0), op
    await h.wait_for(lambda: h.all_terminal(eids), timeout=120, what="all 500 ended again")
    assert set((await h.statuses(eids)).values()) == {"completed"}
    # Every execution redriven exactly once.
    counts = await h.pool.fetch(
        "SELECT redrives, count(*) AS n FROM executions WHERE workflow_id = 'rd-bulk' "
        "GROUP BY redrives")
    assert [(r["redrives"], r["n"]) for r in counts] == [(1, n)]
    events = await h.pool.fetchval(
        "SELECT count(*) FROM execution_events WHERE kind = 'redriven'")
    assert events == n
    assert b.alive()
    await asyncio.sleep(0)
