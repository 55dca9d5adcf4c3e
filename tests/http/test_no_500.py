"""No request produces a 500: a sweep of odd inputs against every route of
the real app (unhandled exceptions become the 500 a server would send, and
every such answer is collected and reported at once)."""

from __future__ import annotations

import base64
import json

import pytest

from app.registry import load_workflows
from tests.http.conftest import api_settings
from tests.http.test_admission import BAD_FIELDS, MALFORMED, UNSTORABLE

ODD_BODIES: list[bytes] = [
    *(b.encode("utf-8", "surrogatepass") for b in UNSTORABLE.values()),
    *(b.encode() for b in BAD_FIELDS.values()),
    *MALFORMED.values(),
    b'{"workflowId":"wf","params":' + b"9" * 999 + b"}",
    b'{"workflowId":"wf","params":-' + b"9" * 1001 + b"}",
    b'{"workflowId":"wf","params":1e-400}',
    b'{"workflowId":"wf","params":-0.0}',
    b'{"workflowId":"wf","params":1.7976931348623157e308}',
    b'{"workflowId":"wf","params":"\\uffff\\ufffe\\u2028\\ud83d\\ude00"}',
    b'{"workflowId":"wf","params":{"a":"\\ud83d\\ude00"}}',
    b'{"workflowId":"wf","params":null}',
    b'{"workflowId":"wf","executionId":null,"context":{}}',
    b'{"workflowId":"wf","params":' + b"[" * 1000 + b"]" * 1000 + b"}",
    b'{"workflowId":"wf","params":' + b'{"a":' * 3000 + b"0" + b"}" * 3000 + b"}",
    b'{"workflowId":"wf","params":[' + b"0," * 20_000 + b"0]}",
    b'{"workflowId":"wf","params":{' + b",".join(b'"k%d":0' % i for i in range(5000)) + b"}}",
    b'{"workflowId":"wf","deadline":"2030-01-01T00:00:00Z"}',
    b'{"at":"2030-01-01T00:00:00Z"}',
    b'{"at":"2030-01-01T00:00:00+14:00"}',
    b'{"at":"1900-01-01T00:00:00Z"}',
    b'{"at":"0001-01-01T00:00:00Z"}',
    b'{"at":"9999-12-31T23:59:59Z"}',
    b'{"at":"9999-12-31T23:59:59-05:00"}',
    b'{"at":"0001-01-01T00:00:00+05:00"}',
    b'{"at":-62135596800}',
    b'{"at":253402300799}',
    b'{"at":true}',
    b'{"at":"2030-01-01T00:00:00.123456789Z"}',
    b'{"at":"P1D"}',
    b"{}",
    b"null",
    b"0",
    b'""',
    b"\x00",
    b"\xef\xbf\xbf",
    b"{" * 200_000,
    b"[" * 200_000,
    b'"' + b"\\" * 10_001 + b'"',
]

CONTENT_TYPES = [
    "application/json",
    "application/json; charset=",
    "application/json;;;",
    "application/json; charset=utf-8; charset=latin-1",
    'application/json; charset="',
    "application/problem+json",
    "APPLICATION/JSON",
    " application/json ",
    "text/plain",
    "*/*",
]

ODD_IDS = [
    "e1", "ghost", "a%00b", "%00", "%FF", "%ED%A0%80", "%F0%9F%98%80", "x" * 5000, "a%20b",
    "%25", "..", ".", "%2E%2E", "a%0Ab", "a%09b", "'; DROP TABLE executions; --", "%5C",
    "%C0%AF", "null", "-1", "e1%3F", "e1%23",
]

ODD_NAMES = ["go", "a%00b", "%FF", "x" * 300, "a%20b", "..", "%ED%A0%80"]


def _cursor(obj) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")


