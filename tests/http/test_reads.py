"""GET /v1/executions/{id} and GET /v1/executions: the record in camelCase,
healed on read after lease expiry, the live lease, and the operator listing
with filters and keyset pagination."""

from __future__ import annotations

import base64
import json
from datetime import datetime

import pytest

from tests.support.admission import admit_via_api
from tests.support.responses import assert_error, get_record

RECORD_FIELDS = {
    "executionId", "workflowId", "params", "context", "status", "outcome", "dueAt", "lease",
    "token", "unacknowledgedDeliveries", "admittedAt", "updatedAt",
}


def parse_time(value: str) -> datetime:
    at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    assert at.tzinfo is not None, value
    return at


async def db_now(pool) -> datetime:
    return await pool.fetchval("SELECT now()")


# --------------------------------------------------------------------------- #
# one record
# --------------------------------------------------------------------------- #


async def test_record_fields_are_camel_case(client, pool):
    await admit_via_api(client, "order-42", workflow_id="charge-order", params={"orderId": 42},
                        context={"tenant": "t1"})
    record = await get_record(client, "order-42")
    assert RECORD_FIELDS <= set(record), set(record) ^ RECORD_FIELDS
    for key in record:
        assert "_" not in key, key
    assert record["executionId"] == "order-42"
    assert record["workflowId"] == "charge-order"
    assert record["params"] == {"orderId": 42}
    assert record["context"] == {"tenant": "t1"}
    assert record["status"] == "admitted"
    assert record["outcome"] is None
    assert record["lease"] is None
    assert record["token"] == 0
    assert record["unacknowledgedDeliveries"] == 0
    admitted_at = parse_time(record["admittedAt"])
    assert parse_time(record["updatedAt"]) >= admitted_at
    # Admission = record + first wake, due now.
    assert parse_time(record["dueAt"]) == admitted_at
    assert admitted_at <= await db_now(pool)


async def test_unknown_execution_is_404(client):
    error = assert_error(await client.get("/v1/executions/nope"), 404, "EXECUTION_NOT_FOUND")
    assert "nope" in error["message"]


@pytest.mark.parametrize("path", ["a%00b", "%FF", "x" * 2000, "a%20b", "%E2%98%83"])
async def test_odd_ids_are_404(client, path):
    assert_error(await client.get(f"/v1/executions/{path}"), 404, "EXECUTION_NOT_FOUND")


async def test_dot_segments_do_not_escape_the_route(client):
    error = assert_error(await client.get("/v1/executions/..%2F..%2Fhealthz"), 404)
    assert error["code"] in ("EXECUTION_NOT_FOUND", "NOT_FOUND")


async def test_leased_record_shows_running_and_the_lease(client, store, pool):
    await admit_via_api(client, "e1")
    [delivery] = await store.leases.claim_due(1, 30, "worker-a")
    record = await get_record(client, "e1")
    assert record["status"] == "running"
    assert record["token"] == 1
    assert record["dueAt"] is None  # the claim covers the admission wake
    lease = record["lease"]
    assert set(lease) == {"token", "owner", "expiresAt"}
    assert lease["token"] == 1
    assert lease["owner"] == "worker-a"
    assert parse_time(lease["expiresAt"]) == delivery.lease.expires_at
    assert 25 < (parse_time(lease["expiresAt"]) - await db_now(pool)).total_seconds() <= 30


async def test_expired_lease_is_healed_on_read(client, store, pool):
    await admit_via_api(client, "e1")
    await store.leases.claim_due(1, 30, "worker-a")
    await pool.execute(
        "UPDATE executions SET lease_expires_at = now() - interval '1 minute'"
        " WHERE execution_id = 'e1'"
    )
    # The reaper has not run: the row still says running ...
    assert await pool.fetchval("SELECT status FROM executions WHERE execution_id='e1'") == "running"
    # ... but the read reports the post-expiry state.
    record = await get_record(client, "e1")
    assert record["status"] == "admitted"
    assert record["unacknowledgedDeliveries"] == 1
    assert record["lease"] is None
    assert record["token"] == 1
    assert record["dueAt"] is not None  # the covered admission wake is pending again
    # The listing agrees with the record.
    page = (await client.get("/v1/executions?minUnacknowledgedDeliveries=1")).json()
    assert [(e["executionId"], e["status"]) for e in page["executions"]] == [("e1", "admitted")]


async def test_expired_lease_after_a_suspension_heals_to_suspended(client, store, pool):
    await admit_via_api(client, "e1")
    [d] = await store.leases.claim_due(1, 30, "worker-a")
    await store.operator.request_wake("e1", await db_now(pool))
    await store.leases.acknowledge(d.lease, "suspended")
    [d2] = await store.leases.claim_due(1, 30, "worker-b")
    await pool.execute(
        "UPDATE executions SET lease_expires_at = now() - interval '1 minute'"
        " WHERE execution_id = 'e1'"
    )
    record = await get_record(client, "e1")
    assert record["status"] == "suspended"
    assert record["unacknowledgedDeliveries"] == 1
    assert record["lease"] is None
    assert record["token"] == d2.lease.token == 2


