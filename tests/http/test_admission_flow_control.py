"""POST /v1/executions with flow control: priority, a delayed start
(startAt / delaySeconds) and the concurrency key; the queue and key come
from the workflow's declaration unless the body names a key. The record
shows queue, concurrencyKey and priority."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
import pytest_asyncio

from app.queues import Queue
from app.registry import load_workflows
from app.sdk import WorkflowContext, workflow
from tests.http.conftest import api_settings
from tests.support.asgi import asgi_client
from tests.support.responses import assert_error, get_record

PAYMENTS = Queue("fc-payments", concurrency=2, per_key_concurrency=1)


@workflow("fc-charge", queue=PAYMENTS, concurrency_key="customer")
async def fc_charge(ctx: WorkflowContext, params) -> None:
    return None


def _key(params):
    if params.get("bad"):
        raise ValueError("no customer in these params")
    return params.get("customer")


@workflow("fc-keyed-by-function", queue="fc-named-only", concurrency_key=_key)
async def fc_keyed(ctx: WorkflowContext, params) -> None:
    return None


@workflow("fc-plain")
async def fc_plain(ctx: WorkflowContext, params) -> None:
    return None


@pytest_asyncio.fixture
async def fc_client(settings):
    async with asgi_client(api_settings(settings), load_workflows([__name__])) as c:
        yield c


async def admit(client, **body):
    r = await client.post("/v1/executions", json={"workflowId": "fc-plain", "params": {}, **body})
    assert r.status_code == 201, r.text
    return await get_record(client, r.json()["executionId"])


async def test_an_execution_is_on_its_workflows_queue_with_its_declared_key(fc_client) -> None:
    rec = await admit(fc_client, workflowId="fc-charge", executionId="c1",
                      params={"customer": "acme"})
    assert (rec["queue"], rec["concurrencyKey"], rec["priority"]) == ("fc-payments", "acme", 0)
    rec = await admit(fc_client, workflowId="fc-charge", executionId="c2",
                      params={"customer": 42})
    assert rec["concurrencyKey"] == "42"
    rec = await admit(fc_client, workflowId="fc-charge", executionId="c3", params={})
    assert rec["concurrencyKey"] is None
    rec = await admit(fc_client, executionId="p1")
    assert (rec["queue"], rec["concurrencyKey"], rec["priority"]) == ("default", None, 0)
    listed = (await fc_client.get("/v1/executions", params={"limit": 10})).json()["executions"]
    assert {e["executionId"]: (e["queue"], e["concurrencyKey"]) for e in listed} == {
        "c1": ("fc-payments", "acme"), "c2": ("fc-payments", "42"),
        "c3": ("fc-payments", None), "p1": ("default", None)}


async def test_the_body_key_wins_over_the_declared_one(fc_client) -> None:
    rec = await admit(fc_client, workflowId="fc-charge", params={"customer": "acme"},
                      concurrencyKey="tenant-7")
    assert rec["concurrencyKey"] == "tenant-7"
    rec = await admit(fc_client, workflowId="fc-keyed-by-function", params={"customer": "x"})
    assert (rec["queue"], rec["concurrencyKey"]) == ("fc-named-only", "x")
    rec = await admit(fc_client, workflowId="fc-keyed-by-function", params={"bad": True},
                      concurrencyKey="given")
    assert rec["concurrencyKey"] == "given"


@pytest.mark.parametrize("params", [{"bad": True}, {"customer": ["a", "list"]},
                                    {"customer": "k" * 201}])
async def test_a_key_the_declaration_cannot_make_admits_nothing(fc_client, rows, params) -> None:
    r = await fc_client.post("/v1/executions", json={"workflowId": "fc-keyed-by-function",
                                                     "params": params})
    error = assert_error(r, 422, "INVALID_CONCURRENCY_KEY")
    assert "fc-keyed-by-function" in error["message"] or "customer" in error["message"]
    assert "concurrencyKey" in error["message"]
    assert (await rows()).executions == 0


@pytest.mark.parametrize("body", [
    {"priority": 1001}, {"priority": -1001}, {"priority": 1.5}, {"priority": True},
    {"priority": "1"}, {"priority": None},
    {"delaySeconds": -1}, {"delaySeconds": 366 * 86400 + 1}, {"delaySeconds": "5"},
    {"delaySeconds": True},
    {"startAt": "2030-01-01T00:00:00"}, {"startAt": 1700000000}, {"startAt": "soon"},
    {"startAt": "2030-01-01T00:00:00Z", "delaySeconds": 5},
    {"concurrencyKey": ""}, {"concurrencyKey": "k" * 201}, {"concurrencyKey": 7},
])
async def test_bad_flow_control_fields_are_refused(fc_client, rows, body) -> None:
    r = await fc_client.post("/v1/executions",
                             json={"workflowId": "fc-plain", "params": {}, **body})
    assert_error(r, 422, "INVALID_REQUEST")
    assert (await rows()).executions == 0


async def test_a_key_postgres_cannot_store_is_refused(fc_client, rows) -> None:
    r = await fc_client.post("/v1/executions", json={"workflowId": "fc-plain", "params": {},
                                                     "concurrencyKey": "a\u0000b"})
    assert_error(r, 422, "INVALID_EXECUTION_EVENT")
    assert (await rows()).executions == 0


async def test_priority_is_recorded(fc_client) -> None:
    for p in (-1000, 0, 1000, 7.0):
        assert (await admit(fc_client, priority=p))["priority"] == int(p)


async def test_a_delayed_start_is_not_claimable_before_its_time(fc_client, store) -> None:
    later = await admit(fc_client, executionId="later", startAt="2099-01-01T12:00:00+02:00")
    assert datetime.fromisoformat(later["dueAt"]) == datetime.fromisoformat(
        "2099-01-01T10:00:00+00:00")
    delayed = await admit(fc_client, executionId="delayed", delaySeconds=3600)
    admitted = datetime.fromisoformat(delayed["admittedAt"])
    due = datetime.fromisoformat(delayed["dueAt"])
    assert timedelta(seconds=3599) <= due - admitted <= timedelta(seconds=3601)
    assert delayed["status"] == "admitted"
    assert await store.leases.claim_due(10, 30.0, "w") == []
    past = await admit(fc_client, executionId="past", startAt="2001-01-01T00:00:00Z")
    assert datetime.fromisoformat(past["dueAt"]) >= datetime.fromisoformat(past["admittedAt"])
    now = await admit(fc_client, executionId="zero", delaySeconds=0)
    claimed = await store.leases.claim_due(10, 30.0, "w")
    assert sorted(d.lease.execution_id for d in claimed) == ["past", "zero"]
    assert now["dueAt"] is not None


async def test_a_lower_priority_number_is_claimed_first(fc_client, store) -> None:
    await admit(fc_client, executionId="normal")
    await admit(fc_client, executionId="urgent", priority=-1)
    await admit(fc_client, executionId="whenever", priority=5)
    order = [(await store.leases.claim_due(1, 30.0, "w"))[0].lease.execution_id for _ in range(3)]
    assert order == ["urgent", "normal", "whenever"]


async def test_the_api_declares_its_workflows_queues_at_startup(fc_client) -> None:
    r = await fc_client.get("/v1/queues/fc-payments")
    assert r.status_code == 200, r.text
    assert r.json()["declared"]["concurrency"] == 2
    assert r.json()["effective"]["perKeyConcurrency"] == 1


@pytest.mark.parametrize(("start_at", "due"), [
    ("0001-01-01T00:30:00+01:00", None),
    ("9999-12-31T23:30:00-01:00", "9999-12-31T00:00:00+00:00"),
    ("9999-12-31T23:59:59.999999Z", "9999-12-31T00:00:00+00:00"),
])
async def test_a_start_beyond_the_utc_range_is_now_or_never(fc_client, start_at, due) -> None:
    rec = await admit(fc_client, startAt=start_at)
    if due is None:
        assert rec["dueAt"] >= rec["admittedAt"][:4]
        assert datetime.fromisoformat(rec["dueAt"]).year > 2000
    else:
        assert datetime.fromisoformat(rec["dueAt"]) == datetime.fromisoformat(due)


async def test_a_deadline_beyond_the_utc_range_is_answered_not_a_500(fc_client, rows) -> None:
    r = await fc_client.post("/v1/executions", json={
        "workflowId": "fc-plain", "params": {}, "deadline": "0001-01-01T00:30:00+01:00"})
    assert_error(r, 422, "DEADLINE_IN_THE_PAST")
    assert (await rows()).executions == 0
    rec = await admit(fc_client, deadline="9999-12-31T23:30:00-01:00")
    assert datetime.fromisoformat(rec["deadline"]) == datetime.fromisoformat(
        "9999-12-31T00:00:00+00:00")