ODD_QUERIES = [
    "", "status=admitted&status=running", "limit=1&limit=2", "limit=%00", "limit=9" * 50,
    "limit=-0", "limit=+5", "limit=0x10", "limit=%E2%98%83", "status=%FF",
    "workflowId=%00", "workflowId=%ED%A0%80", "workflowId=" + "w" * 10_000,
    "minUnacknowledgedDeliveries=1e3", "minUnacknowledgedDeliveries=" + "9" * 40,
    "cursor=%00", "cursor=" + "A" * 999, "cursor=" + _cursor(["2024-01-01T00:00:00Z", "x"]),
    "cursor=" + _cursor(["2024-01-01T00:00:00+00:00", {"a": 1}]),
    "cursor=" + _cursor(["2024-01-01T00:00:00+00:00", "x" * 10_000]),
    "cursor=" + _cursor(["9999-12-31T23:59:59+00:00", "x"]),
    "cursor=" + _cursor(["0001-01-01T00:00:00+00:00", "x"]),
    "cursor=" + _cursor(["9999-12-31T23:59:59.999999-14:00", "x"]),
    "cursor=" + _cursor(["2024-01-01T00:00:00+00:00", "x\u0000"]),
    "cursor=" + _cursor(["2024-01-01T00:00:00+00:00", "\udfff"]),
    "cursor=" + _cursor(["2024-01-01T00:00:00+00:00", "x", "extra"]),
    "cursor=" + _cursor([None, None]),
    "cursor=" + base64.urlsafe_b64encode(b"\xff\xfe").decode(),
    "unknown=1", "%00=%00", "a=" + "%FF" * 1000, "&&&", "=",
]


async def _sweep(client, requests) -> list[str]:
    failures = []
    for method, path, kwargs in requests:
        r = await client.request(method, path, **kwargs)
        if r.status_code >= 500:
            shown = {k: (v[:80] if isinstance(v, bytes | str) else v) for k, v in kwargs.items()}
            failures.append(f"{r.status_code} {method} {path[:100]} {shown}: {r.text[:200]}")
        elif r.status_code >= 400 and method != "HEAD":
            body = r.json()
            assert body["error"]["code"] and body["error"]["message"], (method, path, body)
    return failures


def _body_requests(path: str) -> list:
    out = []
    for body in ODD_BODIES:
        out.append(("POST", path, {"content": body, "headers": {"content-type": "application/json"}}))
    for content_type in CONTENT_TYPES:
        out.append(("POST", path, {"content": b'{"workflowId":"wf","params":{}}',
                                   "headers": {"content-type": content_type}}))
    out.append(("POST", path, {}))
    out.append(("POST", path, {"content": b"{}"}))
    return out


@pytest.fixture
async def sweep_client(settings, make_client):
    client = await make_client(api_settings(settings, max_payload_bytes=65536),
                               raise_app_exceptions=False)
    for execution_id in ("e1", "e2"):
        r = await client.post("/v1/executions", json={"workflowId": "wf", "executionId": execution_id})
        assert r.status_code == 201
    return client


async def test_no_500_on_admission(sweep_client):
    assert await _sweep(sweep_client, _body_requests("/v1/executions")) == []


async def test_no_500_on_wakes(sweep_client, store):
    requests = _body_requests("/v1/executions/e1/wakes")
    requests += [("POST", f"/v1/executions/{i}/wakes", {}) for i in ODD_IDS]
    assert await _sweep(sweep_client, requests) == []
    # And on a terminal execution.
    for d in await store.leases.claim_due(10, 30, "w"):
        await store.leases.acknowledge(d.lease, "completed", result=None)
    assert await _sweep(sweep_client, requests) == []


async def test_no_500_on_signals(sweep_client):
    requests = _body_requests("/v1/executions/e1/signals/go")
    requests += [("POST", f"/v1/executions/{i}/signals/{n}", {}) for i in ODD_IDS for n in ODD_NAMES]
    assert await _sweep(sweep_client, requests) == []


async def test_no_500_on_reads(sweep_client):
    requests = [("GET", f"/v1/executions/{i}", {}) for i in ODD_IDS]
    requests += [("GET", f"/v1/executions?{q}", {}) for q in ODD_QUERIES]
    requests += [("GET", p, {}) for p in ("/healthz", "/readyz", "/openapi.json", "/docs")]
    requests += [(m, "/v1/executions/e1", {}) for m in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS")]
    requests += [("HEAD", "/v1/executions/e1", {}), ("HEAD", "/v1/executions", {})]
    assert await _sweep(sweep_client, requests) == []


async def test_no_500_on_admission_with_a_registry(settings, make_client):
    client = await make_client(api_settings(settings), load_workflows(["tests.http.flows"]),
                               raise_app_exceptions=False)
    requests = _body_requests("/v1/executions")
    for params in [None, 1, "x", [], {}, {"order_id": None}, {"order_id": "o", "amount_cents": 1e300},
                   {"order_id": "o", "amount_cents": 10**400}, {"order_id": ["x"] * 1000}]:
        for workflow_id in ("http-test-charge", "http-test-any", "nope"):
            requests.append(("POST", "/v1/executions",
                             {"json": {"workflowId": workflow_id, "params": params}}))
    assert await _sweep(client, requests) == []