async def test_terminal_record_shows_the_outcome(client, store):
    await admit_via_api(client, "ok")
    await admit_via_api(client, "bad")
    for d in await store.leases.claim_due(2, 30, "worker-a"):
        if d.lease.execution_id == "ok":
            await store.leases.acknowledge(d.lease, "completed", result={"charged": True})
        else:
            await store.leases.acknowledge(d.lease, "failed",
                                    error={"name": "ValueError", "message": "no card"})
    ok = await get_record(client, "ok")
    assert ok["status"] == "completed"
    assert ok["outcome"] == {"result": {"charged": True}}
    assert ok["lease"] is None and ok["dueAt"] is None
    bad = await get_record(client, "bad")
    assert bad["status"] == "failed"
    assert bad["outcome"]["error"]["name"] == "ValueError"
    assert bad["outcome"]["error"]["message"] == "no card"


# --------------------------------------------------------------------------- #
# the listing
# --------------------------------------------------------------------------- #


async def list_all(client, query: dict | None = None, limit: int = 3) -> tuple[list[dict], int]:
    """Follow nextCursor to the end; returns (executions, pages)."""
    seen: list[dict] = []
    cursor = None
    pages = 0
    while True:
        params: dict = {**(query or {}), "limit": limit}
        if cursor:
            params["cursor"] = cursor
        r = await client.get("/v1/executions", params=params)
        assert r.status_code == 200, r.text
        body = r.json()
        assert set(body) == {"executions", "nextCursor"}
        assert len(body["executions"]) <= limit
        seen.extend(body["executions"])
        pages += 1
        cursor = body["nextCursor"]
        if cursor is None:
            return seen, pages
        assert pages < 100


async def test_keyset_pagination_three_pages_no_duplicates_no_gaps(client):
    ids = [f"e{i:02d}" for i in range(8)]
    for eid in ids:
        await admit_via_api(client, eid)
    r = await client.get("/v1/executions", params={"limit": 3})
    first = r.json()
    assert len(first["executions"]) == 3 and first["nextCursor"]

    seen, pages = await list_all(client, limit=3)
    assert pages == 3
    got = [e["executionId"] for e in seen]
    assert len(got) == len(set(got)) == 8
    assert set(got) == set(ids)
    # Newest first, ties broken by ID (descending).
    keys = [(parse_time(e["admittedAt"]), e["executionId"]) for e in seen]
    assert keys == sorted(keys, reverse=True)
    assert got[:3] == [e["executionId"] for e in first["executions"]]
    # Summaries carry no params/context.
    assert "params" not in seen[0] and "unacknowledgedDeliveries" in seen[0]


async def test_pagination_is_stable_while_executions_are_admitted(client):
    for i in range(6):
        await admit_via_api(client, f"old-{i}")
    r = await client.get("/v1/executions", params={"limit": 2})
    page1 = r.json()
    for i in range(4):
        await admit_via_api(client, f"new-{i}")  # newer than everything already listed
    seen = [e["executionId"] for e in page1["executions"]]
    cursor = page1["nextCursor"]
    while cursor:
        body = (await client.get("/v1/executions", params={"limit": 2, "cursor": cursor})).json()
        seen.extend(e["executionId"] for e in body["executions"])
        cursor = body["nextCursor"]
    assert sorted(seen) == sorted(f"old-{i}" for i in range(6))


async def test_exact_multiple_of_limit_ends_without_an_empty_page(client):
    for i in range(6):
        await admit_via_api(client, f"e{i}")
    seen, pages = await list_all(client, limit=3)
    assert len(seen) == 6 and pages == 2


async def test_empty_listing(client):
    r = await client.get("/v1/executions")
    assert r.status_code == 200
    assert r.json() == {"executions": [], "nextCursor": None}


async def test_filters(client, store, pool):
    for i in range(3):
        await admit_via_api(client, f"a{i}", workflow_id="alpha")
    for i in range(2):
        await admit_via_api(client, f"b{i}", workflow_id="beta")
    # b0: running; a0: completed; a1: lease expired (healed: admitted, 1 unacknowledged).
    deliveries = {d.lease.execution_id: d for d in await store.leases.claim_due(10, 30, "w")}
    await store.leases.acknowledge(deliveries["a0"].lease, "completed", result=1)
    await store.leases.release(deliveries["a2"].lease)
    await store.leases.release(deliveries["b1"].lease)
    await pool.execute("UPDATE executions SET lease_expires_at = now() - interval '1 minute'"
                       " WHERE execution_id = 'a1'")

    async def ids(**query) -> set[str]:
        seen, _ = await list_all(client, query)
        return {e["executionId"] for e in seen}

    assert await ids(workflowId="alpha") == {"a0", "a1", "a2"}
    assert await ids(workflowId="beta") == {"b0", "b1"}
    assert await ids(workflowId="gamma") == set()
    assert await ids(status="running") == {"b0"}
    assert await ids(status="completed") == {"a0"}
    assert await ids(status="admitted") == {"a1", "a2", "b1"}
    assert await ids(status="admitted", workflowId="alpha") == {"a1", "a2"}
    assert await ids(minUnacknowledgedDeliveries=1) == {"a1", "a2", "b1"}
    assert await ids(minUnacknowledgedDeliveries=2) == set()
    assert await ids(minUnacknowledgedDeliveries=0) == {"a0", "a1", "a2", "b0", "b1"}
    assert await ids(minUnacknowledgedDeliveries=1, workflowId="beta") == {"b1"}
    assert await ids(status="running", workflowId="alpha") == set()
    # One page of the filtered view at a time, too.
    seen, pages = await list_all(client, {"status": "admitted"}, limit=1)
    assert {e["executionId"] for e in seen} == {"a1", "a2", "b1"} and pages == 3
    assert all(e["status"] == "admitted" for e in seen)


