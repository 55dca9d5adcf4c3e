"""Admission against a workflow registry (tests.http.flows): unknown
workflowId → 404 WORKFLOW_NOT_FOUND; params failing the declared pydantic
model → 422 INVALID_PARAMS with pydantic's error locations under `params`."""

from __future__ import annotations

import pytest

from tests.http.conftest import Rows
from tests.support.responses import assert_error, get_record, post_raw

NOTHING = Rows(0, 0, 0)


async def test_registered_workflow_with_valid_params_is_admitted(registry_client, rows):
    r = await registry_client.post(
        "/v1/executions",
        json={"workflowId": "http-test-charge", "executionId": "c1",
              "params": {"order_id": "o-1", "amount_cents": 250}},
    )
    assert r.status_code == 201, r.text
    # Stored as sent, not as the model dumps it.
    assert (await get_record(registry_client, "c1"))["params"] == {
        "order_id": "o-1", "amount_cents": 250}
    assert await rows() == Rows(1, 1, 0)


async def test_registered_workflow_without_model_takes_any_params(registry_client):
    r = await registry_client.post(
        "/v1/executions", json={"workflowId": "http-test-any", "params": [1, "x", {"y": None}]}
    )
    assert r.status_code == 201, r.text


async def test_unknown_workflow_is_404_and_nothing_is_written(registry_client, rows):
    r = await registry_client.post(
        "/v1/executions", json={"workflowId": "no-such-flow", "executionId": "x", "params": {}}
    )
    error = assert_error(r, 404, "WORKFLOW_NOT_FOUND")
    assert "no-such-flow" in error["message"]
    assert "http-test-charge" in error["message"]  # says what is registered
    assert await rows() == NOTHING


async def test_workflow_lookup_is_exact(registry_client, rows):
    for workflow_id in ["HTTP-TEST-CHARGE", "http-test-charge ", "http-test"]:
        r = await registry_client.post("/v1/executions",
                                       json={"workflowId": workflow_id, "params": {}})
        assert r.status_code in (404, 422), r.text
    assert await rows() == NOTHING


async def test_malformed_workflow_id_is_422_before_the_registry(registry_client, rows):
    r = await registry_client.post("/v1/executions", json={"workflowId": "no such", "params": {}})
    assert_error(r, 422, "INVALID_REQUEST")
    assert await rows() == NOTHING


@pytest.mark.parametrize(
    ("params", "first_loc"),
    [
        ({"order_id": "o-1"}, ["params", "amount_cents"]),
        ({"order_id": "o-1", "amount_cents": 0}, ["params", "amount_cents"]),
        ({"order_id": "o-1", "amount_cents": "lots"}, ["params", "amount_cents"]),
        ({"order_id": "", "amount_cents": 1}, ["params", "order_id"]),
        ({"order_id": "o-1", "amount_cents": 1, "extra": True}, ["params", "extra"]),
        ({}, ["params", "order_id"]),
        ([1, 2], ["params"]),
        ("o-1", ["params"]),
    ],
    ids=["missing", "zero", "wrong-type", "empty-string", "extra-field", "empty", "list",
         "string"],
)
async def test_params_failing_the_model_are_422_invalid_params(registry_client, rows, params,
                                                               first_loc):
    r = await registry_client.post(
        "/v1/executions", json={"workflowId": "http-test-charge", "params": params}
    )
    error = assert_error(r, 422, "INVALID_PARAMS")
    details = error["details"]
    assert details, error
    for problem in details:
        assert problem["loc"][0] == "params", problem
        assert problem["message"], problem
    assert details[0]["loc"] == first_loc, details
    assert ".".join(first_loc) in error["message"]
    assert await rows() == NOTHING


async def test_every_pydantic_error_is_reported(registry_client):
    r = await registry_client.post(
        "/v1/executions", json={"workflowId": "http-test-charge", "params": {"amount_cents": -1}}
    )
    error = assert_error(r, 422, "INVALID_PARAMS")
    assert {tuple(p["loc"]) for p in error["details"]} == {
        ("params", "order_id"), ("params", "amount_cents")}


async def test_unstorable_params_are_invalid_event_even_with_a_registry(registry_client, rows):
    r = await post_raw(
        registry_client,
        '{"workflowId":"http-test-charge","params":{"order_id":"\\u0000","amount_cents":NaN}}',
    )
    assert_error(r, 422, "INVALID_EXECUTION_EVENT")
    assert await rows() == NOTHING


async def test_conflict_with_a_registry(registry_client, rows):
    body = {"workflowId": "http-test-charge", "executionId": "dup",
            "params": {"order_id": "o", "amount_cents": 1}}
    assert (await registry_client.post("/v1/executions", json=body)).status_code == 201
    error = assert_error(await registry_client.post("/v1/executions", json=body), 409,
                         "EXECUTION_ID_CONFLICT")
    assert error["workflowId"] == "http-test-charge"
    assert await rows() == Rows(1, 1, 0)
