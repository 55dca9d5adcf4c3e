"""The API's front layer (metrics, request IDs, request guard in one ASGI
layer): a refusal by the guard is counted under route "(unmatched)" and
carries X-Request-ID like any answer; generated request IDs are version-4
UUIDs in hex; a caller's acceptable ID is kept (the last one sent), an
unacceptable one replaced."""

from __future__ import annotations

import uuid

from app.api.request_ids import new_request_id, request_id_of
from app.metrics import METRICS
from tests.http.conftest import api_settings


def _count(route: str, method: str, status: str) -> float:
    value = METRICS.registry.get_sample_value(
        "fencepost_http_requests_total", {"route": route, "method": method, "status": status})
    return value or 0.0


def test_generated_ids_are_uuid4_hex() -> None:
    ids = {new_request_id() for _ in range(2000)}
    assert len(ids) == 2000
    for value in ids:
        parsed = uuid.UUID(hex=value)
        assert parsed.hex == value and parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


def test_the_callers_id_is_kept_when_acceptable() -> None:
    def scope(*values: bytes) -> dict:
        return {"headers": [(b"host", b"x")] + [(b"x-request-id", v) for v in values]}

    assert request_id_of(scope(b"req-1")) == "req-1"
    assert request_id_of(scope(b"first", b"last:2")) == "last:2"
    for refused in (b"", b"has space", b"x" * 129, b"caf\xc3\xa9"):
        made = request_id_of(scope(refused))
        assert uuid.UUID(hex=made).version == 4, refused
    assert uuid.UUID(hex=request_id_of({"headers": []})).version == 4


async def test_a_guard_refusal_is_counted_and_carries_the_request_id(make_client,
                                                                    settings) -> None:
    client = await make_client(api_settings(settings, allowed_hosts="api.example"))
    before = _count("(unmatched)", "GET", "421")
    r = await client.get("/healthz", headers={"x-request-id": "guard-1"})
    assert r.status_code == 421 and r.json()["error"]["code"] == "HOST_NOT_ALLOWED"
    assert r.headers["x-request-id"] == "guard-1"
    assert _count("(unmatched)", "GET", "421") == before + 1
    big = await client.get("/healthz", headers={"x-filler": "x" * 70_000})
    assert big.status_code == 431
    assert uuid.UUID(hex=big.headers["x-request-id"]).version == 4


async def test_answers_are_counted_by_route_template(client) -> None:
    before = _count("/v1/executions", "POST", "201")
    for i in range(3):
        r = await client.post("/v1/executions", json={"workflowId": "wf", "executionId": f"f-{i}"})
        assert r.status_code == 201, r.text
    assert _count("/v1/executions", "POST", "201") == before + 3
    missing = _count("/v1/executions/{execution_id}", "GET", "404")
    assert (await client.get("/v1/executions/nope")).status_code == 404
    assert _count("/v1/executions/{execution_id}", "GET", "404") == missing + 1