def _cursor(obj) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "cursor",
    ["garbage!!", "e30", _cursor({"a": 1}), _cursor(["not a time", "x"]), _cursor([1, 2]),
     _cursor(["2024-01-01T00:00:00", "x"]),  # naive: never issued
     _cursor(["2024-01-01T00:00:00+00:00", "x\u0000"]),
     _cursor(["2024-01-01T00:00:00+00:00", "\ud800"]),
     _cursor(["9999-12-31T23:59:59-05:00", "x"]), _cursor(["0001-01-01T00:00:00+05:00", "x"]),
     _cursor(["2024-01-01T00:00:00+00:00"]), "", "%00", "=" * 8],
    ids=["garbage", "empty-object", "object", "bad-time", "numbers", "naive", "nul-id",
         "surrogate-id", "overflow-high", "overflow-low", "one-element", "empty", "nul",
         "padding"],
)
async def test_invalid_cursor_is_422(client, cursor):
    await admit_via_api(client, "e1")
    r = await client.get("/v1/executions", params={"cursor": cursor})
    assert_error(r, 422, "INVALID_CURSOR")


async def test_cursor_from_another_filter_still_works(client):
    for i in range(4):
        await admit_via_api(client, f"e{i}", workflow_id="alpha" if i % 2 else "beta")
    cursor = (await client.get("/v1/executions", params={"limit": 1})).json()["nextCursor"]
    r = await client.get("/v1/executions", params={"cursor": cursor, "workflowId": "alpha"})
    assert r.status_code == 200


@pytest.mark.parametrize(
    "query",
    ["status=bogus", "status=RUNNING", "status=", "limit=0", "limit=501", "limit=-1",
     "limit=abc", "limit=1.5", "minUnacknowledgedDeliveries=-1",
     "minUnacknowledgedDeliveries=x", "minUnacknowledgedDeliveries=2147483648",
     "workflowId=bad%20id", "workflowId=", "workflowId=" + "w" * 201,
     "cursor=" + "c" * 1001],
)
async def test_invalid_query_is_422(client, query):
    error = assert_error(await client.get(f"/v1/executions?{query}"), 422)
    assert error["code"] in ("INVALID_REQUEST", "INVALID_CURSOR"), error


async def test_limit_bounds_are_inclusive(client):
    await admit_via_api(client, "e1")
    for limit in (1, 500):
        r = await client.get("/v1/executions", params={"limit": limit})
        assert r.status_code == 200, r.text


async def test_code_version_filter_lists_a_workflows_executions_of_one_version(client, store):
    # Which executions of a workflow are still on the old code (before its
    # workers are stopped): codeVersion, with workflowId (whose index serves it).
    from tests.support.admission import admit
    await admit(store, "alpha", "v1-a", code_version="1")
    await admit(store, "alpha", "v2-a", code_version="2")
    await admit(store, "alpha", "none-a")
    await admit(store, "beta", "v1-b", code_version="1")

    async def ids(**query) -> set[str]:
        seen, _ = await list_all(client, query)
        return {e["executionId"] for e in seen}

    assert await ids(workflowId="alpha", codeVersion="1") == {"v1-a"}
    assert await ids(workflowId="alpha", codeVersion="2") == {"v2-a"}
    assert await ids(workflowId="beta", codeVersion="1") == {"v1-b"}
    assert await ids(workflowId="alpha", codeVersion="3") == set()
    summary = (await client.get("/v1/executions", params={"workflowId": "alpha",
                                                          "codeVersion": "1"})).json()
    assert [e["codeVersion"] for e in summary["executions"]] == ["1"]


@pytest.mark.parametrize("query", ["codeVersion=1", "workflowId=alpha&codeVersion=",
                                   "workflowId=alpha&codeVersion=" + "v" * 201,
                                   "workflowId=alpha&codeVersion=%00"])
async def test_invalid_code_version_filter_is_422(client, query):
    error = assert_error(await client.get(f"/v1/executions?{query}"), 422, "INVALID_REQUEST")
    assert "codeVersion" in error["message"], error
