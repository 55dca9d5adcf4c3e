"""The admission's answers, byte for byte: the 201 body and its headers (names,
order, values), as the route answered before its hot path was made lighter;
and the order of refusals (authentication, then role, then quota, then the
body), each in the one error shape."""

from __future__ import annotations

import json

import pytest

from app.api.auth import new_token
from app.store import ExecutionStore
from tests.http.conftest import api_settings

ADMIT_HEADERS = ["content-length", "content-type", "location", "x-request-id"]


async def test_the_201_answer_byte_for_byte(client) -> None:
    r = await client.post("/v1/executions", content=b'{"workflowId":"wf","executionId":"ans-1",'
                          b'"params":{"n":1}}', headers={"content-type": "application/json",
                                                          "x-request-id": "req-1"})
    assert r.status_code == 201, r.text
    assert r.content == b'{"executionId":"ans-1","status":"admitted"}'
    assert [k for k, _ in r.headers.raw] == [k.encode() for k in ADMIT_HEADERS]
    assert r.headers.raw == [
        (b"content-length", str(len(r.content)).encode()),
        (b"content-type", b"application/json"),
        (b"location", b"/v1/executions/ans-1"),
        (b"x-request-id", b"req-1"),
    ]


async def test_a_generated_id_answers_in_the_same_shape(client) -> None:
    r = await client.post("/v1/executions", json={"workflowId": "wf"})
    assert r.status_code == 201, r.text
    body = json.loads(r.content)
    assert list(body) == ["executionId", "status"] and body["status"] == "admitted"
    assert r.content == json.dumps(body, separators=(",", ":")).encode()
    assert [k for k, _ in r.headers.raw] == [k.encode() for k in ADMIT_HEADERS]
    assert r.headers["location"] == f"/v1/executions/{body['executionId']}"


async def test_if_exists_return_answers_200_with_the_record(client) -> None:
    body = {"workflowId": "wf", "executionId": "ans-2", "params": {"a": [1, 2]},
            "ifExists": "return"}
    first = await client.post("/v1/executions", json=body)
    assert first.status_code == 201, first.text
    again = await client.post("/v1/executions", json=body)
    assert again.status_code == 200, again.text
    read = await client.get("/v1/executions/ans-2")
    assert again.content == read.content
    assert again.headers["location"] == "/v1/executions/ans-2"
    conflict = await client.post("/v1/executions", json={**body, "ifExists": "error"})
    assert conflict.status_code == 409
    assert conflict.json()["error"]["code"] == "EXECUTION_ID_CONFLICT"


@pytest.fixture
async def auth_client(make_client, settings):
    return await make_client(api_settings(settings, auth="enabled"))


async def _token(pool, role: str, admissions_per_minute: int | None = None) -> str:
    token_id, token, digest = new_token()
    await ExecutionStore(pool).tokens.create_token(
        token_id, name=f"ans-{role}-{token_id}", role=role, secret_sha256=digest,
        admissions_per_minute=admissions_per_minute)
    return token


async def test_refusals_come_in_order_auth_role_quota_body(auth_client, pool) -> None:
    bad_body = {"content": b"not json", "headers": {"content-type": "application/json"}}
    r = await auth_client.post("/v1/executions", **bad_body)
    assert r.status_code == 401 and r.json()["error"]["code"] == "UNAUTHENTICATED"
    assert r.headers["www-authenticate"] == "Bearer"
    reader = await _token(pool, "read")
    r = await auth_client.post("/v1/executions", content=b"not json", headers={
        "content-type": "application/json", "authorization": f"Bearer {reader}"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "FORBIDDEN"
    limited = await _token(pool, "trigger", admissions_per_minute=1)
    headers = {"authorization": f"Bearer {limited}"}
    ok = await auth_client.post("/v1/executions", json={"workflowId": "wf"}, headers=headers)
    assert ok.status_code == 201, ok.text
    r = await auth_client.post("/v1/executions", content=b"not json", headers={
        "content-type": "application/json", **headers})
    assert r.status_code == 429 and r.json()["error"]["code"] == "RATE_LIMITED"
    assert int(r.headers["retry-after"]) >= 1
    trigger = await _token(pool, "trigger")
    r = await auth_client.post("/v1/executions", content=b"not json", headers={
        "content-type": "application/json", "authorization": f"Bearer {trigger}"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "MALFORMED_JSON"
    r = await auth_client.post("/v1/executions", json={"workflowId": "wf", "executionId": "ans-3"},
                               headers={"authorization": f"Bearer {trigger}"})
    assert r.status_code == 201, r.text
    assert r.content == b'{"executionId":"ans-3","status":"admitted"}'
