"""POST /v1/executions against the real app and database: admission, the
409 on a reused ID, and every kind of bad input (4xx, stable code, message,
nothing written)."""

from __future__ import annotations

import json
import time

import pytest

from tests.http.conftest import Rows
from tests.support.admission import admit_via_api
from tests.support.responses import JSON, assert_error, get_record, post_raw

NOTHING = Rows(0, 0, 0)

# --------------------------------------------------------------------------- #
# admitted
# --------------------------------------------------------------------------- #


@pytest.mark.citus
async def test_admit_returns_201_location_and_admitted(client, rows):
    r = await client.post(
        "/v1/executions",
        json={"workflowId": "charge-order", "executionId": "order-42", "params": {"orderId": 42},
              "context": {"traceId": "t-1"}},
    )
    assert r.status_code == 201, r.text
    assert r.json() == {"executionId": "order-42", "status": "admitted"}
    assert r.headers["location"] == "/v1/executions/order-42"
    followed = await client.get(r.headers["location"])
    assert followed.status_code == 200
    assert followed.json()["params"] == {"orderId": 42}
    assert followed.json()["context"] == {"traceId": "t-1"}
    assert await rows() == Rows(1, 1, 0)


async def test_admit_without_execution_id_generates_distinct_ids(client, rows):
    ids = set()
    for _ in range(3):
        r = await client.post("/v1/executions", json={"workflowId": "wf", "params": {}})
        assert r.status_code == 201, r.text
        body = r.json()
        assert body["status"] == "admitted"
        assert isinstance(body["executionId"], str) and body["executionId"]
        assert r.headers["location"] == f"/v1/executions/{body['executionId']}"
        ids.add(body["executionId"])
    assert len(ids) == 3
    assert (await rows()).executions == 3


async def test_admit_with_explicit_null_execution_id_generates_one(client):
    r = await client.post("/v1/executions",
                          json={"workflowId": "wf", "executionId": None, "params": {}})
    assert r.status_code == 201, r.text
    assert r.json()["executionId"]


async def test_admit_defaults_params_and_context(client):
    r = await client.post("/v1/executions", json={"workflowId": "wf", "executionId": "e1"})
    assert r.status_code == 201, r.text
    record = await get_record(client, "e1")
    assert record["params"] == {}
    assert record["context"] == {}


@pytest.mark.parametrize(
    "params",
    [0, -1.5, "text", [1, "two", None], {"nested": {"deep": [True, False]}},
     {"unicode": "naïve ☃ 𝄞 \u2028"}, {"big": 10**300}, {"": "empty key"}],
    ids=["zero", "float", "string", "list", "nested", "unicode", "bigint", "emptykey"],
)
async def test_params_round_trip_exactly(client, params):
    r = await client.post("/v1/executions",
                          json={"workflowId": "wf", "executionId": "rt", "params": params})
    assert r.status_code == 201, r.text
    assert (await get_record(client, "rt"))["params"] == params


async def test_accepted_id_characters_and_length(client):
    for execution_id in ["a", "A-z_0.9:x", "x" * 200]:
        r = await client.post("/v1/executions",
                              json={"workflowId": "a" * 200, "executionId": execution_id})
        assert r.status_code == 201, (execution_id, r.text)
        assert r.json()["executionId"] == execution_id


async def test_content_type_variants_accepted(client):
    for i, content_type in enumerate(
        ["application/json", "application/json; charset=utf-8", "Application/JSON;charset=\"UTF-8\"",
         "application/vnd.fencepost+json"]
    ):
        r = await post_raw(client, json.dumps({"workflowId": "wf", "executionId": f"ct{i}"}),
                           headers={"content-type": content_type})
        assert r.status_code == 201, (content_type, r.text)


# --------------------------------------------------------------------------- #
# 409: IDs are never reused
# --------------------------------------------------------------------------- #


