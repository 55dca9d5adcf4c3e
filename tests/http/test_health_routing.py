"""Liveness, readiness, and the error shape on routing errors."""

from __future__ import annotations

import pytest

from app.migrate import head_revision
from tests.support.responses import assert_error


async def test_healthz(client):
    r = await client.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


async def test_readyz_names_the_schema_revision(client):
    r = await client.get("/readyz")
    assert r.status_code == 200, r.text
    assert r.json() == {"status": "ready", "schemaRevision": head_revision()}


async def test_readyz_is_503_when_the_schema_is_behind(client, pool):
    await pool.execute("UPDATE alembic_version SET version_num = 'older'")
    error = assert_error(await client.get("/readyz"), 503, "SCHEMA_OUT_OF_DATE")
    assert "fencepost migrate" in error["message"]


@pytest.mark.parametrize(
    "path", ["/", "/nope", "/v1", "/v2/executions", "/v1/executions/e1/nope", "/healthz/x",
             "/v1/executions/e1/signals", "/v1/executions/e1/signals/"],
)
async def test_unknown_route_is_404_with_the_error_shape(client, path):
    assert_error(await client.get(path), 404, "NOT_FOUND")


@pytest.mark.parametrize(
    ("method", "path"),
    [("DELETE", "/v1/executions"), ("PUT", "/v1/executions/e1"), ("POST", "/healthz"),
     ("GET", "/v1/executions/e1/wakes"), ("PATCH", "/v1/executions/e1/signals/go"),
     ("DELETE", "/readyz")],
)
async def test_wrong_method_is_405_with_the_error_shape(client, method, path):
    r = await client.request(method, path)
    assert_error(r, 405, "METHOD_NOT_ALLOWED")
    assert r.headers.get("allow"), r.headers


async def test_openapi_document_is_served(client):
    r = await client.get("/openapi.json")
    assert r.status_code == 200
    paths = r.json()["paths"]
    assert {"/v1/executions", "/v1/executions/{execution_id}",
            "/v1/executions/{execution_id}/wakes"} <= set(paths)
