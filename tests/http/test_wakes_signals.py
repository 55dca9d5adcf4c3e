"""POST /v1/executions/{id}/wakes and /signals/{name} against the real app
and database."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tests.http.conftest import Rows
from tests.support.admission import admit_via_api
from tests.support.responses import JSON, assert_error, get_record, post_raw

pytestmark = pytest.mark.citus


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


async def db_now(pool) -> datetime:
    return await pool.fetchval("SELECT now()")


async def idle(client, store, *execution_ids: str) -> None:
    """Admit, claim, acknowledge `suspended`: no wake pending (dueAt null).
    Call it before anything else is due."""
    for execution_id in execution_ids:
        await admit_via_api(client, execution_id)
    deliveries = await store.leases.claim_due(100, 30, "worker-a")
    assert sorted(d.lease.execution_id for d in deliveries) == sorted(execution_ids)
    for d in deliveries:
        await store.leases.acknowledge(d.lease, "suspended")
    for execution_id in execution_ids:
        record = await get_record(client, execution_id)
        assert record["status"] == "suspended" and record["dueAt"] is None


async def terminal(client, store, execution_id: str, status: str = "completed") -> None:
    await admit_via_api(client, execution_id)
    [d] = await store.leases.claim_due(1, 30, "worker-a")
    if status == "completed":
        await store.leases.acknowledge(d.lease, "completed", result={"done": True})
    else:
        await store.leases.acknowledge(d.lease, "failed", error={"name": "E", "message": "m"})
    assert (await get_record(client, execution_id))["status"] == status


# --------------------------------------------------------------------------- #
# wakes
# --------------------------------------------------------------------------- #


async def test_wake_without_body_is_due_now(client, store, pool):
    await idle(client, store, "e1")
    before = await db_now(pool)
    r = await client.post("/v1/executions/e1/wakes")
    assert r.status_code == 200, r.text
    assert r.json() == {"status": "requested"}
    due = parse_time((await get_record(client, "e1"))["dueAt"])
    assert before <= due <= await db_now(pool)


async def test_wake_with_empty_object_or_null_is_due_now(client, store, pool):
    await idle(client, store, "e1", "e2")
    r = await client.post("/v1/executions/e1/wakes", json={})
    assert r.json() == {"status": "requested"}
    assert (await get_record(client, "e1"))["dueAt"] is not None
    r = await client.post("/v1/executions/e2/wakes", json=None)
    assert r.json() == {"status": "requested"}
    assert (await get_record(client, "e2"))["dueAt"] is not None


async def test_wakes_merge_to_the_earliest(client, store, pool):
    await idle(client, store, "e1")
    now = await db_now(pool)
    in_an_hour = now + timedelta(hours=1)
    r = await client.post("/v1/executions/e1/wakes", json={"at": in_an_hour.isoformat()})
    assert r.json() == {"status": "requested"}
    assert parse_time((await get_record(client, "e1"))["dueAt"]) == in_an_hour

    # A later wake does not move it.
    r = await client.post("/v1/executions/e1/wakes",
                          json={"at": (now + timedelta(hours=2)).isoformat()})
    assert r.json() == {"status": "requested"}
    assert parse_time((await get_record(client, "e1"))["dueAt"]) == in_an_hour

    # An earlier one (given with another offset) does.
    in_ten = (now + timedelta(minutes=10)).astimezone(timezone(timedelta(hours=-5)))
    r = await client.post("/v1/executions/e1/wakes", json={"at": in_ten.isoformat()})
    assert r.json() == {"status": "requested"}
    assert parse_time((await get_record(client, "e1"))["dueAt"]) == in_ten

    # A past time moves it earlier still.
    past = now - timedelta(days=1)
    r = await client.post("/v1/executions/e1/wakes",
                          json={"at": past.isoformat().replace("+00:00", "Z")})
    assert r.json() == {"status": "requested"}
    assert parse_time((await get_record(client, "e1"))["dueAt"]) == past


async def test_wake_on_a_fresh_admission_keeps_the_earlier_due_time(client, pool):
    await admit_via_api(client, "e1")
    admitted_due = parse_time((await get_record(client, "e1"))["dueAt"])
    r = await client.post("/v1/executions/e1/wakes",
                          json={"at": (await db_now(pool) + timedelta(hours=1)).isoformat()})
    assert r.json() == {"status": "requested"}
    assert parse_time((await get_record(client, "e1"))["dueAt"]) == admitted_due


async def test_wake_during_a_delivery_is_kept_apart(client, store, pool):
    await admit_via_api(client, "e1")
    [d] = await store.leases.claim_due(1, 30, "worker-a")
    assert (await get_record(client, "e1"))["dueAt"] is None
    at = await db_now(pool) + timedelta(minutes=5)
    r = await client.post("/v1/executions/e1/wakes", json={"at": at.isoformat()})
    assert r.json() == {"status": "requested"}
    record = await get_record(client, "e1")
    assert record["status"] == "running" and parse_time(record["dueAt"]) == at
    await store.leases.acknowledge(d.lease, "suspended")
    assert parse_time((await get_record(client, "e1"))["dueAt"]) == at


@pytest.mark.parametrize("status", ["completed", "failed"])
async def test_wake_on_a_terminal_execution_is_ignored(client, store, rows, status):
    await terminal(client, store, "done", status)
    counts = await rows()
    r = await client.post("/v1/executions/done/wakes")
    assert r.status_code == 200, r.text
    assert r.json() == {"status": "ignored"}
    r = await client.post("/v1/executions/done/wakes", json={"at": "2030-01-01T00:00:00Z"})
    assert r.json() == {"status": "ignored"}
    record = await get_record(client, "done")
    assert record["status"] == status and record["dueAt"] is None
    assert await rows() == counts


async def test_wake_on_an_unknown_execution_is_404_and_creates_nothing(client, rows):
    r = await client.post("/v1/executions/ghost/wakes")
    error = assert_error(r, 404, "EXECUTION_NOT_FOUND")
    assert "ghost" in error["message"]
    r = await client.post("/v1/executions/ghost/wakes", json={"at": "2030-01-01T00:00:00Z"})
    assert_error(r, 404, "EXECUTION_NOT_FOUND")
    assert await rows() == Rows(0, 0, 0)


@pytest.mark.parametrize(
    "body",
    [{"at": "2030-01-01T00:00:00"}, {"at": "2030-01-01 00:00:00"}],
    ids=["naive-t", "naive-space"],
)
async def test_naive_wake_time_is_422(client, store, rows, body):
    await idle(client, store, "e1")
    counts = await rows()
    error = assert_error(await client.post("/v1/executions/e1/wakes", json=body), 422)
    assert "at" in error["message"]
    assert (await get_record(client, "e1"))["dueAt"] is None
    assert await rows() == counts


@pytest.mark.parametrize(
    "body",
    [b'{"at":"tomorrow"}', b'{"at":"2030-13-01T00:00:00Z"}', b'{"at":[]}', b'{"when":"now"}',
     b"[]", b'"2030-01-01T00:00:00Z"', b'{"at":"9999-12-31T23:59:59-05:00"}',
     b'{"at":"0001-01-01T00:00:00+05:00"}', b'{"at":NaN}', b'{"at":1,"at":2}',
     b'{"at":"\\u0000"}'],
    ids=["words", "bad-month", "list", "unknown-field", "array-body", "string-body",
         "overflow-high", "overflow-low", "nan", "duplicate", "nul"],
)
async def test_invalid_wake_bodies_are_422(client, store, rows, body):
    await idle(client, store, "e1")
    counts = await rows()
    error = assert_error(await post_raw(client, body, "/v1/executions/e1/wakes"), 422)
    assert error["code"] in ("INVALID_REQUEST", "INVALID_EXECUTION_EVENT"), error
    assert (await get_record(client, "e1"))["dueAt"] is None
    assert await rows() == counts


async def test_wake_body_transport_errors(small_client, store, rows):
    await admit_via_api(small_client, "e1")
    r = await post_raw(small_client, b'{"at":', "/v1/executions/e1/wakes")
    assert_error(r, 400, "MALFORMED_JSON")
    r = await post_raw(small_client, b'{"at":null}', "/v1/executions/e1/wakes",
                       headers={"content-type": "text/plain"})
    assert_error(r, 415, "UNSUPPORTED_MEDIA_TYPE")
    r = await post_raw(small_client, b'{"at":"' + b"x" * 2000 + b'"}', "/v1/executions/e1/wakes")
    assert_error(r, 413, "PAYLOAD_TOO_LARGE")


# --------------------------------------------------------------------------- #
# signals
# --------------------------------------------------------------------------- #


async def test_signal_is_stored_and_makes_the_execution_due(client, store, pool, rows):
    await idle(client, store, "refund-7")
    before = await rows()
    r = await client.post("/v1/executions/refund-7/signals/approval",
                          json={"approved": True, "by": "ops"})
    assert r.status_code == 202, r.text
    assert r.json() == {"status": "received"}
    assert (await rows()).signals == before.signals + 1
    stored = await pool.fetchrow(
        "SELECT execution_id, name, payload FROM signals WHERE execution_id = 'refund-7'")
    assert dict(stored) == {"execution_id": "refund-7", "name": "approval",
                            "payload": {"approved": True, "by": "ops"}}
    record = await get_record(client, "refund-7")
    assert record["dueAt"] is not None
    assert parse_time(record["dueAt"]) <= await db_now(pool)
    # The worker can now claim it.
    [d] = await store.leases.claim_due(1, 30, "worker-b")
    assert d.lease.execution_id == "refund-7"


async def test_signal_without_body_and_repeated_signals(client, store, pool):
    await admit_via_api(client, "e1")
    for _ in range(2):
        r = await client.post("/v1/executions/e1/signals/ping")
        assert r.status_code == 202, r.text
    r = await client.post("/v1/executions/e1/signals/ping", json=[1, "two"])
    assert r.status_code == 202, r.text
    payloads = await pool.fetch(
        "SELECT payload FROM signals WHERE execution_id = 'e1' ORDER BY signal_id")
    assert [p["payload"] for p in payloads] == [None, None, [1, "two"]]


async def test_signal_to_a_running_execution_is_received(client, store):
    await admit_via_api(client, "e1")
    await store.leases.claim_due(1, 30, "worker-a")
    r = await client.post("/v1/executions/e1/signals/go", json={"n": 1})
    assert r.status_code == 202, r.text
    assert (await get_record(client, "e1"))["status"] == "running"


async def test_signal_to_an_unknown_execution_is_404(client, rows):
    error = assert_error(await client.post("/v1/executions/ghost/signals/go", json={}), 404,
                         "EXECUTION_NOT_FOUND")
    assert "ghost" in error["message"]
    assert await rows() == Rows(0, 0, 0)


@pytest.mark.parametrize("status", ["completed", "failed"])
async def test_signal_to_a_terminal_execution_is_409(client, store, rows, status):
    await terminal(client, store, "done", status)
    counts = await rows()
    r = await client.post("/v1/executions/done/signals/go", json={"n": 1})
    error = assert_error(r, 409, "EXECUTION_TERMINAL")
    assert error["status"] == status
    assert status in error["message"]
    assert await rows() == counts


@pytest.mark.parametrize(
    "name",
    ["a%20b", "a%00b", "caf%C3%A9", "x" * 201, "a%2Cb", "%22q%22"],
    ids=["space", "nul", "non-ascii", "too-long", "comma", "quotes"],
)
async def test_bad_signal_name_is_422_and_nothing_is_stored(client, rows, name):
    await admit_via_api(client, "e1")
    counts = await rows()
    r = await client.post(f"/v1/executions/e1/signals/{name}", json={"v": 1})
    error = assert_error(r, 422)
    assert "name" in error["message"]
    assert await rows() == counts


@pytest.mark.parametrize(
    "body",
    [b'{"v":NaN}', b"Infinity", b'[-Infinity]', b'"\\u0000"', b'{"\\u0000":1}', b'"\\ud800"',
     b'{"a":1,"a":2}', b"[" * 100_000 + b"]" * 100_000],
    ids=["nan", "infinity", "minus-infinity", "nul", "nul-key", "surrogate", "duplicate",
         "deep"],
)
async def test_unstorable_signal_payload_is_422_and_nothing_is_stored(client, rows, body):
    await admit_via_api(client, "e1")
    counts = await rows()
    r = await post_raw(client, body, "/v1/executions/e1/signals/go")
    assert_error(r, 422, "INVALID_EXECUTION_EVENT")
    assert await rows() == counts


async def test_signal_transport_errors(small_client, rows):
    await admit_via_api(small_client, "e1")
    counts = await rows()
    path = "/v1/executions/e1/signals/go"
    assert_error(await post_raw(small_client, b"{", path), 400, "MALFORMED_JSON")
    assert_error(await post_raw(small_client, b"\xff", path), 400, "MALFORMED_JSON")
    assert_error(await post_raw(small_client, b"{}", path, headers={"content-type": "text/csv"}),
                 415, "UNSUPPORTED_MEDIA_TYPE")
    assert_error(await post_raw(small_client, b'"' + b"x" * 2000 + b'"', path), 413,
                 "PAYLOAD_TOO_LARGE")

    async def chunks():
        yield b'"'
        for _ in range(100):
            yield b"x" * 100
        yield b'"'

    r = await small_client.post(path, content=chunks(), headers=JSON)
    assert_error(r, 413, "PAYLOAD_TOO_LARGE")
    assert await rows() == counts