async def test_reused_execution_id_is_409_naming_the_existing_execution(client, rows):
    await admit_via_api(client, "order-42", workflow_id="charge-order", params={"amount": 1},
                        context={"who": "first"})
    before = await get_record(client, "order-42")
    counts = await rows()

    r = await client.post(
        "/v1/executions",
        json={"workflowId": "other-flow", "executionId": "order-42", "params": {"amount": 999},
              "context": {"who": "second"}},
    )
    error = assert_error(r, 409, "EXECUTION_ID_CONFLICT")
    assert error["executionId"] == "order-42"
    assert error["status"] == "admitted"
    assert error["workflowId"] == "charge-order"
    assert "order-42" in error["message"]
    assert "location" not in r.headers

    assert await get_record(client, "order-42") == before
    assert await rows() == counts


async def test_409_reports_the_current_status(client, store, rows):
    await admit_via_api(client, "busy")
    [delivery] = await store.leases.claim_due(1, 30, "worker-a")
    await store.leases.acknowledge(delivery.lease, "completed", result={"ok": True})
    r = await client.post("/v1/executions", json={"workflowId": "wf", "executionId": "busy"})
    error = assert_error(r, 409, "EXECUTION_ID_CONFLICT")
    assert error["status"] == "completed"
    assert (await get_record(client, "busy"))["outcome"] == {"result": {"ok": True}}


# --------------------------------------------------------------------------- #
# 422 INVALID_EXECUTION_EVENT: values that cannot round-trip through jsonb
# --------------------------------------------------------------------------- #

def adm(members: str) -> str:
    """An admission body: workflowId "wf" followed by `members` (raw JSON text)."""
    return '{"workflowId":"wf",' + members + "}"


def deep_array(levels: int) -> str:
    return "[" * levels + "]" * levels


UNSTORABLE = {
    "nan-in-params": adm('"params":{"x":NaN}'),
    "nan-as-params": adm('"params":NaN'),
    "infinity-nested": adm('"params":{"a":[1,{"b":Infinity}]}'),
    "minus-infinity-in-list": adm('"params":[-Infinity]'),
    "nan-in-context": adm('"params":{},"context":{"c":NaN}'),
    "infinity-in-context": adm('"params":{},"context":{"c":{"d":Infinity}}'),
    "minus-infinity-in-context": adm('"params":{},"context":{"c":-Infinity}'),
    "overflowing-float": adm('"params":{"x":1e400}'),
    "nul-in-string": adm('"params":{"s":"a\\u0000b"}'),
    "nul-in-key": adm('"params":{"a\\u0000":1}'),
    "nul-in-context-string": adm('"params":{},"context":{"c":"\\u0000"}'),
    "nul-in-context-key": adm('"params":{},"context":{"\\u0000":"c"}'),
    "nul-in-workflow-id": '{"workflowId":"w\\u0000f","params":{}}',
    "nul-in-top-level-key": adm('"params":{},"x\\u0000":1'),
    "lone-high-surrogate-in-string": adm('"params":{"s":"\\ud800"}'),
    "lone-low-surrogate-in-string": adm('"params":{"s":"x\\udc00y"}'),
    "reversed-surrogate-pair": adm('"params":{"s":"\\udc00\\ud800"}'),
    "lone-surrogate-in-key": adm('"params":{"\\ud800":1}'),
    "lone-surrogate-in-context": adm('"params":{},"context":{"k":["\\udfff"]}'),
    "duplicate-top-level-key": adm('"workflowId":"other","params":{}'),
    "duplicate-top-level-params": adm('"params":{},"params":{"a":1}'),
    "duplicate-nested-key": adm('"params":{"a":{"b":1,"b":2}}'),
    "duplicate-key-in-list": adm('"params":[{"k":1,"k":1}]'),
    "duplicate-key-in-context": adm('"params":{},"context":{"k":1,"k":2}'),
    # The body object is level 1, so params nested 64 deep make 65 levels.
    "65-levels": adm('"params":' + deep_array(64)),
    "65-levels-objects": adm('"params":' + '{"a":' * 64 + "1" + "}" * 64),
    "65-levels-in-context": adm('"params":{},"context":' + '{"a":' * 64 + "1" + "}" * 64),
    "too-many-digits": adm('"params":{"n":' + "9" * 5000 + "}"),
}


