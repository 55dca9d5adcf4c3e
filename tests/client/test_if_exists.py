"""Idempotent start (issue 14 item 2): `"ifExists": "return"` answers 200 with
the existing record when the ID holds the same workflow and equal params;
anything else stays 409 EXECUTION_ID_CONFLICT, as does the default."""

from __future__ import annotations

import asyncio

import pytest


def admission(eid: str, **extra) -> dict:
    return {"workflowId": "client-echo", "executionId": eid,
            "params": {"order": 42, "items": [1, 2.5, {"sku": "a"}]}, **extra}


async def test_the_same_admission_again_returns_the_existing_record(server):
    async with server.client() as http:
        first = await http.post("/v1/executions", json=admission("order-42"))
        # Same JSON, other key order and spelling of numbers: equal params.
        again = await http.post("/v1/executions", json={
            "ifExists": "return", "executionId": "order-42", "workflowId": "client-echo",
            "params": {"items": [1.0, 2.5, {"sku": "a"}], "order": 42}})
        record = (await http.get("/v1/executions/order-42")).json()
    assert first.status_code == 201
    assert again.status_code == 200, again.text
    assert again.headers["Location"] == "/v1/executions/order-42"
    body = again.json()
    assert body["executionId"] == "order-42"
    assert body["status"] == record["status"]
    assert body["params"] == record["params"]
    assert body["workflowId"] == "client-echo"


@pytest.mark.parametrize("change", [
    {"params": {"order": 43}},
    {"params": None},
    {"workflowId": "client-boom"},
])
async def test_a_different_workflow_or_params_is_still_a_conflict(server, change):
    async with server.client() as http:
        assert (await http.post("/v1/executions", json=admission("order-7"))).status_code == 201
        clash = await http.post("/v1/executions",
                                json={**admission("order-7", ifExists="return"), **change})
    assert clash.status_code == 409, clash.text
    assert clash.json()["error"]["code"] == "EXECUTION_ID_CONFLICT"
    assert clash.json()["error"]["executionId"] == "order-7"


async def test_the_default_and_error_keep_the_conflict(server):
    async with server.client() as http:
        assert (await http.post("/v1/executions", json=admission("order-8"))).status_code == 201
        default = await http.post("/v1/executions", json=admission("order-8"))
        error = await http.post("/v1/executions", json=admission("order-8", ifExists="error"))
    for answer in (default, error):
        assert answer.status_code == 409
        assert answer.json()["error"]["code"] == "EXECUTION_ID_CONFLICT"


@pytest.mark.parametrize("value", ["always", None, 1, "RETURN"])
async def test_an_unknown_if_exists_is_invalid_request(server, value):
    async with server.client() as http:
        answer = await http.post("/v1/executions", json=admission("order-9", ifExists=value))
    assert answer.status_code == 422
    assert answer.json()["error"]["code"] == "INVALID_REQUEST"
    assert "ifExists" in answer.json()["error"]["message"]


async def test_concurrent_identical_starts_make_one_execution(server, pool):
    async with server.client() as http:
        answers = await asyncio.gather(*(
            http.post("/v1/executions", json=admission("order-race", ifExists="return"))
            for _ in range(20)))
    codes = sorted(a.status_code for a in answers)
    assert codes == [200] * 19 + [201], codes
    assert {a.json()["executionId"] for a in answers} == {"order-race"}
    assert await pool.fetchval(
        "SELECT count(*) FROM executions WHERE execution_id = 'order-race'") == 1
    assert await pool.fetchval(
        "SELECT count(*) FROM execution_events WHERE execution_id = 'order-race' "
        "AND kind = 'admitted'") == 1


async def test_a_retired_id_stays_a_conflict(server, store, pool):
    async with server.client() as http:
        assert (await http.post("/v1/executions", json=admission("order-old"))).status_code == 201
        await store.operator.request_cancel("order-old", "test")
        await pool.execute("UPDATE executions SET updated_at = now() - interval '1 day' "
                           "WHERE execution_id = 'order-old'")
        assert await store.history.prune_terminal(older_than_seconds=60, limit=10) == 1
        again = await http.post("/v1/executions", json=admission("order-old", ifExists="return"))
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "EXECUTION_ID_CONFLICT"
    assert again.json()["error"]["status"] == "retired"


async def test_another_tenants_execution_is_not_returned(make_server, client_settings, store,
                                                         flows):
    """A trigger token sees only its own executions: the same admission by
    another tenant is 409 "already taken", naming nothing of the other's."""
    from app.api.auth import new_token
    from app.client import AsyncClient, ExecutionIdConflict

    secrets = {}
    for name in ("tenant-a", "tenant-b"):
        token_id, token, digest = new_token()
        await store.tokens.create_token(token_id, name=name, role="trigger", secret_sha256=digest)
        secrets[name] = token
    srv = await make_server(client_settings.model_copy(update={"auth": "enabled"}), flows)
    async with (AsyncClient(srv.base, token=secrets["tenant-a"]) as a,
                AsyncClient(srv.base, token=secrets["tenant-b"]) as b):
        assert (await a.start("client-echo", {"n": 1}, execution_id="shared",
                              if_exists="return")).created
        assert not (await a.start("client-echo", {"n": 1}, execution_id="shared",
                                  if_exists="return")).created
        with pytest.raises(ExecutionIdConflict) as taken:
            await b.start("client-echo", {"n": 1}, execution_id="shared", if_exists="return")
    assert "already taken" in taken.value.message
    assert "status" not in taken.value.details and "workflowId" not in taken.value.details


async def test_the_returned_record_is_the_one_get_answers(server):
    async with server.client() as http:
        await http.post("/v1/executions", json=admission("order-same"))
        again = await http.post("/v1/executions", json=admission("order-same", ifExists="return"))
        read = await http.get("/v1/executions/order-same")
    assert again.status_code == 200
    returned, current = again.json(), read.json()
    for moving in ("updatedAt", "dueAt", "blockedBy", "status", "lease", "token"):
        returned.pop(moving), current.pop(moving)
    assert returned == current