@pytest.mark.parametrize("body", list(UNSTORABLE.values()), ids=list(UNSTORABLE))
@pytest.mark.citus
async def test_unstorable_values_are_422_and_nothing_is_written(client, rows, body):
    r = await post_raw(client, body)
    assert_error(r, 422, "INVALID_EXECUTION_EVENT")
    assert await rows() == NOTHING


async def test_depth_bound_is_exactly_max_json_depth(client, rows):
    # 64 levels in all (body object + 63 nested arrays): accepted.
    r = await post_raw(client, adm('"executionId":"deep","params":' + deep_array(63)))
    assert r.status_code == 201, r.text
    record = await get_record(client, "deep")
    depth, value = 0, record["params"]
    while isinstance(value, list):
        depth, value = depth + 1, value[0] if value else None
    assert depth == 63
    # 65 levels: rejected, nothing more written.
    counts = await rows()
    r = await post_raw(client, adm('"executionId":"deeper","params":' + deep_array(64)))
    error = assert_error(r, 422, "INVALID_EXECUTION_EVENT")
    assert "64" in error["message"]
    assert await rows() == counts


@pytest.mark.parametrize(
    "body",
    [
        adm('"params":' + deep_array(100_000)),
        '{"workflowId":"wf","params":' + "[" * 100_000,  # unterminated as well
        adm('"params":' + '{"a":' * 100_000 + "1" + "}" * 100_000),
        deep_array(100_000),
    ],
    ids=["array", "unterminated-array", "objects", "bare-array"],
)
@pytest.mark.citus
async def test_pathologically_deep_json_is_rejected_fast(client, rows, body):
    started = time.perf_counter()
    r = await post_raw(client, body)
    elapsed = time.perf_counter() - started
    assert 400 <= r.status_code < 500, r.text[:500]
    assert_error(r, r.status_code)
    if r.status_code == 422:
        assert r.json()["error"]["code"] == "INVALID_EXECUTION_EVENT"
    assert elapsed < 2.0, f"took {elapsed:.2f}s"
    assert await rows() == NOTHING


@pytest.mark.citus
async def test_hundred_thousand_deep_array_is_invalid_event(client):
    r = await post_raw(client, adm('"params":' + deep_array(100_000)))
    assert_error(r, 422, "INVALID_EXECUTION_EVENT")


def _body(**fields) -> str:
    return json.dumps(fields)


BAD_FIELDS = {
    "empty-execution-id": _body(workflowId="wf", executionId=""),
    "too-long-execution-id": _body(workflowId="wf", executionId="x" * 201),
    "space-in-execution-id": _body(workflowId="wf", executionId="order 42"),
    "slash-in-execution-id": _body(workflowId="wf", executionId="order/42"),
    "non-ascii-execution-id": _body(workflowId="wf", executionId="ordér"),
    "newline-execution-id": _body(workflowId="wf", executionId="order\n"),
    "percent-execution-id": _body(workflowId="wf", executionId="a%20b"),
    "numeric-execution-id": adm('"executionId":42'),
    "object-execution-id": adm('"executionId":{"id":"x"}'),
    "missing-workflow-id": _body(params={}),
    "null-workflow-id": _body(workflowId=None, params={}),
    "numeric-workflow-id": _body(workflowId=7, params={}),
    "list-workflow-id": _body(workflowId=["wf"], params={}),
    "bool-workflow-id": _body(workflowId=True, params={}),
    "empty-workflow-id": _body(workflowId="", params={}),
    "too-long-workflow-id": _body(workflowId="w" * 201, params={}),
    "bad-char-workflow-id": _body(workflowId="charge order", params={}),
    "context-list": _body(workflowId="wf", params={}, context=[1, 2]),
    "context-string": _body(workflowId="wf", params={}, context="ctx"),
    "context-number": _body(workflowId="wf", params={}, context=1),
    "context-null": _body(workflowId="wf", params={}, context=None),
    "context-bool": _body(workflowId="wf", params={}, context=True),
    "body-array": "[]",
    "body-array-of-object": _body() and '[{"workflowId":"wf"}]',
    "body-string": '"workflowId"',
    "body-number": "42",
    "body-null": "null",
    "body-true": "true",
    "empty-object": "{}",
    "unknown-field": _body(workflowId="wf", params={}, extra=1),
    "miscased-field": _body(workflowID="wf", params={}),
    "both-spellings": _body(workflowId="wf", workflow_id="other", params={}),
    "deadline-field-wrong-type": _body(workflowId="wf", params={}, deadline=[1]),
}


# A malformed request is INVALID_REQUEST; INVALID_EXECUTION_EVENT is kept for
# values that cannot round-trip (issue 19).
@pytest.mark.parametrize("body", list(BAD_FIELDS.values()), ids=list(BAD_FIELDS))
@pytest.mark.citus
async def test_invalid_fields_are_422_and_nothing_is_written(client, rows, body):
    r = await post_raw(client, body)
    assert_error(r, 422, "INVALID_REQUEST")
    assert await rows() == NOTHING


@pytest.mark.citus
async def test_validation_error_names_the_field(client):
    r = await post_raw(client, _body(workflowId="wf", executionId="x" * 201))
    error = assert_error(r, 422, "INVALID_REQUEST")
    assert "executionId" in error["message"]
    r = await post_raw(client, _body(params={}))
    error = assert_error(r, 422, "INVALID_REQUEST")
    assert "workflowId" in error["message"]


@pytest.mark.citus
async def test_unstorable_message_says_where(client):
    error = assert_error(await post_raw(client, adm('"params":{"a":[0,NaN]}')), 422)
    assert "NaN" in error["message"] and "params" in error["message"]
    error = assert_error(await post_raw(client, adm('"params":{"a":{"b":1,"b":2}}')), 422)
    assert "duplicate" in error["message"] and '"b"' in error["message"]


# --------------------------------------------------------------------------- #
# 400 MALFORMED_JSON, 415, 413
# --------------------------------------------------------------------------- #

MALFORMED = {
    "truncated": b'{"workflowId":"wf"',
    "trailing-comma": b'{"workflowId":"wf",}',
    "single-quotes": b"{'workflowId':'wf'}",
    "not-json": b"workflowId=wf",
    "empty": b"",
    "whitespace": b" \n\t ",
    "two-documents": b'{"workflowId":"wf"} {}',
    "raw-control-char": b'{"workflowId":"wf","params":"a\x00b"}',
    "bad-escape": b'{"workflowId":"wf","params":"\\x41"}',
    "comment": b'{"workflowId":"wf" /* c */}',
    "non-utf8-byte": b'{"workflowId":"wf","params":{"s":"\xff"}}',
    "latin1-text": '{"workflowId":"wf","params":"caf\u00e9"}'.encode("latin-1"),
    "utf16": '{"workflowId":"wf"}'.encode("utf-16"),
    "encoded-surrogate": b'{"workflowId":"wf","params":"\xed\xa0\x80"}',
    "overlong-utf8": b'{"workflowId":"wf","params":"\xc0\xaf"}',
    "utf8-bom": b'\xef\xbb\xbf{"workflowId":"wf"}',
}


@pytest.mark.parametrize("body", list(MALFORMED.values()), ids=list(MALFORMED))
@pytest.mark.citus
async def test_malformed_json_is_400_and_nothing_is_written(client, rows, body):
    r = await post_raw(client, body)
    assert_error(r, 400, "MALFORMED_JSON")
    assert await rows() == NOTHING


@pytest.mark.parametrize(
    "headers",
    [{}, {"content-type": "text/plain"}, {"content-type": "application/x-www-form-urlencoded"},
     {"content-type": "multipart/form-data; boundary=x"}, {"content-type": "application/xml"},
     {"content-type": "application/json; charset=latin-1"},
     {"content-type": "application/json; charset=utf-16"}, {"content-type": ""},
     {"content-type": "json"}, {"content-type": "application/jsonp"}],
    ids=["missing", "text", "form", "multipart", "xml", "latin1", "utf16", "empty", "json",
         "jsonp"],
)
@pytest.mark.citus
async def test_wrong_content_type_is_415_and_nothing_is_written(client, rows, headers):
    r = await post_raw(client, json.dumps({"workflowId": "wf", "params": {}}), headers=headers)
    assert_error(r, 415, "UNSUPPORTED_MEDIA_TYPE")
    assert await rows() == NOTHING


def _sized_body(size: int, execution_id: str = "sized") -> bytes:
    """A valid admission body of exactly `size` bytes."""
    head = json.dumps({"workflowId": "wf", "executionId": execution_id, "params": {"pad": ""}})
    pad = size - len(head)
    assert pad >= 0
    return json.dumps(
        {"workflowId": "wf", "executionId": execution_id, "params": {"pad": "x" * pad}}
    ).encode()


async def test_body_at_the_limit_is_accepted(small_client):
    body = _sized_body(1024)
    assert len(body) == 1024
    r = await post_raw(small_client, body)
    assert r.status_code == 201, r.text


async def test_body_over_the_limit_with_content_length_is_413(small_client, rows):
    body = _sized_body(1025)
    r = await post_raw(small_client, body)
    error = assert_error(r, 413, "PAYLOAD_TOO_LARGE")
    assert "1024" in error["message"]
    assert await rows() == NOTHING


async def test_huge_body_with_content_length_is_413(small_client, rows):
    r = await post_raw(small_client, b'{"workflowId":"wf","params":"' + b"x" * 5_000_000 + b'"}')
    assert_error(r, 413, "PAYLOAD_TOO_LARGE")
    assert await rows() == NOTHING


async def test_chunked_body_over_the_limit_is_413_without_reading_it_all(small_client, rows):
    sent = 0

    async def chunks():
        nonlocal sent
        yield b'{"workflowId":"wf","params":"'
        for _ in range(10_000):  # 10 MB if it were all read
            sent += 1
            yield b"x" * 1000
        yield b'"}'

    r = await small_client.post("/v1/executions", content=chunks(), headers=JSON)
    assert "content-length" not in r.request.headers
    assert r.request.headers.get("transfer-encoding") == "chunked"
    assert_error(r, 413, "PAYLOAD_TOO_LARGE")
    assert sent < 10, f"the server read {sent} chunks after the limit had passed"
    assert await rows() == NOTHING


async def test_chunked_body_within_the_limit_is_admitted(small_client):
    async def chunks():
        for piece in (b'{"workflowId":', b'"wf","executionId":"chunked",', b'"params":{"a":1}}'):
            yield piece

    r = await small_client.post("/v1/executions", content=chunks(), headers=JSON)
    assert r.status_code == 201, r.text
    assert (await get_record(small_client, "chunked"))["params"] == {"a": 1}


async def test_invalid_content_length_is_4xx(small_client, rows):
    # httpx always sends its own Content-Length, so drive the ASGI app directly.
    app = small_client.app
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b'{"workflowId":"wf"}', "more_body": False}

    async def send(message):
        sent.append(message)

    for value in (b"-1", b"abc", b"1e3", b"10, 20"):
        sent.clear()
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
            "scheme": "http", "path": "/v1/executions", "raw_path": b"/v1/executions",
            "query_string": b"", "root_path": "", "server": ("test", 80), "client": ("c", 1),
            "headers": [(b"content-type", b"application/json"), (b"content-length", value)],
        }
        await app(scope, receive, send)
        start = next(m for m in sent if m["type"] == "http.response.start")
        assert start["status"] == 400, (value, sent)
    assert await rows() == NOTHING


async def test_null_params_are_stored_as_json_null(client, pool):
    r = await client.post(
        "/v1/executions", json={"workflowId": "wf", "executionId": "np", "params": None}
    )
    assert r.status_code == 201, r.text
    assert (await client.get("/v1/executions/np")).json()["params"] is None
    assert await pool.fetchval("SELECT params = 'null'::jsonb FROM executions")


async def test_store_admits_json_null_params(store, pool):
    result = await store.admissions.admit(workflow_id="wf", params=None, execution_id="null-params")
    assert result.status == "admitted"
    assert await pool.fetchval(
        "SELECT params = 'null'::jsonb FROM executions WHERE execution_id = 'null-params'")
